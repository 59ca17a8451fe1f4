//! Leases as people and scripts read them: the operator CLI's table, one
//! record's details, and the stable JSON of `leases list / show --json`.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;

use crate::lease::{Lease, LeaseState};
use crate::schema::MalformedItem;

/// The stream id a listed record sorts by.
pub fn record_key(record: &Result<Lease, MalformedItem>) -> &str {
    match record {
        Ok(lease) => &lease.stream_id,
        Err(err) => &err.stream_id,
    }
}

/// JSON form of a listed record, stable for scripts.
pub fn record_json(record: &Result<Lease, MalformedItem>, now: i64) -> serde_json::Value {
    match record {
        Ok(lease) => {
            let mut value = serde_json::to_value(lease).unwrap_or_default();
            value["state"] = json!(lease.state(now).as_str());
            value["expires_in_ms"] = match lease.owner_id {
                Some(_) => json!(lease.lease_expires_at - now),
                None => serde_json::Value::Null,
            };
            value
        }
        Err(err) => json!({
            "stream_id": err.stream_id,
            "state": "malformed",
            "error": err.to_string(),
        }),
    }
}

/// "12.3s", "4m05s", "2h03m".
fn short_duration(ms: i64) -> String {
    let ms = ms.unsigned_abs();
    match ms {
        0..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

fn expires_in(lease: &Lease, now: i64) -> String {
    match lease.state(now) {
        LeaseState::Unowned => "-".into(),
        LeaseState::Owned => short_duration(lease.lease_expires_at - now),
        LeaseState::Expired => format!(
            "expired {} ago",
            short_duration(now - lease.lease_expires_at)
        ),
    }
}

fn timestamp(ms: Option<i64>) -> String {
    match ms {
        Some(ms) if ms > 0 => {
            let time = UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs());
            humantime::format_rfc3339_millis(time).to_string()
        }
        _ => "-".into(),
    }
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The `leases list` table: one row per record, malformed ones flagged.
pub fn render_table(records: &[Result<Lease, MalformedItem>], now: i64) -> String {
    let header = [
        "STREAM",
        "STATE",
        "OWNER",
        "TOKEN",
        "EXPIRES IN",
        "CHECKPOINT",
        "UPDATED",
    ];
    let rows: Vec<[String; 7]> = records
        .iter()
        .map(|record| match record {
            Ok(lease) => [
                lease.stream_id.clone(),
                lease.state(now).as_str().into(),
                opt(lease.owner_id.as_deref()),
                lease.fence_token.to_string(),
                expires_in(lease, now),
                opt(lease.checkpoint),
                timestamp(lease.updated_at),
            ],
            Err(err) => [
                err.stream_id.clone(),
                "MALFORMED".into(),
                format!("`{}` {}", err.attribute, err.problem),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ],
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    if rows.is_empty() {
        out.push_str("(no leases; register streams with `leasehold leases add STREAM…`)\n");
    }
    out
}

/// `leases show`: every attribute of one record.
pub fn render_details(lease: &Lease, now: i64) -> String {
    let rows = [
        ("stream_id", lease.stream_id.clone()),
        ("state", lease.state(now).as_str().into()),
        ("owner_id", opt(lease.owner_id.as_deref())),
        ("fence_token", lease.fence_token.to_string()),
        (
            "lease_expires_at",
            format!(
                "{} ({})",
                timestamp(Some(lease.lease_expires_at)),
                expires_in(lease, now)
            ),
        ),
        ("checkpoint", opt(lease.checkpoint)),
        ("checkpoint_at", timestamp(lease.checkpoint_at)),
        ("updated_at", timestamp(lease.updated_at)),
        ("acquired_at", timestamp(lease.acquired_at)),
        ("previous_owner", opt(lease.previous_owner.as_deref())),
        ("released_at", timestamp(lease.released_at)),
    ];
    rows.iter()
        .map(|(name, value)| format!("{name:<17} {value}\n"))
        .collect()
}

/// What `leases list` prints: the stream records (every record with `all`,
/// reserved `leasehold#…` ones included), sorted by stream id, as the table
/// or as one JSON array.
pub fn render_list(
    mut records: Vec<Result<Lease, MalformedItem>>,
    all: bool,
    json: bool,
    now: i64,
) -> String {
    records.retain(|r| all || r.as_ref().map_or(true, Lease::is_stream));
    records.sort_by(|a, b| record_key(a).cmp(record_key(b)));
    if json {
        let rows: Vec<_> = records.iter().map(|r| record_json(r, now)).collect();
        pretty(&serde_json::Value::Array(rows))
    } else {
        render_table(&records, now)
    }
}

/// What `leases show` and `leases release` print for one lease: its details,
/// or its JSON.
pub fn render_one(lease: Lease, json: bool, now: i64) -> String {
    if json {
        pretty(&record_json(&Ok(lease), now))
    } else {
        render_details(&lease, now)
    }
}

/// Pretty JSON and a newline (a `Value` always serializes).
fn pretty(value: &serde_json::Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(value).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(stream: &str, owner: Option<&str>, expires: i64, token: u64) -> Lease {
        Lease {
            owner_id: owner.map(String::from),
            lease_expires_at: expires,
            fence_token: token,
            checkpoint: Some(12),
            updated_at: Some(1_700_000_000_000),
            ..Lease::unowned(stream)
        }
    }

    #[test]
    fn table_shows_owner_token_expiry_and_malformed_rows() {
        let now = 1_700_000_000_000;
        let records = vec![
            Ok(lease("a", Some("w1"), now + 12_300, 4)),
            Ok(lease("b", Some("w2"), now - 5_000, 2)),
            Ok(lease("c", None, 0, 7)),
            Err(MalformedItem {
                stream_id: "d".into(),
                attribute: "fence_token".into(),
                problem: "has type S (expected N)".into(),
            }),
        ];
        let text = render_table(&records, now);
        let lines: Vec<_> = text.lines().collect();
        assert!(lines[0].starts_with("STREAM"), "{text}");
        assert!(
            lines[1].contains("owned") && lines[1].contains("w1") && lines[1].contains("12.3s"),
            "{text}"
        );
        assert!(lines[2].contains("expired 5.0s ago"), "{text}");
        assert!(
            lines[3].contains("unowned") && lines[3].contains(" 7 "),
            "{text}"
        );
        assert!(
            lines[4].contains("MALFORMED") && lines[4].contains("`fence_token`"),
            "{text}"
        );
    }

    #[test]
    fn json_rows_carry_state_and_expiry() {
        let now = 1_000;
        let value = record_json(&Ok(lease("a", Some("w"), 3_000, 1)), now);
        assert_eq!(value["state"], "owned");
        assert_eq!(value["expires_in_ms"], 2_000);
        assert_eq!(value["fence_token"], 1);
        let released = record_json(&Ok(lease("a", None, 0, 1)), now);
        assert!(released["expires_in_ms"].is_null());
    }

    #[test]
    fn the_list_hides_reserved_records_unless_all_and_sorts_by_stream() {
        let now = 1_000;
        let records = || {
            vec![
                Ok(lease("b", Some("w"), 3_000, 1)),
                Ok(lease("leasehold#presence#w", Some("w"), 3_000, 1)),
                Ok(lease("a", None, 0, 2)),
            ]
        };
        let json: serde_json::Value =
            serde_json::from_str(&render_list(records(), false, true, now)).unwrap();
        let ids: Vec<_> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["stream_id"].clone())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        let all = render_list(records(), true, false, now);
        assert!(all.contains("leasehold#presence#w"), "{all}");
        assert!(render_one(lease("a", None, 0, 2), true, now).ends_with("}\n"));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(short_duration(12_345), "12.3s");
        assert_eq!(short_duration(245_000), "4m05s");
        assert_eq!(short_duration(7_380_000), "2h03m");
    }
}
