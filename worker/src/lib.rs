//! The lease-driven stream worker and the per-user broker worker.
//!
//! Not built yet: the stream worker (WebSocket upstream, fenced sinks,
//! checkpoints, drain) and the broker worker pool are tracked by their own
//! issues. The crate exists so the workspace has its final shape.
