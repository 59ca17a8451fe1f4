//! The lease-driven stream worker (seed 000): each logical stream is owned through
//! a lease, consumed from the upstream from its checkpoint, written to a fenced
//! sink, and handed over on crash (expiry) or deploy (drain) without gaps.
//!
//! - [`runner`]: one held stream, from subscribe to release.
//! - [`worker`]: discovery, fair share, hand-back, expiry probes, drain.
//! - [`settings`]: the worker's configuration from the environment.

pub mod runner;
pub mod settings;
pub mod worker;

pub use runner::{RunnerConfig, RunnerContext, StreamExit, run_stream};
pub use worker::{DrainReport, StreamWorker, StreamWorkerConfig};
