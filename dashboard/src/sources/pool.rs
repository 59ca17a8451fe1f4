//! The warm pool and the sweeper's report, through the pool's one read model
//! (`leasehold_pool::read`).

use std::sync::Arc;
use std::time::Duration;

use leasehold_pool::read::{AnomalyView, PoolReader, PoolView};

use crate::sources::timed;

/// Reads the pool and the anomalies within `deadline`; `None` without a
/// pool source (a dashboard without Redis).
pub(crate) async fn read(
    reader: Option<&Arc<dyn PoolReader>>,
    deadline: Duration,
) -> Option<Result<(PoolView, AnomalyView), String>> {
    let reader = reader?;
    Some(
        timed(deadline, async {
            let pool = reader.pool().await.map_err(|e| e.to_string())?;
            let anomalies = reader.anomalies().await.map_err(|e| e.to_string())?;
            Ok((pool, anomalies))
        })
        .await,
    )
}
