//! The snapshot and its history: pure data and pure functions over it (no
//! locks, no I/O), so what a refresh makes of its readings can be tested
//! without a clock, a network or a task.

pub mod changes;
pub mod gaps;
pub mod streams;
pub mod timeline;
pub mod trends;
