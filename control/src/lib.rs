//! The control-plane model shared by every leasehold component.
//!
//! Everything in leasehold rests on one question being answered right: who owns a
//! stream, with which fence token, until when. This crate answers it and nothing
//! else; the worker, sidecar, dashboard and CLI build on it.
//!
//! Module map:
//! - [`schema`]: the lease table's attribute names and the one decoder from a raw
//!   item to a [`Lease`]; the only place that knows how a record is spelled.
//! - [`lease`]: the typed [`Lease`] record and its derived state.
//! - [`store`]: the [`LeaseStore`] trait, its error enum, and the two backends
//!   ([`store::memory`] for `dev` and fast tests, [`store::dynamodb`] for production).
//! - [`keeper`]: [`LeaseKeeper`], which holds leases, renews them on schedule and
//!   tells the data path, before the holder's deadline, when a lease can no longer
//!   be trusted.
//! - [`keys`]: Redis key names (sink layout, pool protocol), spelled once.
//! - [`backoff`]: exponential backoff with full jitter, for every retry loop.
//! - [`clock`]: wall-clock time (unix ms) as an injectable dependency.
//! - [`telemetry`]: typed events that components emit; the sidecar turns them into
//!   metrics.
//! - [`transport`]: the worker → sidecar wire format and the non-blocking
//!   buffered shipper workers emit through.
//! - [`ecs`]: ECS task metadata (endpoint v4) when running on ECS.
//! - [`config`]: every environment variable with its default, parsed all at once.
//! - `conformance` / `testing` (feature `testing`): the store conformance suite and
//!   the helpers test crates use to reach the real servers started by the test command.

pub mod backoff;
pub mod clock;
pub mod config;
pub mod ecs;
pub mod keeper;
pub mod keys;
pub mod lease;
pub mod schema;
pub mod store;
pub mod telemetry;
pub mod transport;

#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "testing")]
pub mod measure;
#[cfg(feature = "testing")]
pub mod testing;

pub use clock::{Clock, SystemClock};
pub use keeper::{HeldLease, KeeperConfig, LeaseKeeper};
pub use lease::{Lease, LeaseState};
pub use store::{LeaseError, LeaseStore};
