//! The lease-driven stream worker and the per-user broker worker.
//!
//! Module map:
//! - [`sink`]: fenced sinks (Redis Streams, in-memory) behind one trait.
//!
//! Being built: the feed simulator, the upstream adapter and the stream worker
//! itself; the broker worker pool follows in its own issue.

pub mod sink;
