//! The per-user broker worker pool (seed 002, design §3.2).
//!
//! Module map:
//! - [`bus`]: the [`bus::PoolBus`] seam over the pool's shared state: Redis in
//!   production, in memory for one-process runs; one conformance suite.
//! - [`protocol`]: every message body (claim, request, response, control,
//!   liveness mark, dead letter), parsed strictly with errors that name fields,
//!   never values.
//! - [`credentials`]: the [`credentials::CredentialsCipher`] seam and the
//!   AES-256-GCM blob format; decrypted secrets are zeroized and redacted.
//! - [`paper`]: the [`paper::Broker`] seam and the paper broker (simulated fills,
//!   latency and failure injection).
//! - [`connections`]: broker connections cached per account: lazy open,
//!   invalidate on error, idle health check, bounded connect retries.
//! - [`worker`]: one worker's lifecycle: pool → exclusive claim → heartbeats,
//!   requests and control messages → clean exit.
//! - [`launcher`]: the [`launcher::TaskLauncher`] seam with local processes and ECS.
//! - [`pool`]: the pool manager's reconcile pass and the claim path.
//! - [`maintenance`]: the orphan / stale / duplicate sweep.
//! - [`settings`]: the variables of `leasehold_control::config` parsed for these.

pub mod bus;
pub mod connections;
pub mod credentials;
pub mod launcher;
pub mod maintenance;
pub mod paper;
pub mod pool;
pub mod protocol;
pub mod settings;
pub mod worker;
