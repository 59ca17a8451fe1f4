//! The table's lease mode, declared once in the reserved `leasehold#mode`
//! record and compared by every stream worker at start.
//!
//! The two modes must never share a table: a per-stream worker judges a
//! stream by the stream record's own `lease_expires_at`, which a session
//! holder never renews, so it would take a stream whose session is alive and
//! two workers would write it. A worker of the other mode refuses to start.

use crate::settings::LeaseMode;
use crate::store::{LeaseError, LeaseStore};

/// Why a worker may not use the table in its mode.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// The table is declared in the other mode.
    #[error(
        "the lease table is declared `{declared}` (record leasehold#mode) but this worker runs LEASE_MODE={configured}; \
         run every worker of a table in one mode (docs/lease-table.md#session-mode)"
    )]
    Mismatch {
        /// The table's mode as declared.
        declared: String,
        /// This worker's `LEASE_MODE`.
        configured: &'static str,
    },
    /// The mode record could not be read or written.
    #[error("cannot read the lease table's mode: {0}")]
    Store(#[from] LeaseError),
}

/// Declares `mode` for the table if it has none yet, and refuses when it is
/// declared in the other one.
pub async fn declare(
    store: &dyn LeaseStore,
    mode: LeaseMode,
    now_ms: i64,
) -> Result<(), ModeError> {
    let declared = store.declare_mode(mode.as_str(), now_ms).await?;
    if declared == mode.as_str() {
        Ok(())
    } else {
        Err(ModeError::Mismatch {
            declared,
            configured: mode.as_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryLeaseStore;

    #[tokio::test]
    async fn the_first_worker_decides_and_the_other_mode_is_refused() {
        let store = MemoryLeaseStore::new();
        declare(&store, LeaseMode::Session, 1).await.unwrap();
        declare(&store, LeaseMode::Session, 2).await.unwrap();
        let err = declare(&store, LeaseMode::PerStream, 3).await.unwrap_err();
        assert!(matches!(err, ModeError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("declared `session`"), "{err}");
    }
}
