//! The lease-driven stream worker and the per-user broker worker.
//!
//! Module map:
//! - [`feed`]: the upstream feed simulator (sequenced events, replay, retention),
//!   used by tests, benchmarks and `leasehold dev`.
//! - [`upstream`]: "connect to stream X from sequence N": a trait plus a generic
//!   WebSocket JSON adapter (URL and subscribe templates, JSON pointers).
//! - [`sink`]: fenced sinks (Redis Streams, in-memory) behind one trait.
//! - [`stream`]: the stream worker: runners per held stream, discovery, fair
//!   share, hand-back, drain.
//! - [`broker`]: the per-user broker worker pool: protocol, credentials, paper
//!   broker, connection cache, worker lifecycle, launchers, pool manager, sweep.

pub mod feed;
pub mod sink;
pub mod stream;
pub mod upstream;
// --- broker pool ---
pub mod broker;
