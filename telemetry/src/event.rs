//! Typed telemetry events: what components report about themselves.
//!
//! Components never touch a metric registry: they emit one of these events, which
//! writes one log line here and reaches the sidecar, where one module maps each
//! event to its metric updates (docs/metrics.md). Emitting must never block or fail the
//! data path, so [`TelemetrySink::emit`] is synchronous and infallible.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_platform::logging::repeats;
use serde::{Deserialize, Serialize};

pub use crate::labels::*;

/// Something a component did that operators want counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TelemetryEvent {
    /// A conditional acquire succeeded.
    LeaseAcquired {
        /// Stream acquired.
        stream_id: String,
        /// New fence token.
        fence_token: u64,
        /// The record's expiry, unix ms.
        expires_at_ms: i64,
        /// Round trip of the acquire write.
        duration: Duration,
        /// How long the stream had no valid owner before this acquire, if known.
        takeover_gap: Option<Duration>,
        /// Who held it before, if anyone.
        previous_owner: Option<String>,
    },
    /// An acquire was refused because the stream is validly held by someone else.
    LeaseAcquireConflict {
        /// Stream asked for.
        stream_id: String,
        /// Current holder.
        holder: Option<String>,
        /// Current holder's token.
        holder_token: u64,
        /// Round trip of the acquire write.
        duration: Duration,
    },
    /// An acquire failed for another reason (throttling, outage, malformed record).
    LeaseAcquireFailed {
        /// Stream asked for.
        stream_id: String,
        /// What failed.
        error: String,
    },
    /// A renew was confirmed.
    LeaseRenewed {
        /// Stream held.
        stream_id: String,
        /// Token held.
        fence_token: u64,
        /// The record's new expiry, unix ms.
        expires_at_ms: i64,
        /// Round trip of the renew write.
        duration: Duration,
        /// How late the renew started versus its schedule.
        lateness: Duration,
    },
    /// A renew attempt failed with a retryable error; the lease is still trusted
    /// until the holder's deadline.
    LeaseRenewFailed {
        /// Stream held.
        stream_id: String,
        /// Token held.
        fence_token: u64,
        /// What failed.
        error: String,
    },
    /// The holder stopped trusting a lease and stopped its side effects.
    LeaseLost {
        /// Stream lost.
        stream_id: String,
        /// Token that is no longer valid.
        fence_token: u64,
        /// Why.
        reason: LossReason,
    },
    /// A lease was given back on purpose (drain, rebalance).
    LeaseReleased {
        /// Stream released.
        stream_id: String,
        /// Token released.
        fence_token: u64,
    },
    /// An upstream WebSocket subscription was established.
    UpstreamConnected {
        /// Stream subscribed.
        stream_id: String,
        /// First sequence asked for.
        from_seq: u64,
    },
    /// An upstream connection ended (any reason, including a deliberate close).
    UpstreamDisconnected {
        /// Stream whose connection closed.
        stream_id: String,
    },
    /// A connect waited for the worker's connect budget
    /// (`UPSTREAM_CONNECTS_PER_MINUTE`).
    UpstreamConnectThrottled {
        /// Stream connecting.
        stream_id: String,
        /// How long it waits.
        wait: Duration,
    },
    /// The worker's upstream connections changed: one opened or closed, or a
    /// held stream was subscribed to or left one
    /// (`leasehold_upstream_connections{worker}`,
    /// `leasehold_upstream_streams_per_connection`). Each report is the whole
    /// state, so the latest one stands.
    UpstreamConnections {
        /// Upstream connections the worker has open now.
        connections: u64,
        /// Held streams subscribed on those connections, all together.
        streams: u64,
        /// The oldest of them, at most [`crate::status::LISTED_CONNECTIONS`]
        /// (absent from older workers).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        open: Vec<crate::status::UpstreamConnection>,
    },
    /// A stream's subscription delivered its first frame
    /// (`leasehold_upstream_subscribe_seconds`), once per subscription.
    UpstreamSubscribed {
        /// Stream subscribed.
        stream_id: String,
        /// From the stream asking for its subscription (connect budget and
        /// subscribe pacing waits included) to its first frame.
        duration: Duration,
        /// The connection carrying it ([`crate::status::UpstreamConnection::id`];
        /// absent from older workers).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connection: Option<u64>,
    },
    /// The worker is reconnecting an upstream.
    UpstreamReconnect {
        /// Stream reconnecting.
        stream_id: String,
        /// `gap`, `closed`, `connect`, `protocol`, `retention_exceeded`, `sink`, …
        reason: String,
        /// What went wrong, in words (URLs redacted); older workers sent none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<String>,
    },
    /// An upstream frame was skipped (never a crash).
    UpstreamFrameSkipped {
        /// Stream the frame came on.
        stream_id: String,
        /// Why.
        reason: SkipReason,
    },
    /// Sequences that will never reach the sink: a real, unrecoverable gap in
    /// the data (a gap marker records it in the sink, except in `replay`
    /// mode, where only an upstream's retention can cause one).
    StreamGap {
        /// Stream with the gap.
        stream_id: String,
        /// First missing sequence.
        from_seq: u64,
        /// Last missing sequence.
        to_seq: u64,
        /// Why (older workers sent none: their only gap was retention).
        #[serde(default = "GapReason::retention")]
        reason: GapReason,
    },
    /// The upstream's sequence started over (a service restart): recorded in
    /// the sink as a reset entry at the start of a new epoch, whose fence
    /// token was raised for it. A reader's state built from the old sequence
    /// does not continue.
    StreamReset {
        /// Stream reset.
        stream_id: String,
        /// The last sequence before (`reset_from`).
        from_seq: u64,
        /// The first sequence after (`reset_to`).
        to_seq: u64,
        /// The new epoch's fence token.
        fence_token: u64,
    },
    /// A stream in `UPSTREAM_RESUME=snapshot` mode re-synchronised its order
    /// book: a snapshot entry was written to the sink, from which readers
    /// rebuild the book (`leasehold_stream_snapshots_total{reason}`).
    StreamSnapshot {
        /// Stream re-synchronised.
        stream_id: String,
        /// Why: the first sync after a subscribe, or missed diffs, a sequence
        /// reset or a checksum that disagreed.
        reason: SnapshotReason,
    },
    /// An order-book update's checksum disagreed with the book the worker
    /// kept (`leasehold_stream_checksum_failures_total`); a snapshot with
    /// reason `checksum` follows.
    StreamChecksumFailure {
        /// Stream whose book disagreed.
        stream_id: String,
    },
    /// A backfill waited: for a history request slot, for the history's
    /// `Retry-After`, or with the upstream paused at the hold bound.
    StreamBackfillWait {
        /// Stream backfilling.
        stream_id: String,
        /// What it waited for.
        reason: BackfillWait,
        /// How long.
        duration: Duration,
    },
    /// A backfill ended: how, after how many history pages and events.
    StreamBackfill {
        /// Stream backfilled.
        stream_id: String,
        /// How it ended.
        result: BackfillResult,
        /// History pages fetched (empty and failed ones included).
        pages: u32,
        /// Events the history supplied and the stream wrote.
        events: u64,
        /// From the first request to the end.
        duration: Duration,
    },
    /// A batch reached the sink.
    SinkWrite {
        /// Stream written.
        stream_id: String,
        /// Token the batch carried.
        fence_token: u64,
        /// Events appended.
        accepted: u64,
        /// Events dropped as already written (by event id).
        duplicate: u64,
        /// Events rejected because a newer token exists.
        fenced: u64,
        /// Round trip of the write.
        duration: Duration,
    },
    /// A sink call failed (the sink was unreachable or refused it).
    SinkWriteFailed {
        /// Stream written.
        stream_id: String,
        /// What failed.
        error: String,
        /// Events in the batch that was not written (0 when opening the stream
        /// failed), so `leasehold_sink_writes_total` counts events for every result.
        #[serde(default)]
        events: u64,
    },
    /// The sink refused `failures` consecutive calls for a stream
    /// (`SINK_MAX_FAILURES`): the worker released it so another may succeed.
    SinkGaveUp {
        /// Stream released.
        stream_id: String,
        /// Consecutive refused calls.
        failures: u32,
        /// The last refusal (the sink's message; no URL).
        error: String,
    },
    /// Opened again after a lost connection, the sink's stream ended below
    /// what it had confirmed (a failover to a replica without the tail): the
    /// lost range is refilled from the upstream, or recorded as a gap marker
    /// with reason `sink_lost`.
    SinkRegression {
        /// Stream.
        stream_id: String,
        /// First lost sequence (the sink's last + 1).
        from_seq: u64,
        /// Last lost sequence (what had been confirmed).
        to_seq: u64,
    },
    /// The sink's fence was above the token the store gave this holder (the
    /// lease record was re-created): the stored token was lifted past it.
    FenceLifted {
        /// Stream.
        stream_id: String,
        /// The token the store had.
        from: u64,
        /// The token stored now (the sink's fence + 1).
        to: u64,
    },
    /// A checkpoint write was attempted (alone or riding on a renew).
    CheckpointCommit {
        /// Stream.
        stream_id: String,
        /// Sequence written.
        checkpoint: u64,
        /// `committed`, `fenced` or `error`.
        result: CommitResult,
    },
    /// How far a held stream's confirmed checkpoint is behind what the upstream delivered.
    StreamLag {
        /// Stream.
        stream_id: String,
        /// Last sequence received minus last sequence confirmed.
        lag_events: u64,
        /// Age of the oldest received but unconfirmed event (0 when caught up).
        lag_seconds: f64,
        /// Seconds since the last event arrived (since the stream was opened,
        /// before the first): a silent upstream shows here.
        #[serde(default)]
        last_event_age_seconds: f64,
        /// Now minus the last event's own time, when the upstream names it.
        #[serde(default)]
        event_lag_seconds: Option<f64>,
    },
    /// Sent by a worker's telemetry shipper every second, so the sidecar can tell
    /// a silent worker from an idle one.
    WorkerHeartbeat {
        /// `stream-worker`, `broker-worker`, …
        component: String,
        /// The worker's `OWNER_ID` / worker id.
        owner_id: String,
        /// The worker process's resource use (absent where `/proc` is not).
        #[serde(default)]
        process: Option<crate::process::ProcessUsage>,
    },
    /// The worker's telemetry buffer overflowed: this many events were dropped
    /// (oldest first) since the last report.
    EventsDropped {
        /// Events dropped.
        count: u64,
    },
    /// The worker stopped working on a stream (released, lost, or drained);
    /// per-stream series may be dropped after this.
    StreamStopped {
        /// Stream.
        stream_id: String,
    },
    /// A pool worker handled a claim message (docs/metrics.md `leasehold_pool_claims_total`).
    PoolClaim {
        /// Worker that took the message.
        worker_id: String,
        /// User claimed, when readable.
        user_id: Option<String>,
        /// `claimed`, `invalid` or `error`.
        result: ClaimResult,
        /// From the claim's `enqueued_at` to the worker being active (wall clock).
        duration: Duration,
        /// Why it was not claimed (never a secret).
        reason: Option<String>,
    },
    /// A broker worker handled one request (`leasehold_broker_requests_total`).
    BrokerRequest {
        /// User served.
        user_id: String,
        /// Request id, when readable.
        request_id: Option<String>,
        /// `ok`, `error`, `invalid`, `duplicate`, `in_doubt` or `expired`.
        result: RequestResult,
        /// From BLPOP returning to the response being written.
        duration: Duration,
    },
    /// A broker connection was (re)opened after being invalidated or health-checked out.
    BrokerReconnect {
        /// User served.
        user_id: String,
        /// `broker_name/broker_type/simulation/account_id` of the connection.
        connection: String,
        /// `invalidated`, `health_check`, `reload_credentials`.
        reason: String,
    },
    /// A message could not be used and was moved to a `…:dead` list.
    MessageDeadLettered {
        /// List it came from.
        queue: String,
        /// Why (never a secret).
        reason: String,
    },
    /// A broker worker changed state (`leasehold_pool_workers{state}`).
    PoolWorkerState {
        /// Worker.
        worker_id: String,
        /// New state.
        state: PoolWorkerStateKind,
        /// User served, once claimed.
        user_id: Option<String>,
    },
    /// One reconcile pass of the pool manager.
    PoolReconciled {
        /// Idle pool workers counted.
        idle: u64,
        /// Target size.
        target: u64,
        /// Workers started.
        started: u64,
        /// Workers stopped.
        stopped: u64,
    },
    /// One maintenance sweep (`leasehold_orphans{kind}`, `leasehold_orphans_resolved_total{kind}`).
    OrphanSweep {
        /// Anomalies found, by kind.
        found: Vec<(OrphanKind, u64)>,
        /// Anomalies resolved, by kind (0 on a dry run).
        resolved: Vec<(OrphanKind, u64)>,
        /// Whether the sweep only reported.
        dry_run: bool,
        /// Whether the safety valve (`SWEEP_MAX_FRACTION`) held it: too much
        /// looked orphaned, nothing was acted on.
        held: bool,
    },
    /// Supervision gave a user whose worker died (pending requests or a
    /// "wants a worker" mark, no live worker) a new one
    /// (`leasehold_users_reserved_total{path}`).
    UserReserved {
        /// The user.
        user_id: String,
        /// Pool claim or cold start.
        path: ReservePath,
    },
}

