//! The per-user broker worker and the processes around it.
//!
//! A broker worker starts in the warm pool, is claimed exclusively for one user,
//! serves that user's requests through its broker sessions, heartbeats, and
//! exits cleanly. Everything it shares with the API and the other workers goes
//! through the pool bus (`leasehold_pool`).
//!
//! Module map:
//! - [`credentials`]: the [`credentials::CredentialsCipher`] seam and the
//!   AES-256-GCM blob format; decrypted secrets are zeroized and redacted.
//! - [`sealing`]: the worker's X25519 key and credentials sealed to it.
//! - [`sealer`]: the credential sealer, the one component that decrypts
//!   blobs, and the worker's client of it.
//! - [`paper`]: the [`paper::Broker`] seam and the paper broker (simulated fills,
//!   latency and failure injection).
//! - [`connections`]: broker connections cached per account: lazy open,
//!   invalidate on error, idle health check, bounded connect retries.
//! - [`worker`]: one worker's lifecycle: pool → exclusive claim → heartbeats,
//!   requests and control messages → clean exit; its children are the claim
//!   step, the claimed loop (`serve`) and the idle schedule.
//! - [`launcher`]: the [`launcher::TaskLauncher`] seam with local processes and ECS.
//! - [`manager`]: the pool manager's reconcile pass and the claim path.
//! - [`maintenance`]: the orphan / stale / duplicate sweep.
//! - [`rotation`]: `credentials rotate`, every stored blob moved to the
//!   configured KMS key by compare-and-set, with a reload for active workers.
//! - [`supervise`]: users whose worker died with work pending get a new one.
//! - [`settings`]: the variables of every broker-pool process.

pub mod connections;
pub mod credentials;
pub mod launcher;
pub mod maintenance;
pub mod manager;
pub mod paper;
pub mod rotation;
pub mod sealer;
pub mod sealing;
pub mod settings;
pub mod supervise;
pub mod worker;
