//! Where the readings come from: timed reads of the lease table, the pool,
//! the sidecars and (for the per-stream page) the sink. Each read has a
//! deadline, so one source that hangs cannot hold back the others; nothing
//! here keeps history or takes a lock a page waits on.

pub mod leases;
pub mod pool;
pub mod sidecars;
pub mod sink;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_control::read::LeaseTable;
use leasehold_control::store::LeaseReader;
use leasehold_pool::read::{AnomalyView, PoolReader, PoolView};

use crate::sources::sidecars::{DiscoveryPolicy, SidecarReport, SidecarTarget};

/// Where the collector reads from.
pub struct Sources {
    /// The lease table.
    pub leases: Arc<dyn LeaseReader>,
    /// The pool's key space, if the dashboard is given one.
    pub pool: Option<Arc<dyn PoolReader>>,
    /// `DASHBOARD_SIDECARS`: when not empty, exactly these sidecars are polled
    /// and none are discovered.
    pub sidecars: Vec<SidecarTarget>,
    /// Which discovered `sidecar_url` values may be polled.
    pub discovery: DiscoveryPolicy,
}

/// The lease table's name in source health.
pub(crate) const LEASE_SOURCE: &str = "lease table";
/// The pool's name in source health.
pub(crate) const POOL_SOURCE: &str = "pool";
/// The sidecars' name in source health.
pub(crate) const SIDECAR_SOURCE: &str = "sidecars";

/// What one refresh read: the model's input ([`crate::model::Model::apply`]).
/// Failures are text without secrets, shown as the source's error.
pub(crate) struct Readings {
    /// When the lease table and the pool had been read, unix ms.
    pub(crate) now_ms: i64,
    /// The lease table, classified.
    pub(crate) leases: Result<LeaseTable, String>,
    /// The pool and the sweeper's report; `None` without a pool source.
    pub(crate) pool: Option<Result<(PoolView, AnomalyView), String>>,
    /// The sidecar poll.
    pub(crate) sidecars: SidecarReadings,
}

/// What one sidecar poll brought back.
#[derive(Default)]
pub(crate) struct SidecarReadings {
    /// One report per sidecar asked, sorted by URL.
    pub(crate) reports: Vec<SidecarReport>,
    /// `/status` bytes read, all sidecars together.
    pub(crate) bytes_read: usize,
    /// Why discovered `sidecar_url` values were refused, counted by reason.
    pub(crate) refused: Option<String>,
    /// `DASHBOARD_SIDECARS` named the sidecars (none were discovered).
    pub(crate) overridden: bool,
    /// When the poll ended, unix ms (the sidecars' ages count to it).
    pub(crate) polled_ms: i64,
}

/// Runs `read` with `deadline`; running out of time is a failure like any other.
pub(crate) async fn timed<T>(
    deadline: Duration,
    read: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(deadline, read).await {
        Ok(read) => read,
        Err(_) => Err(format!("no answer within {} s", deadline.as_secs())),
    }
}
