//! One event of every variant, and events carrying every closed label value,
//! for the sidecar's export and alert tests.

/// One event of every `TelemetryEvent` variant (sidecar, export and alert tests;
/// `sidecar/tests/it/alert_metrics.rs` checks the list stays exhaustive).
pub fn every_event() -> Vec<crate::TelemetryEvent> {
    use crate::TelemetryEvent::*;
    use crate::{
        ClaimResult, CommitResult, LossReason, OrphanKind, PoolWorkerStateKind, RequestResult,
        SkipReason,
    };
    let ms = std::time::Duration::from_millis;
    let s = || "btc-usd".to_owned();
    vec![
        LeaseAcquired {
            stream_id: s(),
            fence_token: 3,
            expires_at_ms: 1,
            duration: ms(4),
            takeover_gap: Some(ms(2500)),
            previous_owner: Some("w0".into()),
        },
        LeaseAcquireConflict {
            stream_id: "eth".into(),
            holder: Some("w2".into()),
            holder_token: 1,
            duration: ms(3),
        },
        LeaseAcquireFailed {
            stream_id: "eth".into(),
            error: "throttled".into(),
        },
        LeaseRenewed {
            stream_id: s(),
            fence_token: 3,
            expires_at_ms: 2,
            duration: ms(5),
            lateness: ms(1),
        },
        LeaseRenewFailed {
            stream_id: s(),
            fence_token: 3,
            error: "timeout".into(),
        },
        LeaseLost {
            stream_id: "old".into(),
            fence_token: 1,
            reason: LossReason::Fenced,
        },
        LeaseReleased {
            stream_id: "old2".into(),
            fence_token: 1,
        },
        UpstreamConnected {
            stream_id: s(),
            from_seq: 1,
        },
        UpstreamConnectThrottled {
            stream_id: s(),
            wait: ms(1200),
        },
        UpstreamConnections {
            connections: 2,
            streams: 7,
            open: vec![crate::status::UpstreamConnection {
                id: 3,
                opened_at_ms: 1_760_000_000_000,
                streams: 7,
                replacements: 1,
                subscribe_seconds: Some(0.35),
            }],
        },
        UpstreamSubscribed {
            stream_id: s(),
            duration: ms(350),
            connection: Some(3),
        },
        UpstreamReconnect {
            stream_id: s(),
            reason: "gap".into(),
            cause: Some("sequence gap: expected 5, got 9".into()),
        },
        UpstreamFrameSkipped {
            stream_id: s(),
            reason: SkipReason::NotJson,
        },
        StreamGap {
            stream_id: s(),
            from_seq: 5,
            to_seq: 9,
            reason: crate::GapReason::NoReplay,
        },
        StreamReset {
            stream_id: s(),
            from_seq: 60_108,
            to_seq: 1,
            fence_token: 8,
        },
        StreamSnapshot {
            stream_id: s(),
            reason: crate::SnapshotReason::Gap,
        },
        StreamChecksumFailure { stream_id: s() },
        StreamBackfillWait {
            stream_id: s(),
            reason: crate::BackfillWait::RetryAfter,
            duration: ms(7000),
        },
        StreamBackfill {
            stream_id: s(),
            result: crate::BackfillResult::Gap,
            pages: 3,
            events: 250,
            duration: ms(1500),
        },
        SinkWrite {
            stream_id: s(),
            fence_token: 3,
            accepted: 10,
            duplicate: 2,
            fenced: 0,
            duration: ms(2),
        },
        SinkWriteFailed {
            stream_id: s(),
            error: "down".into(),
            events: 3,
        },
        FenceLifted {
            stream_id: s(),
            from: 2,
            to: 41,
        },
        SinkRegression {
            stream_id: s(),
            from_seq: 7,
            to_seq: 10,
        },
        SinkGaveUp {
            stream_id: s(),
            failures: 10,
            error: "WRONGTYPE".into(),
        },
        CheckpointCommit {
            stream_id: s(),
            checkpoint: 10,
            result: CommitResult::Committed,
        },
        StreamLag {
            stream_id: s(),
            lag_events: 7,
            lag_seconds: 1.5,
            last_event_age_seconds: 3.5,
            event_lag_seconds: Some(1.5),
        },
        UpstreamDisconnected {
            stream_id: "old2".into(),
        },
        WorkerHeartbeat {
            component: "stream-worker".into(),
            owner_id: "w1".into(),
            process: Some(crate::process::ProcessUsage {
                resident_memory_bytes: 48 << 20,
                cpu_seconds: 12.5,
                open_fds: 40,
            }),
        },
        EventsDropped { count: 3 },
        StreamStopped {
            stream_id: "old2".into(),
        },
        PoolClaim {
            worker_id: "pw-1".into(),
            user_id: Some("u1".into()),
            result: ClaimResult::Claimed,
            duration: ms(2),
            reason: None,
        },
        BrokerRequest {
            user_id: "u1".into(),
            request_id: Some("r1".into()),
            result: RequestResult::Ok,
            duration: ms(1),
        },
        BrokerReconnect {
            user_id: "u1".into(),
            connection: "paper/stock/sim/A1".into(),
            reason: "health check failed".into(),
        },
        MessageDeadLettered {
            queue: "trading:user:u1:requests:dead".into(),
            reason: "not JSON".into(),
        },
        PoolWorkerState {
            worker_id: "pw-1".into(),
            state: PoolWorkerStateKind::Claimed,
            user_id: Some("u1".into()),
        },
        PoolReconciled {
            idle: 2,
            target: 3,
            started: 1,
            stopped: 0,
        },
        OrphanSweep {
            found: vec![(OrphanKind::OrphanMark, 1)],
            resolved: vec![(OrphanKind::OrphanMark, 1)],
            dry_run: false,
            held: false,
        },
        UserReserved {
            user_id: "u1".into(),
            path: crate::ReservePath::PoolClaim,
        },
    ]
}

