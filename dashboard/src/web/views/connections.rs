//! The connections view: each stream worker's upstream connections (how many,
//! the streams on each, their age, subscribe latency, throttled connects),
//! to check against the exchange's limits; and `/api/connections`.

use serde::Serialize;

use crate::model::Snapshot;
use crate::model::connections::{ConnectionOwnerRow, ConnectionRow};
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage};
use crate::web::views::SnapshotView;
use leasehold_telemetry::status::LISTED_CONNECTIONS;

/// The connections view: its page and `/api/connections` read the latest
/// snapshot alone.
pub(crate) struct Connections;

impl SnapshotView for Connections {
    const PATH: &'static str = "/connections";
    type Fields<'a> = ConnectionsFields<'a>;

    fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
        let view = &snapshot.connections;
        let open: u64 = view.owners.iter().map(|o| o.connections).sum();
        let throttled: u64 = view.owners.iter().map(|o| o.connects_throttled).sum();
        TablesPage {
            header: Header::new("/connections", snapshot, refresh_ms),
            heading: "Upstream connections",
            summary: vec![
                format!(
                    "{open} connections open on {} stream workers; {throttled} connects waited for a worker's connect budget (UPSTREAM_CONNECTS_PER_MINUTE).",
                    view.owners.len()
                ),
                format!(
                    "Each sidecar lists its worker's oldest {LISTED_CONNECTIONS} connections. A replaced connection keeps its number; its age starts again. The stream page names the connection carrying the stream."
                ),
            ],
            tables: vec![
                (
                    "Per worker",
                    Table::build(
                        Source {
                            id: "connection-owners",
                            api: "/api/connections",
                            rows_key: "owners",
                            empty: "No stream worker reports upstream connections.",
                        },
                        OWNER_COLUMNS,
                        &view.owners,
                        snapshot.taken_at_ms,
                    ),
                ),
                (
                    "Per connection",
                    Table::build(
                        Source {
                            id: "connections",
                            api: "/api/connections",
                            rows_key: "connections",
                            empty: "No connection listed.",
                        },
                        CONNECTION_COLUMNS,
                        &view.connections,
                        snapshot.taken_at_ms,
                    ),
                ),
            ],
        }
    }

    fn fields(snapshot: &Snapshot) -> ConnectionsFields<'_> {
        ConnectionsFields {
            owners: &snapshot.connections.owners,
            connections: &snapshot.connections.connections,
        }
    }
}

/// `/api/connections`'s own fields.
#[derive(Debug, Serialize)]
pub struct ConnectionsFields<'a> {
    /// One line per stream worker.
    pub owners: &'a [ConnectionOwnerRow],
    /// Every listed connection, by worker and number.
    pub connections: &'a [ConnectionRow],
}

/// Columns of the per-worker table.
pub const OWNER_COLUMNS: &[Column<ConnectionOwnerRow>] = &[
    col("Worker", "owner_id", Kind::Text, |r| {
        Value::text(&r.owner_id)
    }),
    col("Connections", "connections", Kind::Number, |r| {
        r.connections.into()
    }),
    col("Streams on listed", "streams_listed", Kind::Number, |r| {
        r.streams_listed.into()
    }),
    col("Oldest opened", "oldest_opened_at_ms", Kind::Ago, |r| {
        Value::opt(r.oldest_opened_at_ms)
    }),
    col(
        "Slowest subscribe",
        "slowest_subscribe_seconds",
        Kind::Seconds,
        |r| Value::opt(r.slowest_subscribe_seconds),
    ),
    col(
        "Throttled connects",
        "connects_throttled",
        Kind::Number,
        |r| r.connects_throttled.into(),
    ),
];

/// Columns of the per-connection table.
pub const CONNECTION_COLUMNS: &[Column<ConnectionRow>] = &[
    col("Worker", "owner_id", Kind::Text, |r| {
        Value::text(&r.owner_id)
    }),
    col("Connection", "connection", Kind::Number, |r| {
        r.connection.into()
    }),
    col("Streams", "streams", Kind::Number, |r| r.streams.into()),
    col("Opened", "opened_at_ms", Kind::Ago, |r| {
        r.opened_at_ms.into()
    }),
    col("Replacements", "replacements", Kind::Number, |r| {
        r.replacements.into()
    }),
    col("Subscribe", "subscribe_seconds", Kind::Seconds, |r| {
        Value::opt(r.subscribe_seconds)
    }),
];
