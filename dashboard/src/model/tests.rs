//! `Model::apply` and its helpers, without a clock, a store or a network.

use super::*;
use leasehold_control::lease::Lease;

use crate::sources::SidecarReadings;

fn reporting(url: &str, claims: &[(u64, u64, f64)]) -> SidecarReport {
    let claims: Vec<serde_json::Value> = claims
        .iter()
        .map(|(seq, age_ms, seconds)| {
            serde_json::json!({"seq": seq, "age_ms": age_ms, "seconds": seconds})
        })
        .collect();
    let status = serde_json::json!({
        "component": "broker-worker", "owner_id": "p", "worker_connected": true,
        "last_event_age_ms": 1, "worker_up": true, "events_received": 1,
        "events_dropped": 0, "leases": [], "lag": {}, "websocket_connections": 0,
        "pool": null, "observer": false, "claims": claims,
    });
    SidecarReport {
        url: url.into(),
        status: Some(serde_json::from_value(status).unwrap()),
        error: None,
    }
}

#[test]
fn claims_are_counted_once_across_refreshes_and_restarts() {
    let mut seen = HashMap::new();
    let a = "http://10.0.0.1:9464";
    // The dashboard's first refresh: what happened before is not counted.
    let first = new_claims(&mut seen, &[reporting(a, &[(1, 50, 0.3)])], None);
    assert!(first.is_empty());
    // The next refresh: only the new claim.
    let next = new_claims(
        &mut seen,
        &[reporting(a, &[(1, 2_050, 0.3), (2, 10, 0.7)])],
        Some(2_000),
    );
    assert_eq!(next, vec![0.7]);
    let again = new_claims(
        &mut seen,
        &[reporting(a, &[(1, 4_050, 0.3), (2, 2_010, 0.7)])],
        Some(2_000),
    );
    assert!(again.is_empty(), "nothing counted twice");
    // Restarted (numbering back to 1) and a newcomer: only claims since
    // the previous refresh.
    let b = "http://10.0.0.2:9464";
    let restarted = new_claims(
        &mut seen,
        &[
            reporting(a, &[(1, 100, 1.5)]),
            reporting(b, &[(7, 9_000, 9.0), (8, 500, 2.5)]),
        ],
        Some(2_000),
    );
    assert_eq!(restarted, vec![1.5, 2.5]);
    // Bounded by the sidecars of the refresh.
    new_claims(&mut seen, &[reporting(b, &[])], Some(2_000));
    assert_eq!(seen.len(), 1);
}

fn owned(stream: &str, owner: &str, token: u64, expires_at: i64) -> Lease {
    Lease {
        owner_id: Some(owner.into()),
        lease_expires_at: expires_at,
        fence_token: token,
        ..Lease::unowned(stream)
    }
}

fn presence(owner: &str, expires_at: i64, sidecar_url: &str) -> Lease {
    Lease {
        sidecar_url: Some(sidecar_url.into()),
        ..owned(
            &leasehold_control::schema::worker_presence(owner),
            owner,
            1,
            expires_at,
        )
    }
}

fn readings(now_ms: i64, leases: Result<LeaseTable, String>) -> Readings {
    Readings {
        now_ms,
        leases,
        pool: None,
        sidecars: SidecarReadings::default(),
    }
}

/// Applies `readings` with fresh logs of the collector's default bounds.
struct Fixture {
    model: Model,
    changes: ChangeLog,
    trends: Trends,
    gaps: GapLog,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            model: Model::default(),
            changes: ChangeLog::bounded(1_000, changes::DEFAULT_MAX_AGE_MS),
            trends: Trends::new(trends::DEFAULT_RESOLUTION_MS),
            gaps: GapLog::default(),
        }
    }

    fn apply(&mut self, readings: Readings) -> Snapshot {
        let logs = Logs {
            changes: &mut self.changes,
            trends: &mut self.trends,
            gaps: &mut self.gaps,
        };
        self.model.apply(logs, readings, &Thresholds::default())
    }
}

