//! The closed label sets of telemetry events: each enum is one metric label
//! (`reason`, `result`, `state`, `kind`) and spells its values once.

use serde::{Deserialize, Serialize};

/// Why a holder stopped trusting a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// The store refused a renew: someone else holds it, or the token is stale.
    RenewRejected,
    /// No renew was confirmed before the holder's own deadline.
    DeadlinePassed,
    /// A sink rejected a write because a newer fence token exists.
    Fenced,
}

impl LossReason {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [LossReason; 3] = [
        LossReason::RenewRejected,
        LossReason::DeadlinePassed,
        LossReason::Fenced,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::RenewRejected => "renew_rejected",
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::Fenced => "fenced",
        }
    }
}

/// Why a stream worker reconnected to its upstream
/// (`leasehold_websocket_reconnects_total{reason}`); the upstream's errors
/// name themselves with these (`UpstreamError::reason`, tested there).
pub const RECONNECT_REASONS: [&str; 7] = [
    "connect",
    "closed",
    "gap",
    "retention_exceeded",
    "rejected",
    "config",
    "idle",
];

/// Why an upstream frame was skipped instead of processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Larger than the configured frame limit.
    TooLarge,
    /// Not valid JSON (or a binary frame).
    NotJson,
    /// JSON without a usable sequence number or event id at the configured pointers.
    MissingField,
    /// A sequence number already delivered (the upstream replayed it).
    Duplicate,
    /// Not a data frame (`UPSTREAM_DATA_MATCH` matched none of it): a
    /// subscription acknowledgement, a heartbeat, a status or a ping reply.
    /// Counted, never warned about.
    Control,
    /// A sequence more than `UPSTREAM_MAX_JUMP` ahead that the frames after
    /// it did not confirm (a status frame's timestamp at the sequence
    /// pointer, say): never taken at its word.
    Jump,
}

impl SkipReason {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [SkipReason; 6] = [
        SkipReason::TooLarge,
        SkipReason::NotJson,
        SkipReason::MissingField,
        SkipReason::Duplicate,
        SkipReason::Control,
        SkipReason::Jump,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::TooLarge => "too_large",
            SkipReason::NotJson => "not_json",
            SkipReason::MissingField => "missing_field",
            SkipReason::Jump => "jump",
            SkipReason::Duplicate => "duplicate",
            SkipReason::Control => "control",
        }
    }
}

/// How a backfill ended (`leasehold_stream_backfills_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillResult {
    /// The history held the whole range: nothing is missing.
    Filled,
    /// Part of the range was recorded as a gap (the history no longer held
    /// it, or kept failing).
    Gap,
    /// The stream stopped (released, lost, drained) before the range closed;
    /// its next owner backfills from the sink's last sequence.
    Stopped,
}

impl BackfillResult {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [BackfillResult; 3] = [
        BackfillResult::Filled,
        BackfillResult::Gap,
        BackfillResult::Stopped,
    ];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillResult::Filled => "filled",
            BackfillResult::Gap => "gap",
            BackfillResult::Stopped => "stopped",
        }
    }
}

/// What a backfill waited for (`leasehold_stream_backfill_wait_seconds_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillWait {
    /// A history request slot: the worker's `BACKFILL_CONCURRENCY` were all
    /// in use by its other streams.
    Concurrency,
    /// The history's `Retry-After` (a 429 or 418), waited in full.
    RetryAfter,
    /// Reading the upstream paused: the live frames held behind the backfill
    /// reached `STREAM_HOLD_MAX_BYTES` (or the frame bound).
    Hold,
}

impl BackfillWait {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [BackfillWait; 3] = [
        BackfillWait::Concurrency,
        BackfillWait::RetryAfter,
        BackfillWait::Hold,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillWait::Concurrency => "concurrency",
            BackfillWait::RetryAfter => "retry_after",
            BackfillWait::Hold => "hold",
        }
    }
}

