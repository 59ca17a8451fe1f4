//! The workers view: each stream owner with what its sidecar says, and
//! `/api/workers`.

use serde::Serialize;

use crate::model::Snapshot;
use crate::model::WorkerRow;
use crate::sources::sidecars::SidecarReport;
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage};
use crate::web::views::SnapshotView;
use leasehold_control::lease::LeaseState;

/// The workers view: its page and `/api/workers` read the latest snapshot alone.
pub(crate) struct Workers;

impl SnapshotView for Workers {
    const PATH: &'static str = "/workers";
    type Fields<'a> = WorkersFields<'a>;

    fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
        let answered = snapshot
            .sidecars
            .iter()
            .filter(|s| s.status.is_some())
            .count();
        // Stream owners are the rows that hold a stream or say they are a
        // stream worker; a broker pool's sidecar answers too, but owns none.
        let owners = snapshot
            .workers
            .iter()
            .filter(|w| w.streams_held > 0 || w.component.as_deref() == Some("stream-worker"))
            .count();
        let others = snapshot.workers.len() - owners;
        TablesPage {
            header: Header::new("/workers", snapshot, refresh_ms),
            heading: "Workers",
            summary: vec![format!(
                "{owners} stream owners{}; {answered} of {} sidecars answered.",
                if others > 0 {
                    format!(" and {others} other components (broker pool, observers)")
                } else {
                    String::new()
                },
                snapshot.sidecars.len()
            )],
            tables: vec![(
                "Leases held per owner, with what its sidecar says",
                Table::build(
                    Source {
                        id: "workers",
                        api: "/api/workers",
                        rows_key: "workers",
                        empty: "No worker holds a lease and no sidecar answered.",
                    },
                    WORKER_COLUMNS,
                    &snapshot.workers,
                    snapshot.taken_at_ms,
                ),
            )],
        }
    }

    fn fields(snapshot: &Snapshot) -> WorkersFields<'_> {
        WorkersFields {
            workers: &snapshot.workers,
            sidecars: &snapshot.sidecars,
        }
    }
}

/// `/api/workers`'s own fields, between the snapshot time and the sources'
/// health ([`SnapshotBody`](super::SnapshotBody)).
#[derive(Debug, Serialize)]
pub struct WorkersFields<'a> {
    /// Owners and sidecar-only workers.
    pub workers: &'a [WorkerRow],
    /// Every sidecar polled, with errors.
    pub sidecars: &'a [SidecarReport],
}

/// Columns of the workers table.
pub const WORKER_COLUMNS: &[Column<WorkerRow>] = &[
    col("Owner", "owner_id", Kind::Text, |r| {
        Value::text(&r.owner_id)
    }),
    col("Streams held", "streams_held", Kind::Number, |r| {
        r.streams_held.into()
    }),
    col("Of them expired", "streams_expired", Kind::Number, |r| {
        r.streams_expired.into()
    }),
    col("Fence tokens", "tokens", Kind::Tokens, |r| {
        Value::Tokens(&r.tokens)
    }),
    col("Presence", "presence", Kind::Badge, |r| {
        Value::opt(r.presence.map(LeaseState::as_str))
    }),
    col("Worker up", "worker_up", Kind::Badge, |r| {
        Value::opt(r.worker_up)
    }),
    col("Last event", "last_event_age_ms", Kind::AgeMs, |r| {
        Value::opt(r.last_event_age_ms)
    }),
    col("Leases lost", "leases_lost", Kind::Number, |r| {
        Value::opt(r.leases_lost)
    }),
    col("Fenced writes", "sink_events_fenced", Kind::Number, |r| {
        Value::opt(r.sink_events_fenced)
    }),
    col("Component", "component", Kind::Text, |r| {
        Value::opt_text(r.component.as_deref())
    }),
    col("Sidecar", "sidecar_url", Kind::StatusLink, |r| {
        Value::opt_text(r.sidecar_url.as_deref())
    }),
];