#[test]
fn a_failed_lease_read_keeps_the_last_rows_unjudged_and_says_why() {
    let mut fixture = Fixture::new();
    let table = LeaseTable::classify([
        Ok(owned("s-1", "w-1", 3, 31_000)),
        Ok(presence("w-1", 31_000, "http://10.0.0.1:9464")),
    ]);
    let first = fixture.apply(readings(1_000, Ok(table)));
    assert_eq!(first.streams.len(), 1);
    assert_eq!(first.streams[0].state.as_str(), "owned");
    assert_eq!(first.workers.len(), 1);
    assert_eq!(first.workers[0].presence, Some(LeaseState::Owned));
    assert_eq!(first.sources[0].last_ok_ms, Some(1_000));

    // Long past the lease's expiry, the table cannot be read: the rows stay
    // as last judged (not "expired"), the source says why and since when.
    let second = fixture.apply(readings(60_000, Err("throttled".into())));
    assert_eq!(second.taken_at_ms, 60_000);
    assert_eq!(second.streams[0].state.as_str(), "owned");
    let lease = &second.sources[0];
    assert_eq!(
        (
            lease.name,
            lease.ok,
            lease.error.as_deref(),
            lease.last_ok_ms
        ),
        ("lease table", false, Some("throttled"), Some(1_000))
    );
    assert!(
        second.sources.iter().all(|s| s.configured),
        "no pool and no sidecars: not listed"
    );
    assert_eq!(second.sources.len(), 1);
}

#[test]
fn the_published_sidecars_come_from_this_read_else_the_last_good_one() {
    let mut fixture = Fixture::new();
    let old = LeaseTable::classify([Ok(presence("w-1", 31_000, "http://10.0.0.1:9464"))]);
    fixture.apply(readings(1_000, Ok(old)));
    let new = LeaseTable::classify([Ok(presence("w-2", 31_000, "http://10.0.0.2:9464"))]);
    assert_eq!(
        fixture.model.published_sidecars(Some(&new), None),
        ["http://10.0.0.2:9464"]
    );
    assert_eq!(
        fixture.model.published_sidecars(None, None),
        ["http://10.0.0.1:9464"],
        "a lease table that is down does not make its sidecars vanish"
    );
}

#[test]
fn lag_is_taken_only_from_the_owners_own_sidecar_and_silent_sidecars_are_counted() {
    let mut fixture = Fixture::new();
    let table = LeaseTable::classify([Ok(owned("s-1", "w-1", 3, 31_000))]);
    let status = |owner: &str, lag_events: u64| {
        serde_json::from_value(serde_json::json!({
            "component": "stream-worker", "owner_id": owner, "worker_connected": true,
            "last_event_age_ms": 1, "worker_up": true, "events_received": 1,
            "events_dropped": 0, "leases": [], "websocket_connections": 0,
            "lag": {"s-1": {"lag_events": lag_events, "lag_seconds": 0.5,
                "last_event_age_seconds": 0.1}},
            "pool": null, "observer": false, "claims": [],
        }))
        .unwrap()
    };
    let mut reading = readings(1_000, Ok(table));
    reading.sidecars.reports = vec![
        SidecarReport {
            url: "http://10.0.0.1:9464".into(),
            status: Some(status("w-1", 7)),
            error: None,
        },
        SidecarReport {
            url: "http://10.0.0.2:9464".into(),
            status: Some(status("w-0", 9_999)),
            error: None,
        },
        SidecarReport {
            url: "http://10.0.0.3:9464".into(),
            status: None,
            error: Some("unreachable".into()),
        },
    ];
    let snapshot = fixture.apply(reading);
    assert_eq!(snapshot.streams[0].lag_events, Some(7));
    let sidecars = snapshot
        .sources
        .iter()
        .find(|s| s.name == "sidecars")
        .unwrap();
    assert_eq!(
        sidecars.error.as_deref(),
        Some("1 of 3 sidecars did not answer (1 unreachable)")
    );
    let owners: Vec<&str> = snapshot
        .workers
        .iter()
        .map(|w| w.owner_id.as_str())
        .collect();
    assert_eq!(
        owners,
        ["w-0", "w-1"],
        "a sidecar-only worker has a row too"
    );
    assert_eq!(
        fixture.model.answered().len(),
        2,
        "those that answered are asked first next time"
    );
}