/// Why a range of sequences is missing from the sink
/// (`leasehold_stream_gaps_total{reason}`, a gap marker's `reason` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GapReason {
    /// A `live` upstream started past what was confirmed, or skipped inside
    /// a connection: it cannot replay, nothing was fetched.
    NoReplay,
    /// The upstream (replay) or its history (backfill) no longer holds the
    /// start of the range: it aged out.
    Retention,
    /// A backfill could not close the range: the history kept failing or
    /// ended before the range did.
    BackfillExhausted,
    /// The sink lost entries it had acknowledged (a Redis failover) and the
    /// upstream cannot refill them.
    SinkLost,
    /// An order book's checksum disagreed with the book the worker kept
    /// (`UPSTREAM_BOOK_CHECKSUM`): a diff was lost or garbled somewhere, so
    /// the book is re-synchronised from a snapshot whose entry carries this.
    Checksum,
    /// Not a gap marker: the upstream's sequence started over, recorded as
    /// a reset entry (`reason` = `reset`). Listed with the gaps because a
    /// reader's state from before does not continue either; never in
    /// [`GapReason::ALL`] (`leasehold_stream_resets_total` counts it).
    Reset,
}

impl GapReason {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [GapReason; 5] = [
        GapReason::NoReplay,
        GapReason::Retention,
        GapReason::BackfillExhausted,
        GapReason::SinkLost,
        GapReason::Checksum,
    ];

    /// Every reason a stream's lost-data list shows: the gap markers' and
    /// resets.
    pub const RECORDED: [GapReason; 6] = [
        GapReason::NoReplay,
        GapReason::Retention,
        GapReason::BackfillExhausted,
        GapReason::SinkLost,
        GapReason::Checksum,
        GapReason::Reset,
    ];

    /// The `reason` label value, as a gap marker's `reason` field spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::NoReplay => "no_replay",
            GapReason::Retention => "retention",
            GapReason::BackfillExhausted => "backfill_exhausted",
            GapReason::SinkLost => "sink_lost",
            GapReason::Checksum => "checksum",
            GapReason::Reset => "reset",
        }
    }

    /// [`GapReason::Retention`], the reason of a gap an older worker reported.
    pub fn retention() -> GapReason {
        GapReason::Retention
    }

    /// The reason a marker's `reason` field names, if it is one of these.
    pub fn parse(value: &str) -> Option<GapReason> {
        GapReason::ALL.into_iter().find(|r| r.as_str() == value)
    }
}

/// Why a stream in `UPSTREAM_RESUME=snapshot` mode re-synchronised its order
/// book from a new snapshot (`leasehold_stream_snapshots_total{reason}`): one
/// value per snapshot entry written to the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotReason {
    /// The first synchronisation after a subscribe (a connect or reconnect):
    /// expected, once per connection.
    Subscribe,
    /// Diffs were missed (a hole in the update sequence): the book cannot be
    /// carried forward, so it is rebuilt from a snapshot.
    Gap,
    /// The upstream's sequence started over (a service restart).
    Reset,
    /// The book's checksum disagreed with the book the worker kept
    /// (`UPSTREAM_BOOK_CHECKSUM`): a diff was lost or garbled.
    Checksum,
}

impl SnapshotReason {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [SnapshotReason; 4] = [
        SnapshotReason::Subscribe,
        SnapshotReason::Gap,
        SnapshotReason::Reset,
        SnapshotReason::Checksum,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotReason::Subscribe => "subscribe",
            SnapshotReason::Gap => "gap",
            SnapshotReason::Reset => "reset",
            SnapshotReason::Checksum => "checksum",
        }
    }
}

/// Outcome of a checkpoint write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitResult {
    /// Stored.
    Committed,
    /// Refused: the lease is no longer ours.
    Fenced,
    /// The store failed; retried later.
    Error,
}

impl CommitResult {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [CommitResult; 3] = [
        CommitResult::Committed,
        CommitResult::Fenced,
        CommitResult::Error,
    ];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CommitResult::Committed => "committed",
            CommitResult::Fenced => "fenced",
            CommitResult::Error => "error",
        }
    }
}

/// Outcome of a claim message (docs/metrics.md `result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimResult {
    /// The worker became the user's worker.
    Claimed,
    /// The message was malformed or its credentials did not decrypt.
    Invalid,
    /// The claim could not be completed (user already served, Redis failed).
    Error,
}

