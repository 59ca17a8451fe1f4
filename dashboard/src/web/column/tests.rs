//! Cells by kind, and the typed columns against the JSON the script reads.

use serde::Serialize;

use super::*;
use crate::model::WorkerRow;
use crate::model::changes::{Change, ChangeKind};
use crate::model::gaps::GapTally;
use crate::model::streams::{StreamRow, StreamState, Verdict};
use crate::web::views::anomalies::FINDING_COLUMNS;
use crate::web::views::changes::CHANGE_COLUMNS;
use crate::web::views::pool::{CLAIMED_COLUMNS, IDLE_COLUMNS};
use crate::web::views::streams::STREAM_COLUMNS;
use crate::web::views::workers::WORKER_COLUMNS;
use leasehold_control::lease::LeaseState;
use leasehold_pool::read::{ClaimedUser, Finding, IdleWorker};
use leasehold_telemetry::OrphanKind;
use leasehold_telemetry::labels::GapReason;

fn field<'a>(row: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    path.split('.').fold(row, |value, key| &value[key])
}

/// The cell the script makes of a JSON value: how cells were made before
/// columns were typed, kept as the oracle the typed cells must match.
fn json_cell(kind: Kind, value: &serde_json::Value, now_ms: i64) -> Cell {
    use serde_json::Value;
    let text = |text: String| Cell {
        text,
        ..Cell::default()
    };
    match (kind, value) {
        (_, Value::Null) => text(NONE.into()),
        (Kind::Text, Value::String(s)) => text(s.clone()),
        (Kind::Badge, Value::String(s)) => Cell {
            text: s.clone(),
            class: format!("badge badge-{s}"),
            ..Cell::default()
        },
        (Kind::Badge, Value::Bool(b)) => Cell {
            text: if *b { "yes" } else { "no" }.into(),
            class: format!("badge badge-{}", if *b { "up" } else { "down" }),
            ..Cell::default()
        },
        (Kind::Seconds, Value::Number(n)) => text(format!("{:.1} s", n.as_f64().unwrap_or(0.0))),
        (Kind::Countdown, Value::Number(n)) => match n.as_i64() {
            Some(0) | None => text(NONE.into()),
            Some(at) => Cell {
                text: countdown(at - now_ms),
                at: Some(at),
                ..Cell::default()
            },
        },
        (Kind::Ago, Value::Number(n)) => match n.as_i64() {
            Some(at) if at > 0 => Cell {
                text: format!("{} ago", duration_ms(now_ms - at)),
                at: Some(at),
                ..Cell::default()
            },
            _ => text(NONE.into()),
        },
        (Kind::AgeMs, Value::Number(n)) => text(duration_ms(n.as_i64().unwrap_or(0))),
        (Kind::StatusLink, Value::String(url)) => Cell {
            text: format!("{url}/status"),
            href: Some(format!("{url}/status")),
            ..Cell::default()
        },
        (Kind::StreamLink, Value::String(id)) => Cell {
            text: id.clone(),
            href: Some(crate::web::page::stream_href(id)),
            ..Cell::default()
        },
        (Kind::Gap, Value::Object(_)) => {
            match <crate::model::gaps::LastGap as serde::Deserialize>::deserialize(value) {
                Ok(gap) if gap.at_ms > 0 => Cell {
                    text: format!("{} ago", duration_ms(now_ms - gap.at_ms)),
                    at: Some(gap.at_ms),
                    title: Some(gap.range_text()),
                    ..Cell::default()
                },
                _ => text(NONE.into()),
            }
        }
        (Kind::Tokens, Value::Array(pairs)) => text(
            pairs
                .iter()
                .map(|pair| format!("{}:{}", pair[0].as_str().unwrap_or("?"), pair[1]))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (_, Value::String(s)) => text(s.clone()),
        (_, other) => text(other.to_string()),
    }
}

#[test]
fn durations_read_like_an_operator_writes_them() {
    assert_eq!(duration_ms(850), "850 ms");
    assert_eq!(duration_ms(12_340), "12.3 s");
    assert_eq!(duration_ms(250_000), "4 m 10 s");
    assert_eq!(duration_ms(7_500_000), "2 h 5 m");
    assert_eq!(countdown(-2_000), "2.0 s ago");
}

struct Row {
    id: &'static str,
    state: &'static str,
    exp: i64,
    nested: Option<u64>,
    tokens: Vec<(String, u64)>,
    gap: Option<LastGap>,
}

const COLUMNS: &[Column<Row>] = &[
    col("Stream", "stream_id", Kind::Text, |r| Value::text(r.id)),
    col("State", "state", Kind::Badge, |r| Value::text(r.state)),
    col("Expires", "exp", Kind::Countdown, |r| r.exp.into()),
    col("Nested", "a.b", Kind::Number, |r| Value::opt(r.nested)),
    col("Tokens", "tokens", Kind::Tokens, |r| {
        Value::Tokens(&r.tokens)
    }),
    col("Last gap", "gaps.last", Kind::Gap, |r| {
        r.gap.as_ref().map_or(Value::None, Value::Gap)
    }),
];

#[test]
fn cells_follow_their_kind() {
    let rows = [
        Row {
            id: "<b>",
            state: "owned",
            exp: 11_000,
            nested: Some(7),
            tokens: vec![("s1".into(), 3), ("s2".into(), 4)],
            gap: Some(LastGap {
                at_ms: 400,
                from_seq: 7,
                to_seq: 9,
                missing: 3,
                reason: GapReason::SinkLost,
            }),
        },
        Row {
            id: "",
            state: "",
            exp: 0,
            nested: None,
            tokens: Vec::new(),
            gap: None,
        },
    ];
    let source = Source {
        id: "t",
        api: "/api/x",
        rows_key: "rows",
        empty: "none",
    };
    let table = Table::build(source, COLUMNS, &rows, 1_000);
    let row = &table.rows[0];
    assert_eq!(
        row[0].text, "<b>",
        "escaping is the template's job, not the cell's"
    );
    assert_eq!(row[1].class, "badge badge-owned");
    assert_eq!(row[2].text, "in 10.0 s");
    assert_eq!(row[2].at, Some(11_000));
    assert_eq!(row[3].text, "7");
    assert_eq!(row[4].text, "s1:3, s2:4");
    assert_eq!(
        (row[5].text.as_str(), row[5].at, row[5].title.as_deref()),
        (
            "600 ms ago",
            Some(400),
            Some("seq 7–9 missing (3 events): sink_lost")
        )
    );
    let none = &table.rows[1][5];
    assert_eq!(
        (none.text.as_str(), none.at, &none.title),
        ("—", None, &None)
    );
    assert_eq!(table.rows[1][2].text, "—", "no expiry");
    assert_eq!(table.columns[3].field, "a.b");
}

/// Every column's accessor and its JSON path name the same value: the cell
/// from the typed row is the cell the script makes from the row's JSON.
fn agrees<Row: Serialize>(columns: &[Column<Row>], rows: &[Row]) {
    let now_ms = 1_800_000_000_000;
    for row in rows {
        let json = serde_json::to_value(row).unwrap();
        for column in columns {
            let typed = cell(column.kind, (column.value)(row), now_ms);
            let scripted = json_cell(column.kind, field(&json, column.field), now_ms);
            assert_eq!(
                serde_json::to_value(&typed).unwrap(),
                serde_json::to_value(&scripted).unwrap(),
                "column {:?} ({}) in {json}",
                column.title,
                column.field
            );
        }
    }
}

#[test]
fn every_typed_column_names_the_field_its_json_path_does() {
    let now = 1_800_000_000_000;
    let mut full = StreamRow::unowned("a/b <c>");
    full.owner_id = Some("w-1".into());
    full.fence_token = 7;
    full.state = StreamState::Expiring;
    full.lease_expires_at_ms = now + 5_000;
    full.checkpoint = Some(42);
    full.checkpoint_at_ms = Some(now - 3_000);
    full.lag_events = Some(12);
    full.lag_seconds = Some(1.25);
    full.last_event_age_seconds = Some(0.5);
    full.last_change_at_ms = Some(now - 60_000);
    full.verdict = Verdict::Stalled;
    full.problem = Some("bad token".into());
    full.gaps = Some(GapTally {
        count: 2,
        missing: 20,
        last: LastGap {
            at_ms: now - 1_000,
            from_seq: 1,
            to_seq: 10,
            missing: 10,
            reason: GapReason::Retention,
        },
        reasons: [0; GapReason::RECORDED.len()],
    });
    let mut nan = StreamRow::unowned("nan");
    nan.lag_seconds = Some(f64::NAN);
    agrees(STREAM_COLUMNS, &[full, StreamRow::unowned("b"), nan]);

    let worker = WorkerRow {
        owner_id: "w-1".into(),
        streams_held: 2,
        streams_expired: 1,
        tokens: vec![("s-1".into(), 3), ("s-2".into(), 9)],
        presence: Some(LeaseState::Expired),
        sidecar_url: Some("http://10.0.0.1:9464".into()),
        worker_up: Some(false),
        last_event_age_ms: Some(1_500),
        component: Some("stream-worker".into()),
        sink_events_fenced: Some(4),
        leases_lost: Some(1),
        observer: true,
    };
    let bare = WorkerRow {
        presence: None,
        sidecar_url: None,
        worker_up: None,
        last_event_age_ms: None,
        component: None,
        sink_events_fenced: None,
        leases_lost: None,
        tokens: Vec::new(),
        ..worker.clone()
    };
    agrees(WORKER_COLUMNS, &[worker, bare]);

    agrees(
        IDLE_COLUMNS,
        &[
            IdleWorker {
                worker_id: "p-1".into(),
                task_id: Some("t-1".into()),
                heartbeat_at_ms: Some(now - 2_000),
                sidecar_url: None,
            },
            IdleWorker {
                worker_id: "p-2".into(),
                task_id: None,
                heartbeat_at_ms: None,
                sidecar_url: None,
            },
        ],
    );
    agrees(
        CLAIMED_COLUMNS,
        &[ClaimedUser {
            user_id: "u-1".into(),
            worker_id: Some("p-1".into()),
            task_id: None,
            heartbeat_at_ms: Some(now - 1_000),
            task_arn: Some("arn:aws:ecs:task/1".into()),
            instance_id: None,
            launched_at_ms: Some(now - 90_000),
            sidecar_url: None,
            requests_queued: 3,
            control_queued: 0,
            dead_letters: 1,
        }],
    );
    agrees(
        FINDING_COLUMNS,
        &OrphanKind::ALL
            .iter()
            .map(|kind| Finding {
                kind: *kind,
                user_id: Some("u".into()),
                delete_key: None,
                stop_task: Some("arn".into()),
            })
            .collect::<Vec<_>>(),
    );
    agrees(
        CHANGE_COLUMNS,
        &[
            ChangeKind::Acquired,
            ChangeKind::Takeover,
            ChangeKind::Handoff,
            ChangeKind::Released,
        ]
        .into_iter()
        .map(|kind| Change {
            at_ms: now - 10_000,
            stream_id: "s-1".into(),
            kind,
            old_owner: Some("w-0".into()),
            new_owner: None,
            fence_token: 5,
            gap_seconds: Some(3.5),
            missed: 2,
        })
        .collect::<Vec<_>>(),
    );
}
