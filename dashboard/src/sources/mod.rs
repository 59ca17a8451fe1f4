//! Where the readings come from: timed reads of the lease table, the pool,
//! the sidecars and (for the per-stream page) the sink. Nothing here keeps
//! history or takes a lock the pages wait on.

pub mod sidecars;
pub mod sink;