#[test]
fn a_stream_nobody_holds_is_judged_unowned_not_ok() {
    let mut fixture = Fixture::new();
    let table = LeaseTable::classify([
        Ok(Lease::unowned("s-free")),
        Ok(owned("s-held", "w-1", 3, 31_000)),
    ]);
    let snapshot = fixture.apply(readings(1_000, Ok(table)));
    let verdict = |id: &str| {
        snapshot
            .streams
            .iter()
            .find(|row| row.stream_id == id)
            .map(|row| row.verdict.as_str())
    };
    assert_eq!(verdict("s-free"), Some("unowned"));
    assert_eq!(verdict("s-held"), Some("ok"));
}

/// The header says what the cluster runs as, read from the lease table.
#[test]
fn the_snapshot_names_the_lease_mode_the_assigner_and_the_observer() {
    use leasehold_control::lease::Lease;
    use leasehold_control::schema::{ASSIGNER_LEASE, OBSERVER_LEASE, session_record};
    let now = 1_000_000;
    let held = |id: &str, owner: &str| {
        let mut lease = Lease::unowned(id);
        lease.owner_id = Some(owner.to_owned());
        lease.lease_expires_at = now + 10_000;
        lease.fence_token = 1;
        lease
    };
    let mut fixture = Fixture::new();
    let plain = LeaseTable::classify([Ok(held("s-1", "w1"))]);
    let snapshot = fixture.apply(readings(now, Ok(plain)));
    assert_eq!(
        snapshot.roles,
        [
            ("lease mode", "per-stream".to_owned()),
            ("discovery", "scan".to_owned()),
            ("observer", "none".to_owned())
        ]
    );
    let mut stream = held("s-1", "w1");
    stream.session_token = Some(1);
    let table = LeaseTable::classify([
        Ok(stream),
        Ok(held(&session_record("w1"), "w1")),
        Ok(held(ASSIGNER_LEASE, "w1")),
        Ok(held(OBSERVER_LEASE, "sidecar-2")),
    ]);
    let snapshot = fixture.apply(readings(now + 1_000, Ok(table)));
    assert_eq!(
        snapshot.roles,
        [
            ("lease mode", "session".to_owned()),
            ("discovery", "assigned (assigner w1)".to_owned()),
            ("observer", "sidecar-2".to_owned())
        ]
    );
}

/// The anomalies view keeps every sweep it saw, not only the latest report.
#[test]
fn each_sweep_is_kept_once_newest_first() {
    use leasehold_pool::read::{AnomalyView, PoolView, SweepReport};
    let report = |at: u64, found: u64| SweepReport {
        at,
        dry_run: false,
        marks: 3,
        tasks: 3,
        found: [(leasehold_telemetry::OrphanKind::StaleMark, found)].into(),
        resolved: [(leasehold_telemetry::OrphanKind::StaleMark, found)].into(),
        findings: Vec::new(),
        errors: Vec::new(),
        claims_requeued: 0,
        reserved: Vec::new(),
        held: None,
        unconfirmed: 0,
    };
    let mut fixture = Fixture::new();
    let mut sweeps_after = |now: i64, at: u64, found: u64| {
        let mut readings = readings(now, Ok(LeaseTable::default()));
        let anomalies = AnomalyView {
            report: Some(report(at, found)),
            unreadable: None,
        };
        readings.pool = Some(Ok((PoolView::default(), anomalies)));
        fixture.apply(readings).sweeps
    };
    sweeps_after(1_000, 900, 1);
    sweeps_after(2_000, 900, 1);
    let sweeps = sweeps_after(6_000, 5_900, 2);
    let seen: Vec<(i64, u64)> = sweeps.iter().map(|s| (s.at_ms, s.found)).collect();
    assert_eq!(seen, [(5_900, 2), (900, 1)]);
}