/// Events that between them carry every value of every closed counter label.
pub fn every_label_value() -> Vec<crate::TelemetryEvent> {
    use crate::TelemetryEvent;
    use crate::{
        ClaimResult, CommitResult, LossReason, RECONNECT_REASONS, RequestResult, SkipReason,
    };
    use std::time::Duration;
    let stream = || "btc-usd".to_owned();
    let mut events = Vec::new();
    events.extend(LossReason::ALL.map(|reason| TelemetryEvent::LeaseLost {
        stream_id: stream(),
        fence_token: 1,
        reason,
    }));
    events.extend(
        CommitResult::ALL.map(|result| TelemetryEvent::CheckpointCommit {
            stream_id: stream(),
            checkpoint: 1,
            result,
        }),
    );
    events.extend(
        SkipReason::ALL.map(|reason| TelemetryEvent::UpstreamFrameSkipped {
            stream_id: stream(),
            reason,
        }),
    );
    events.extend(
        crate::GapReason::ALL.map(|reason| TelemetryEvent::StreamGap {
            stream_id: stream(),
            from_seq: 1,
            to_seq: 1,
            reason,
        }),
    );
    events.extend(
        crate::SnapshotReason::ALL.map(|reason| TelemetryEvent::StreamSnapshot {
            stream_id: stream(),
            reason,
        }),
    );
    events.extend(
        crate::BackfillWait::ALL.map(|reason| TelemetryEvent::StreamBackfillWait {
            stream_id: stream(),
            reason,
            duration: Duration::from_millis(10),
        }),
    );
    events.extend(
        crate::BackfillResult::ALL.map(|result| TelemetryEvent::StreamBackfill {
            stream_id: stream(),
            result,
            pages: 1,
            events: 1,
            duration: Duration::from_millis(10),
        }),
    );
    events.extend(
        RECONNECT_REASONS.map(|reason| TelemetryEvent::UpstreamReconnect {
            stream_id: stream(),
            reason: reason.to_owned(),
            cause: None,
        }),
    );
    events.extend(ClaimResult::ALL.map(|result| TelemetryEvent::PoolClaim {
        worker_id: "pw-1".into(),
        user_id: None,
        result,
        duration: Duration::from_millis(1),
        reason: None,
    }));
    events.extend(
        RequestResult::ALL.map(|result| TelemetryEvent::BrokerRequest {
            user_id: "u1".into(),
            request_id: None,
            result,
            duration: Duration::from_millis(1),
        }),
    );
    events.extend(
        [
            "pool:claims:dead",
            "trading:user:u1:requests:dead",
            "trading:user:u1:messages:dead",
            "elsewhere",
        ]
        .map(|queue| TelemetryEvent::MessageDeadLettered {
            queue: queue.into(),
            reason: "test".into(),
        }),
    );
    events.extend(
        crate::ReservePath::ALL.map(|path| TelemetryEvent::UserReserved {
            user_id: "u1".into(),
            path,
        }),
    );
    events
}
