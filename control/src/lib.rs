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
//! - [`store`]: the [`LeaseReader`] (read-only) and [`LeaseStore`] traits, the
//!   error enum, and the two backends
//!   ([`store::memory`] for `dev` and fast tests, [`store::dynamodb`] for production);
//!   [`store::intercept`] wraps any store to fail, hold or count its calls.
//! - [`keeper`]: [`LeaseKeeper`], which holds leases, renews them on schedule and
//!   tells the data path, before the holder's deadline, when a lease can no longer
//!   be trusted; in session mode it renews one session record instead, and every
//!   stream it holds lives by it.
//! - [`listing`]: leases as the operator CLI prints them (table, details, JSON).
//! - [`mode`]: the table's declared lease mode (`per-stream` or `session`), so
//!   workers of the two never share a table.
//! - [`read`]: the one read model of the table ([`read::LeaseTable`]): streams,
//!   presence, reserved and malformed records, and who may acquire (through
//!   [`protocol::acquirable`]), for the census, the observer and the dashboard.
//! - [`pacing`]: how often a reader may scan the whole table ([`pacing::ScanPacing`]).
//! - [`protocol`]: the protocol's decisions, free of I/O, shared by the runtime
//!   and the model checker.
//! - [`clock`]: wall-clock time (unix ms) as an injectable dependency (from `platform`).
//! - [`settings`]: the lease variables (table, timings, identity).

/// Wall-clock time lives in `platform` (the pool and the feed read it too);
/// re-exported here because every lease computation takes a [`Clock`].
pub use leasehold_platform::clock;
pub mod keeper;
pub mod lease;
pub mod listing;
pub mod mode;
pub mod pacing;
pub mod protocol;
pub mod read;
pub mod schema;
pub mod settings;
pub mod store;

pub use clock::{Clock, SystemClock};
pub use keeper::{HeldLease, KeeperConfig, LeaseKeeper};
pub use lease::{Lease, LeaseState};
pub use store::{LeaseError, LeaseReader, LeaseStore};