impl ClaimResult {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [ClaimResult; 3] = [
        ClaimResult::Claimed,
        ClaimResult::Invalid,
        ClaimResult::Error,
    ];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimResult::Claimed => "claimed",
            ClaimResult::Invalid => "invalid",
            ClaimResult::Error => "error",
        }
    }
}

/// Outcome of a broker request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestResult {
    /// Answered with `status: ok`.
    Ok,
    /// The broker failed; answered with `status: error`.
    Error,
    /// Malformed; dead-lettered (and answered when its id was readable).
    Invalid,
    /// A request id answered before: its stored response was written again;
    /// not executed again.
    Duplicate,
    /// An order whose outcome the broker could not confirm (a timeout or a
    /// dropped connection after sending it): it may or may not have executed,
    /// so it is looked up by its client order id, never resubmitted blindly.
    InDoubt,
    /// Its `expires_at` passed before it ran: answered `expired`, not executed.
    /// Kept apart from `error` because the broker did nothing wrong: it says
    /// the queue in front of the worker was too long.
    Expired,
    /// The broker did not answer the order within its timeout and, asked
    /// afterwards by client order id, held no such order: answered `timeout`,
    /// not executed. A broker failure (counted against the broker SLO).
    /// Timeouts that the lookup resolved count as `ok` or `in_doubt`.
    Timeout,
    /// The user's queue was over `USER_QUEUE_MAX`: answered `overloaded` at
    /// once, not executed. Like `expired`, a queue too long, not a broker error.
    Overloaded,
}

impl RequestResult {
    /// Every value, for counters that exist at 0 from the start.
    pub const ALL: [RequestResult; 8] = [
        RequestResult::Ok,
        RequestResult::Error,
        RequestResult::Invalid,
        RequestResult::Duplicate,
        RequestResult::InDoubt,
        RequestResult::Expired,
        RequestResult::Timeout,
        RequestResult::Overloaded,
    ];

    /// The `result` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestResult::Ok => "ok",
            RequestResult::Error => "error",
            RequestResult::Invalid => "invalid",
            RequestResult::Duplicate => "duplicate",
            RequestResult::InDoubt => "in_doubt",
            RequestResult::Expired => "expired",
            RequestResult::Timeout => "timeout",
            RequestResult::Overloaded => "overloaded",
        }
    }
}

/// States of a broker worker (`leasehold_pool_workers{state}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolWorkerStateKind {
    /// In the warm pool, waiting for a claim.
    Idle,
    /// Serving one user.
    Claimed,
    /// Exited (its marks are deleted).
    Stopped,
}

impl PoolWorkerStateKind {
    /// The `state` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolWorkerStateKind::Idle => "idle",
            PoolWorkerStateKind::Claimed => "claimed",
            PoolWorkerStateKind::Stopped => "stopped",
        }
    }
}

/// How supervision gave a user whose worker died a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservePath {
    /// A claim was pushed for an idle pool worker.
    PoolClaim,
    /// No idle pool worker: a worker was started for the user.
    ColdStart,
}

impl ReservePath {
    /// Every path, in label order.
    pub const ALL: [ReservePath; 2] = [ReservePath::PoolClaim, ReservePath::ColdStart];

    /// The `path` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservePath::PoolClaim => "pool_claim",
            ReservePath::ColdStart => "cold_start",
        }
    }
}

/// Anomalies the maintenance sweep finds (the original broker-pool specification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrphanKind {
    /// A mark without a running task.
    OrphanMark,
    /// A running task without a mark.
    OrphanTask,
    /// A mark that outlived its heartbeat (no TTL, or a heartbeat older than the TTL).
    StaleMark,
    /// Two tasks for one user.
    DuplicateWorker,
}

impl OrphanKind {
    /// Every kind, in label order.
    pub const ALL: [OrphanKind; 4] = [
        OrphanKind::OrphanMark,
        OrphanKind::OrphanTask,
        OrphanKind::StaleMark,
        OrphanKind::DuplicateWorker,
    ];

    /// The `kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanKind::OrphanMark => "orphan_mark",
            OrphanKind::OrphanTask => "orphan_task",
            OrphanKind::StaleMark => "stale_mark",
            OrphanKind::DuplicateWorker => "duplicate_worker",
        }
    }
}
