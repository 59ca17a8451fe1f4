//! The warm pool view (idle workers, claimed users) and `/api/pool`.

use serde::Serialize;

use crate::model::Snapshot;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage};
use crate::web::views::SnapshotView;
use leasehold_pool::read::{ClaimedUser, IdleWorker, PoolView};

/// The warm pool view: its page and `/api/pool` read the latest snapshot alone.
pub(crate) struct Pool;

impl SnapshotView for Pool {
    const PATH: &'static str = "/pool";
    type Fields<'a> = PoolFields<'a>;

    fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
        let empty = PoolView::default();
        let pool = snapshot.pool.as_ref().unwrap_or(&empty);
        let summary = match &snapshot.pool {
            None => vec![snapshot.no_pool_data()],
            Some(pool) => {
                let mut summary = vec![format!(
                    "{} idle, {} claimed, {} claims pending, {} invalid claims dead-lettered.",
                    pool.idle.len(),
                    pool.claimed.len(),
                    pool.claims_pending,
                    pool.claims_dead
                )];
                if !pool.reserving.is_empty() {
                    // A handful is what matters; the rest are counted.
                    const SHOWN: usize = 10;
                    let shown = pool.reserving[..pool.reserving.len().min(SHOWN)].join(", ");
                    let more = pool.reserving.len().saturating_sub(SHOWN);
                    summary.push(format!(
                        "{} users being re-served after their worker died: {shown}{}.",
                        pool.reserving.len(),
                        if more > 0 {
                            format!(" and {more} more")
                        } else {
                            String::new()
                        }
                    ));
                }
                summary
            }
        };
        TablesPage {
            header: Header::new("/pool", snapshot, refresh_ms),
            heading: "Warm pool",
            summary,
            tables: vec![
                (
                    "Idle pool workers",
                    Table::build(
                        Source {
                            id: "idle",
                            api: "/api/pool",
                            rows_key: "pool.idle",
                            empty: "No idle pool worker.",
                        },
                        IDLE_COLUMNS,
                        &pool.idle,
                        snapshot.taken_at_ms,
                    ),
                ),
                (
                    "Claimed users",
                    Table::build(
                        Source {
                            id: "claimed",
                            api: "/api/pool",
                            rows_key: "pool.claimed",
                            empty: "No claimed user.",
                        },
                        CLAIMED_COLUMNS,
                        &pool.claimed,
                        snapshot.taken_at_ms,
                    ),
                ),
            ],
        }
    }

    fn fields(snapshot: &Snapshot) -> PoolFields<'_> {
        PoolFields {
            pool: snapshot.pool.as_ref(),
        }
    }
}

/// `/api/pool`'s own fields, between the snapshot time and the sources'
/// health ([`SnapshotBody`](super::SnapshotBody)).
#[derive(Debug, Serialize)]
pub struct PoolFields<'a> {
    /// The pool; null when no pool source is configured or it was never read.
    pub pool: Option<&'a PoolView>,
}

/// Columns of the idle pool table.
pub const IDLE_COLUMNS: &[Column<IdleWorker>] = &[
    col("Worker", "worker_id", Kind::Text, |r| {
        Value::text(&r.worker_id)
    }),
    col("Task", "task_id", Kind::Text, |r| {
        Value::opt_text(r.task_id.as_deref())
    }),
    col("Heartbeat", "heartbeat_at_ms", Kind::Ago, |r| {
        Value::opt(r.heartbeat_at_ms)
    }),
];

/// Columns of the claimed users table.
pub const CLAIMED_COLUMNS: &[Column<ClaimedUser>] = &[
    col("User", "user_id", Kind::Text, |r| Value::text(&r.user_id)),
    col("Worker", "worker_id", Kind::Text, |r| {
        Value::opt_text(r.worker_id.as_deref())
    }),
    col("Task ARN", "task_arn", Kind::Text, |r| {
        Value::opt_text(r.task_arn.as_deref())
    }),
    col("Instance", "instance_id", Kind::Text, |r| {
        Value::opt_text(r.instance_id.as_deref())
    }),
    col("Launched", "launched_at_ms", Kind::Ago, |r| {
        Value::opt(r.launched_at_ms)
    }),
    col("Heartbeat", "heartbeat_at_ms", Kind::Ago, |r| {
        Value::opt(r.heartbeat_at_ms)
    }),
    col("Requests queued", "requests_queued", Kind::Number, |r| {
        r.requests_queued.into()
    }),
    col("Control queued", "control_queued", Kind::Number, |r| {
        r.control_queued.into()
    }),
    col("Dead letters", "dead_letters", Kind::Number, |r| {
        r.dead_letters.into()
    }),
];