/// `orphan_mark=1,stale_mark=0` for a log line.
fn kind_counts(counts: &[(OrphanKind, u64)]) -> String {
    counts
        .iter()
        .map(|(kind, count)| format!("{}={count}", kind.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

impl TelemetryEvent {
    /// Writes this event's one log line. Warnings that can repeat per frame or
    /// per attempt go through the process's [`repeats`] limiter (one line per
    /// stream and reason every 10 s, with a `suppressed` count).
    pub fn log(&self) {
        use TelemetryEvent::*;
        match self {
            LeaseAcquired {
                stream_id,
                fence_token,
                duration,
                takeover_gap,
                previous_owner,
                ..
            } => tracing::info!(
                stream_id,
                fence_token,
                duration_ms = millis(*duration),
                takeover_gap_ms = takeover_gap.map(millis),
                previous_owner = previous_owner.as_deref(),
                "lease acquired"
            ),
            LeaseAcquireConflict {
                stream_id,
                holder,
                holder_token,
                ..
            } => tracing::debug!(
                stream_id,
                holder = holder.as_deref(),
                holder_token,
                "lease held by another owner"
            ),
            LeaseAcquireFailed { stream_id, error } => {
                if let Some(suppressed) = repeats().admit(&format!("acquire:{stream_id}")) {
                    tracing::warn!(stream_id, error, suppressed, "lease acquire failed")
                }
            }
            LeaseRenewed {
                stream_id,
                fence_token,
                duration,
                lateness,
                ..
            } => tracing::trace!(
                stream_id,
                fence_token,
                duration_ms = millis(*duration),
                lateness_ms = millis(*lateness),
                "lease renewed"
            ),
            LeaseRenewFailed {
                stream_id,
                fence_token,
                error,
            } => {
                tracing::warn!(
                    stream_id,
                    fence_token,
                    error,
                    "lease renew failed, retrying"
                )
            }
            LeaseLost {
                stream_id,
                fence_token,
                reason,
            } => tracing::warn!(
                stream_id,
                fence_token,
                reason = reason.as_str(),
                "lease lost; side effects stopped"
            ),
            LeaseReleased {
                stream_id,
                fence_token,
            } => {
                tracing::info!(stream_id, fence_token, "lease released")
            }
            UpstreamConnected {
                stream_id,
                from_seq,
            } => {
                tracing::info!(stream_id, from_seq, "upstream subscribed")
            }
            UpstreamDisconnected { stream_id } => tracing::debug!(stream_id, "upstream closed"),
            UpstreamConnectThrottled { stream_id, wait } => {
                if let Some(suppressed) = repeats().admit("connect-throttled") {
                    tracing::info!(
                        stream_id,
                        wait_seconds = wait.as_secs_f64(),
                        suppressed,
                        "connect waits for UPSTREAM_CONNECTS_PER_MINUTE"
                    );
                }
            }
            UpstreamConnections {
                connections,
                streams,
                ..
            } => tracing::debug!(connections, streams, "upstream connections changed"),
            UpstreamSubscribed {
                stream_id,
                duration,
                connection,
            } => tracing::debug!(
                stream_id,
                seconds = duration.as_secs_f64(),
                connection,
                "upstream subscription delivered its first frame"
            ),
            UpstreamReconnect {
                stream_id,
                reason,
                cause,
            } => {
                if let Some(suppressed) =
                    repeats().admit(&format!("reconnect:{stream_id}:{reason}"))
                {
                    let cause = cause.as_deref().unwrap_or("");
                    tracing::warn!(
                        stream_id,
                        reason,
                        cause,
                        suppressed,
                        "upstream reconnecting"
                    )
                }
            }
            // Control frames (acknowledgements, heartbeats, ping replies) are
            // expected, so not worth a warning.
            UpstreamFrameSkipped {
                stream_id,
                reason: SkipReason::Control,
            } => tracing::trace!(stream_id, "upstream control frame skipped"),
            UpstreamFrameSkipped { stream_id, reason } => {
                let reason = reason.as_str();
                if let Some(suppressed) = repeats().admit(&format!("skip:{stream_id}:{reason}")) {
                    tracing::warn!(stream_id, reason, suppressed, "upstream frame skipped")
                }
            }
            StreamGap {
                stream_id,
                from_seq,
                to_seq,
                reason,
            } => tracing::error!(
                stream_id,
                from_seq,
                to_seq,
                reason = reason.as_str(),
                "these events will never reach the sink: data gap"
            ),
            StreamReset {
                stream_id,
                from_seq,
                to_seq,
                fence_token,
            } => tracing::warn!(
                stream_id,
                reset_from = from_seq,
                reset_to = to_seq,
                fence_token,
                "upstream sequence reset: a reset entry starts a new epoch in the sink"
            ),
            // The first sync after a subscribe is routine (once per
            // connection); any other is a book that had to be rebuilt.
            StreamSnapshot {
                stream_id,
                reason: SnapshotReason::Subscribe,
            } => tracing::debug!(
                stream_id,
                reason = SnapshotReason::Subscribe.as_str(),
                "order book synchronised from a snapshot"
            ),
            StreamSnapshot { stream_id, reason } => {
                let reason = reason.as_str();
                if let Some(suppressed) = repeats().admit(&format!("snapshot:{stream_id}:{reason}"))
                {
                    tracing::warn!(
                        stream_id,
                        reason,
                        suppressed,
                        "order book re-synchronised from a snapshot: readers rebuild it at the snapshot entry"
                    )
                }
            }
            StreamChecksumFailure { stream_id } => {
                if let Some(suppressed) = repeats().admit(&format!("checksum:{stream_id}")) {
                    tracing::warn!(
                        stream_id,
                        suppressed,
                        "order book checksum disagreed with the kept book: re-synchronising"
                    )
                }
            }
            StreamBackfillWait {
                stream_id,
                reason,
                duration,
            } => tracing::debug!(
                stream_id,
                reason = reason.as_str(),
                seconds = duration.as_secs_f64(),
                "backfill waited"
            ),
            StreamBackfill {
                stream_id,
                result,
                pages,
                events,
                duration,
            } => tracing::info!(
                stream_id,
                result = result.as_str(),
                pages,
                events,
                seconds = duration.as_secs_f64(),
                "backfill ended"
            ),
            SinkWrite {
                stream_id,
                fence_token,
                accepted,
                duplicate,
                fenced,
                duration,
            } => tracing::trace!(
                stream_id,
                fence_token,
                accepted,
                duplicate,
                fenced,
                duration_ms = millis(*duration),
                "sink write"
            ),
            SinkWriteFailed {
                stream_id, error, ..
            } => {
                if let Some(suppressed) = repeats().admit(&format!("sink:{stream_id}")) {
                    tracing::warn!(stream_id, error, suppressed, "sink write failed")
                }
            }
            FenceLifted {
                stream_id,
                from,
                to,
            } => tracing::warn!(
                stream_id,
                from,
                to,
                "the sink's fence was above the lease's token (lease record re-created?): token lifted past it"
            ),
            SinkRegression {
                stream_id,
                from_seq,
                to_seq,
            } => tracing::error!(
                stream_id,
                from_seq,
                to_seq,
                "the sink lost confirmed events (failover to a replica without them?): refilling or marking the range"
            ),
            SinkGaveUp {
                stream_id,
                failures,
                error,
            } => tracing::error!(
                stream_id,
                failures,
                error,
                "the sink keeps refusing writes: stream released for another worker to try"
            ),
            CheckpointCommit {
                stream_id,
                checkpoint,
                result,
            } => tracing::debug!(
                stream_id,
                checkpoint,
                result = result.as_str(),
                "checkpoint commit"
            ),
            StreamLag {
                stream_id,
                lag_events,
                lag_seconds,
                last_event_age_seconds,
                event_lag_seconds,
            } => {
                tracing::trace!(
                    stream_id,
                    lag_events,
                    lag_seconds,
                    last_event_age_seconds,
                    event_lag_seconds,
                    "stream lag"
                )
            }
            StreamStopped { stream_id } => tracing::info!(stream_id, "stream stopped"),
            WorkerHeartbeat { .. } => {}
            EventsDropped { count } => {
                tracing::warn!(count, "telemetry buffer full: oldest events dropped")
            }
            PoolClaim {
                worker_id,
                user_id,
                result,
                duration,
                reason,
            } => match result {
                ClaimResult::Claimed => tracing::info!(
                    worker_id,
                    user_id = user_id.as_deref(),
                    duration_ms = millis(*duration),
                    "pool worker claimed"
                ),
                _ => tracing::error!(
                    worker_id,
                    user_id = user_id.as_deref(),
                    result = result.as_str(),
                    reason = reason.as_deref(),
                    "claim not taken"
                ),
            },
            // Failed and in-doubt answers are what the broker alerts' runbooks
            // send operators to the logs for: visible at the default level.
            BrokerRequest {
                user_id,
                request_id,
                result:
                    result @ (RequestResult::Error | RequestResult::InDoubt | RequestResult::Timeout),
                duration,
            } => tracing::warn!(
                user_id,
                request_id = request_id.as_deref(),
                result = result.as_str(),
                duration_ms = millis(*duration),
                "broker request handled"
            ),
            BrokerRequest {
                user_id,
                request_id,
                result,
                duration,
            } => tracing::debug!(
                user_id,
                request_id = request_id.as_deref(),
                result = result.as_str(),
                duration_ms = millis(*duration),
                "broker request handled"
            ),
            BrokerReconnect {
                user_id,
                connection,
                reason,
            } => tracing::warn!(user_id, connection, reason, "broker connection reopened"),
            MessageDeadLettered { queue, reason } => {
                tracing::error!(
                    queue,
                    reason,
                    "invalid message moved to the dead-letter list"
                )
            }
            PoolWorkerState {
                worker_id,
                state,
                user_id,
            } => tracing::info!(
                worker_id,
                state = state.as_str(),
                user_id = user_id.as_deref(),
                "broker worker state"
            ),
            PoolReconciled {
                idle,
                target,
                started,
                stopped,
            } => tracing::info!(idle, target, started, stopped, "pool reconciled"),
            OrphanSweep {
                found,
                resolved,
                dry_run,
                held: false,
            } => tracing::info!(
                found = kind_counts(found),
                resolved = kind_counts(resolved),
                dry_run,
                "maintenance sweep"
            ),
            OrphanSweep {
                found,
                dry_run,
                held: true,
                ..
            } => tracing::error!(
                found = kind_counts(found),
                dry_run,
                "maintenance sweep held by its safety valve: too much looks orphaned, nothing acted on"
            ),
            UserReserved { user_id, path } => tracing::warn!(
                user_id,
                path = path.as_str(),
                "user without a live worker re-served"
            ),
        }
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Where events go. Implementations must return quickly and never block.
pub trait TelemetrySink: Send + Sync + 'static {
    /// Hands one event over.
    fn emit(&self, event: TelemetryEvent);
}

/// Logs every event and nothing else (until a sidecar transport is attached).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogSink;

impl TelemetrySink for LogSink {
    fn emit(&self, event: TelemetryEvent) {
        event.log();
    }
}

/// Keeps every event in memory; for tests and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct RecordingSink {
    events: Arc<Mutex<Vec<TelemetryEvent>>>,
}

impl RecordingSink {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the events recorded so far.
    pub fn take(&self) -> Vec<TelemetryEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A copy of the events recorded so far.
    pub fn snapshot(&self) -> Vec<TelemetryEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl TelemetrySink for RecordingSink {
    fn emit(&self, event: TelemetryEvent) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }
}
