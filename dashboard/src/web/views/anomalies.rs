//! The anomalies view (the latest maintenance sweep's findings, and every
//! sweep seen since the dashboard started) and `/api/anomalies`.

use serde::Serialize;

use crate::model::{Snapshot, SweepSummary};
use crate::web::column::{Column, Kind, Source, Table, Value, col};
use crate::web::page::{Header, TablesPage};
use crate::web::views::SnapshotView;
use leasehold_pool::read::{AnomalyView, Finding};

/// The anomalies view: its page and `/api/anomalies` read the latest snapshot alone.
pub(crate) struct Anomalies;

impl SnapshotView for Anomalies {
    const PATH: &'static str = "/anomalies";
    type Fields<'a> = AnomaliesFields<'a>;

    fn page(snapshot: &Snapshot, refresh_ms: u64) -> TablesPage {
        let report = snapshot.anomalies.as_ref().and_then(|a| a.report.as_ref());
        let mut summary = Vec::new();
        match (&snapshot.anomalies, report) {
            (None, _) => summary.push(snapshot.no_pool_data()),
            (Some(view), None) => summary.push(
                view.unreadable
                    .clone()
                    .unwrap_or_else(|| "No maintenance sweep has reported yet.".into()),
            ),
            (Some(_), Some(report)) => {
                summary.push(format!(
                    "Last sweep {} ago{}: {} marks, {} tasks.",
                    crate::web::column::duration_ms(snapshot.taken_at_ms - report.at as i64),
                    if report.dry_run { " (dry run)" } else { "" },
                    report.marks,
                    report.tasks
                ));
                let counts = |map: &std::collections::BTreeMap<_, u64>| {
                    map.iter()
                        .map(|(k, n): (&leasehold_telemetry::OrphanKind, &u64)| {
                            format!("{} {n}", k.as_str())
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                summary.push(format!("Found: {}.", counts(&report.found)));
                summary.push(format!("Resolved: {}.", counts(&report.resolved)));
                for error in &report.errors {
                    summary.push(format!("Error: {error}"));
                }
            }
        }
        TablesPage {
            header: Header::new("/anomalies", snapshot, refresh_ms),
            heading: "Anomalies (latest maintenance sweep)",
            summary,
            tables: vec![
                (
                    "Findings of the latest sweep",
                    Table::build(
                        Source {
                            id: "findings",
                            api: "/api/anomalies",
                            rows_key: "anomalies.report.findings",
                            empty: "Nothing found.",
                        },
                        FINDING_COLUMNS,
                        report.map(|r| r.findings.as_slice()).unwrap_or_default(),
                        snapshot.taken_at_ms,
                    ),
                ),
                (
                    "Sweeps since the dashboard started",
                    Table::build(
                        Source {
                            id: "sweeps",
                            api: "/api/anomalies",
                            rows_key: "sweeps",
                            empty: "No sweep seen yet.",
                        },
                        SWEEP_COLUMNS,
                        &snapshot.sweeps,
                        snapshot.taken_at_ms,
                    ),
                ),
            ],
        }
    }

    fn fields(snapshot: &Snapshot) -> AnomaliesFields<'_> {
        AnomaliesFields {
            anomalies: snapshot.anomalies.as_ref(),
            sweeps: &snapshot.sweeps,
        }
    }
}

/// `/api/anomalies`'s own fields, between the snapshot time and the sources'
/// health ([`SnapshotBody`](super::SnapshotBody)).
#[derive(Debug, Serialize)]
pub struct AnomaliesFields<'a> {
    /// The latest report.
    pub anomalies: Option<&'a AnomalyView>,
    /// The sweeps seen since the dashboard started, newest first.
    pub sweeps: &'a [SweepSummary],
}

/// Columns of the sweep history.
pub const SWEEP_COLUMNS: &[Column<SweepSummary>] = &[
    col("When", "at_ms", Kind::Ago, |r| r.at_ms.into()),
    col("Dry run", "dry_run", Kind::Badge, |r| r.dry_run.into()),
    col("Found", "found", Kind::Number, |r| r.found.into()),
    col("Resolved", "resolved", Kind::Number, |r| r.resolved.into()),
    col("Claims requeued", "claims_requeued", Kind::Number, |r| {
        r.claims_requeued.into()
    }),
    col("Errors", "errors", Kind::Number, |r| r.errors.into()),
];

/// Columns of the findings table.
pub const FINDING_COLUMNS: &[Column<Finding>] = &[
    col("Kind", "kind", Kind::Badge, |r| r.kind.as_str().into()),
    col("User", "user_id", Kind::Text, |r| {
        Value::opt_text(r.user_id.as_deref())
    }),
    col("Mark deleted", "delete_key", Kind::Text, |r| {
        Value::opt_text(r.delete_key.as_deref())
    }),
    col("Task stopped", "stop_task", Kind::Text, |r| {
        Value::opt_text(r.stop_task.as_deref())
    }),
];
