//! The lease-driven stream worker and the per-user broker worker.
//!
//! Built so far: [`upstream`], the upstream adapter (a trait plus a generic
//! WebSocket JSON implementation), and [`feed`], the feed simulator used by tests,
//! benchmarks and `leasehold dev`. The stream worker itself (fenced sinks,
//! checkpoints, drain) and the broker worker pool are tracked by their own issues.

pub mod feed;
pub mod upstream;
