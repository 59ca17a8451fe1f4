//! The metric contract (docs/metrics.md) and the one mapping from telemetry events to
//! metric updates, in the spirit of vector's `internal_events`: every event's
//! metric names and labels are spelled here and nowhere else.

use std::time::Duration;

use leasehold_telemetry::{
    BackfillResult, ClaimResult, CommitResult, GapReason, LossReason, OrphanKind,
    RECONNECT_REASONS, RequestResult, ReservePath, SkipReason, SnapshotReason, TelemetryEvent,
};
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use metrics_util::MetricKindMask;

/// `result` = acquired, conflict, error.
pub const LEASE_ACQUISITIONS: &str = "leasehold_lease_acquisitions_total";
/// Acquire round trip.
pub const LEASE_ACQUIRE_DURATION: &str = "leasehold_lease_acquire_duration_seconds";
/// `result` = renewed, lost, error.
pub const LEASE_RENEWALS: &str = "leasehold_lease_renewals_total";
/// Renew round trip.
pub const LEASE_RENEW_DURATION: &str = "leasehold_lease_renew_duration_seconds";
/// `reason` = renew_rejected, deadline_passed, fenced.
pub const LEASE_LOSSES: &str = "leasehold_lease_losses_total";
/// Deliberate releases.
pub const LEASE_RELEASES: &str = "leasehold_lease_releases_total";
/// Stream leases held by this worker.
pub const LEASES_HELD: &str = "leasehold_leases_held";
/// Time a stream had no owner before an acquire.
pub const TAKEOVER_GAP: &str = "leasehold_lease_takeover_gap_seconds";
/// `stream_id`: received minus persisted checkpoint.
pub const CHECKPOINT_LAG_EVENTS: &str = "leasehold_checkpoint_lag_events";
/// `stream_id`: age of the oldest unpersisted event.
pub const CHECKPOINT_LAG_SECONDS: &str = "leasehold_checkpoint_lag_seconds";
/// `stream_id`: seconds since the last event arrived for a held stream.
pub const STREAM_LAST_EVENT_AGE: &str = "leasehold_stream_last_event_age_seconds";
/// `stream_id`: now minus the last event's own time (`UPSTREAM_TS_POINTER`).
pub const STREAM_EVENT_LAG: &str = "leasehold_stream_event_lag_seconds";
/// `result` = committed, fenced, error.
pub const CHECKPOINT_COMMITS: &str = "leasehold_checkpoint_commits_total";
/// Open upstream connections.
pub const WEBSOCKET_CONNECTIONS: &str = "leasehold_websocket_connections";
/// `reason` = gap, closed, connect, retention_exceeded, rejected, config.
pub const WEBSOCKET_RECONNECTS: &str = "leasehold_websocket_reconnects_total";
/// (docs/metrics.md)
pub const UPSTREAM_CONNECTS_THROTTLED: &str = "leasehold_upstream_connects_throttled_total";
/// `worker`: upstream connections the worker has open (shared connections, §10.3).
pub const UPSTREAM_CONNECTIONS: &str = "leasehold_upstream_connections";
/// Mean held streams per open upstream connection of the worker (a gauge, docs/metrics.md).
pub const UPSTREAM_STREAMS_PER_CONNECTION: &str = "leasehold_upstream_streams_per_connection";
/// From a stream asking for its subscription to its first frame.
pub const UPSTREAM_SUBSCRIBE_DURATION: &str = "leasehold_upstream_subscribe_seconds";
/// `result` = accepted, duplicate, fenced (events), error (failed batches).
pub const SINK_WRITES: &str = "leasehold_sink_writes_total";
/// Streams released because the sink refused `SINK_MAX_FAILURES` calls in a row.
pub const SINK_GIVE_UPS: &str = "leasehold_sink_give_ups_total";
/// Streams whose sink, opened again after a lost connection, ended below what
/// it had confirmed (a failover lost its tail).
pub const SINK_REGRESSIONS: &str = "leasehold_sink_regressions_total";
/// Lease tokens lifted past a sink's higher fence (a re-created lease record).
pub const FENCE_REGRESSIONS: &str = "leasehold_fence_regressions_total";
/// `leasehold_worker_up`: 1 while the worker reports, 0 when silent or gone.
pub const WORKER_UP: &str = "leasehold_worker_up";
/// Events the worker dropped because its buffer was full.
pub const TELEMETRY_EVENTS_DROPPED: &str = "leasehold_telemetry_events_dropped_total";
/// `version`, `component`.
pub const BUILD_INFO: &str = "leasehold_build_info";
/// Extension: `reason` = too_large, not_json, missing_field, duplicate, control, jump.
pub const UPSTREAM_FRAMES_SKIPPED: &str = "leasehold_upstream_frames_skipped_total";
/// Extension: events the upstream could no longer deliver (retention exceeded).
pub const STREAM_GAP_EVENTS: &str = "leasehold_stream_gap_events_total";
/// `reason` = no_replay, retention, backfill_exhausted, sink_lost: gaps (not events).
pub const STREAM_GAPS: &str = "leasehold_stream_gaps_total";
/// Upstream sequence resets, each a reset entry in the sink.
pub const STREAM_RESETS: &str = "leasehold_stream_resets_total";
/// `reason` = subscribe, gap, reset, checksum: snapshot entries written
/// (order-book re-synchronisations, `UPSTREAM_RESUME=snapshot`).
pub const STREAM_SNAPSHOTS: &str = "leasehold_stream_snapshots_total";
/// Order-book updates whose checksum disagreed with the book the worker kept.
pub const STREAM_CHECKSUM_FAILURES: &str = "leasehold_stream_checksum_failures_total";
/// `result` = filled, gap, stopped: backfills that ended.
pub const STREAM_BACKFILLS: &str = "leasehold_stream_backfills_total";
/// Events backfills fetched from the history and wrote.
pub const STREAM_BACKFILLED_EVENTS: &str = "leasehold_stream_backfilled_events_total";
/// Extension: history pages backfills fetched (empty and failed ones included).
pub const STREAM_BACKFILL_PAGES: &str = "leasehold_stream_backfill_pages_total";
/// How long backfills took, first request to end.
pub const STREAM_BACKFILL_WAIT: &str = "leasehold_stream_backfill_wait_seconds";
/// (docs/metrics.md)
pub const STREAM_BACKFILL_DURATION: &str = "leasehold_stream_backfill_seconds";
/// Extension: sink write round trip.
pub const SINK_WRITE_DURATION: &str = "leasehold_sink_write_duration_seconds";
/// Extension: `reason` = preamble, frame, decode: connections the sidecar closed.
pub const TRANSPORT_ERRORS: &str = "leasehold_sidecar_transport_errors_total";
/// Extension: how late a renew started versus its schedule (a starved runtime
/// or a paused task shows here before a lease is lost).
pub const LEASE_RENEW_LATENESS: &str = "leasehold_lease_renew_lateness_seconds";
/// Extension: EMF lines the sidecar dropped because stdout did not keep up.
pub const EMF_LINES_DROPPED: &str = "leasehold_sidecar_emf_lines_dropped_total";
/// Extension: the worker process's resident memory (from its heartbeat).
pub const WORKER_RESIDENT_MEMORY: &str = "leasehold_worker_resident_memory_bytes";
/// Extension: the worker process's CPU time, whole seconds (from its heartbeats;
/// never decreases across worker restarts).
pub const WORKER_CPU_SECONDS: &str = "leasehold_worker_cpu_seconds_total";
/// Extension: the worker process's open file descriptors (from its heartbeat).
pub const WORKER_OPEN_FDS: &str = "leasehold_worker_open_fds";
/// Cluster gauge (observer only): `state` = owned, expired, unowned.
pub const STREAMS: &str = "leasehold_streams";
/// `result` = claimed, invalid, error.
pub const POOL_CLAIMS: &str = "leasehold_pool_claims_total";
/// Claim message to active worker.
pub const POOL_CLAIM_DURATION: &str = "leasehold_pool_claim_duration_seconds";
/// `result` = ok, error, invalid, duplicate, in_doubt, expired.
pub const BROKER_REQUESTS: &str = "leasehold_broker_requests_total";
/// Request handling inside the worker.
pub const BROKER_REQUEST_DURATION: &str = "leasehold_broker_request_duration_seconds";
/// Broker connections reopened.
pub const BROKER_RECONNECTS: &str = "leasehold_broker_reconnects_total";
/// Extension: `queue` = claims, requests, control: invalid messages dead-lettered.
pub const MESSAGES_DEAD_LETTERED: &str = "leasehold_messages_dead_lettered_total";
/// Cluster gauge (observer only): `kind` = orphan_mark, orphan_task, stale_mark, duplicate_worker.
pub const ORPHANS: &str = "leasehold_orphans";
/// `kind`: anomalies the maintenance sweep resolved.
pub const ORPHANS_RESOLVED: &str = "leasehold_orphans_resolved_total";
/// Extension, cluster gauge (observer only): 1 when the latest maintenance
/// sweep was held by its safety valve (`SWEEP_MAX_FRACTION`), else 0.
pub const SWEEP_HELD: &str = "leasehold_sweep_held";
/// Extension: `path` = pool_claim, cold_start: users whose worker died with
/// work pending that supervision gave a new worker.
pub const USERS_RESERVED: &str = "leasehold_users_reserved_total";
/// Cluster gauge (observer only): `state` = idle, claimed.
pub const POOL_WORKERS: &str = "leasehold_pool_workers";
/// Extension, cluster gauge (observer only): claim messages waiting in `pool:claims`.
pub const POOL_CLAIMS_PENDING: &str = "leasehold_pool_claims_pending";
/// Cluster gauge (observer only): seconds the oldest stream has been without a
/// valid owner, 0 when every stream is owned.
pub const STREAM_UNOWNED_AGE: &str = "leasehold_stream_unowned_age_seconds";
/// Observer only: lease-table scans that failed (the cluster gauges kept their last values).
pub const OBSERVER_SCAN_ERRORS: &str = "leasehold_observer_scan_errors_total";
/// Observer only: unix time of the last lease-table scan that succeeded.
pub const OBSERVER_LAST_SCAN: &str = "leasehold_observer_last_scan_timestamp_seconds";

/// Every metric name, in documentation order (docs/metrics.md is checked against it).
pub const ALL: &[&str] = &[
    LEASE_ACQUISITIONS,
    LEASE_ACQUIRE_DURATION,
    LEASE_RENEWALS,
    LEASE_RENEW_DURATION,
    LEASE_LOSSES,
    LEASE_RELEASES,
    LEASES_HELD,
    TAKEOVER_GAP,
    CHECKPOINT_LAG_EVENTS,
    CHECKPOINT_LAG_SECONDS,
    STREAM_LAST_EVENT_AGE,
    STREAM_EVENT_LAG,
    CHECKPOINT_COMMITS,
    WEBSOCKET_CONNECTIONS,
    WEBSOCKET_RECONNECTS,
    UPSTREAM_CONNECTS_THROTTLED,
    UPSTREAM_CONNECTIONS,
    UPSTREAM_STREAMS_PER_CONNECTION,
    UPSTREAM_SUBSCRIBE_DURATION,
    SINK_WRITES,
    SINK_GIVE_UPS,
    SINK_REGRESSIONS,
    FENCE_REGRESSIONS,
    WORKER_UP,
    TELEMETRY_EVENTS_DROPPED,
    BUILD_INFO,
    UPSTREAM_FRAMES_SKIPPED,
    STREAM_GAP_EVENTS,
    STREAM_GAPS,
    STREAM_RESETS,
    STREAM_SNAPSHOTS,
    STREAM_CHECKSUM_FAILURES,
    STREAM_BACKFILLS,
    STREAM_BACKFILLED_EVENTS,
    STREAM_BACKFILL_PAGES,
    STREAM_BACKFILL_WAIT,
    STREAM_BACKFILL_DURATION,
    SINK_WRITE_DURATION,
    TRANSPORT_ERRORS,
    LEASE_RENEW_LATENESS,
    EMF_LINES_DROPPED,
    WORKER_RESIDENT_MEMORY,
    WORKER_CPU_SECONDS,
    WORKER_OPEN_FDS,
    STREAMS,
    POOL_CLAIMS,
    POOL_CLAIM_DURATION,
    BROKER_REQUESTS,
    BROKER_REQUEST_DURATION,
    BROKER_RECONNECTS,
    MESSAGES_DEAD_LETTERED,
    ORPHANS,
    ORPHANS_RESOLVED,
    SWEEP_HELD,
    USERS_RESERVED,
    POOL_WORKERS,
    POOL_CLAIMS_PENDING,
    STREAM_UNOWNED_AGE,
    OBSERVER_SCAN_ERRORS,
    OBSERVER_LAST_SCAN,
];

/// Round trips to DynamoDB or Redis: milliseconds to seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Takeover gaps: a drain hands over in under a second, a crash takes about a lease.
const GAP_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
];
/// Pool claims: a warm claim takes well under a second, but with the pool empty
/// a claim waits for a cold start or the pool manager, minutes.
const CLAIM_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Backfills: one page takes a round trip, a long range many pages, and a
/// rate-limited history minutes.
const BACKFILL_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0,
];
/// Subscriptions: a subscribe on an open connection answers in a round trip
/// (tens of milliseconds), a new connection adds a TLS handshake, the
/// subscribe pacing (`UPSTREAM_SUBSCRIBES_PER_SECOND`) seconds, and the
/// connect budget (`UPSTREAM_CONNECTS_PER_MINUTE`, a rolling minute) up to a
/// minute.
const SUBSCRIBE_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Renew lateness: a healthy runtime is milliseconds late; seconds mean the
/// lease's safety margin is being eaten.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0,
];

/// Every histogram and its bucket boundaries (Prometheus and OTLP both use them;
/// CloudWatch gets distributions).
const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (LEASE_ACQUIRE_DURATION, LATENCY_BUCKETS),
    (LEASE_RENEW_DURATION, LATENCY_BUCKETS),
    (LEASE_RENEW_LATENESS, LATENESS_BUCKETS),
    (TAKEOVER_GAP, GAP_BUCKETS),
    (SINK_WRITE_DURATION, LATENCY_BUCKETS),
    (POOL_CLAIM_DURATION, CLAIM_BUCKETS),
    (BROKER_REQUEST_DURATION, LATENCY_BUCKETS),
    (STREAM_BACKFILL_DURATION, BACKFILL_BUCKETS),
    (STREAM_BACKFILL_WAIT, BACKFILL_BUCKETS),
    (UPSTREAM_SUBSCRIBE_DURATION, SUBSCRIBE_BUCKETS),
];

/// The bucket boundaries of a histogram (shared with the OTLP exporter).
pub fn buckets_for(name: &str) -> &'static [f64] {
    HISTOGRAM_BUCKETS
        .iter()
        .find(|(histogram, _)| *histogram == name)
        .map_or(LATENCY_BUCKETS, |(_, buckets)| buckets)
}

/// The gauges labelled `stream_id`: exported only while the worker holds the
/// stream and reports.
pub const PER_STREAM_GAUGES: [&str; 4] = [
    CHECKPOINT_LAG_EVENTS,
    CHECKPOINT_LAG_SECONDS,
    STREAM_LAST_EVENT_AGE,
    STREAM_EVENT_LAG,
];

/// The gauges labelled `worker`: exported for the worker behind this sidecar only.
pub const PER_WORKER_GAUGES: [&str; 1] = [UPSTREAM_CONNECTIONS];

/// The Prometheus text without the per-stream samples of streams not in
/// `held`. The exporter cannot remove a series (it only lets one idle out),
/// and a released or crashed owner's last figures ("last event 0.2 s ago")
/// would make a stream being taken over look healthy for the idle timeout.
pub fn drop_unheld_stream_series(text: String, held: &[String]) -> String {
    let held: std::collections::HashSet<String> = held
        .iter()
        .map(|stream| escape_label_value(stream))
        .collect();
    retain_labelled(text, &PER_STREAM_GAUGES, "stream_id", |stream| {
        held.contains(stream)
    })
}

/// The Prometheus text without the `worker` samples of any worker but
/// `worker` (all of them for `None`): a worker that left (a new `OWNER_ID`
/// behind this sidecar) would otherwise be counted with its successor until
/// its series idles out.
pub fn drop_other_worker_series(text: String, worker: Option<&str>) -> String {
    let worker = worker.map(escape_label_value);
    retain_labelled(text, &PER_WORKER_GAUGES, "worker", |value| {
        worker.as_deref() == Some(value)
    })
}

/// The text without the samples of `names` whose `label` value (as written,
/// escaped) `keep` refuses or that have no such label.
fn retain_labelled(
    text: String,
    names: &[&str],
    label: &str,
    keep: impl Fn(&str) -> bool,
) -> String {
    let kept_line = |line: &str| {
        let Some((name, rest)) = line.split_once('{') else {
            return true;
        };
        if !names.contains(&name) {
            return true;
        }
        labelled(rest, label).is_some_and(&keep)
    };
    if text.lines().all(kept_line) {
        return text;
    }
    let mut kept = String::with_capacity(text.len());
    for line in text.lines().filter(|line| kept_line(line)) {
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// A label's value as written (escaped) in a sample's labels (the text after
/// `{`). Label names are unquoted and values quoted, so a name starts the
/// block or follows a `,`.
fn labelled<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    let prefix = format!("{label}=\"");
    let start = if labels.starts_with(&prefix) {
        prefix.len()
    } else {
        labels.find(&format!(",{prefix}"))? + 1 + prefix.len()
    };
    let value = &labels[start..];
    let mut escaped = false;
    for (at, c) in value.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(&value[..at]),
            _ => escaped = false,
        }
    }
    None
}

/// A label value as the text format writes it.
fn escape_label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Builds the recorder for one sidecar, with the contract's buckets and the
/// idle timeout that makes per-stream series disappear after a release.
pub fn recorder(stream_series_idle: Duration) -> PrometheusRecorder {
    HISTOGRAM_BUCKETS
        .iter()
        .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full((*name).into()), buckets)
        })
        .expect("bucket lists are non-empty")
        // Only gauges idle out; the sidecar re-sets its own gauges on every upkeep,
        // so only per-stream lag series (no longer updated) disappear.
        .idle_timeout(MetricKindMask::GAUGE, Some(stream_series_idle))
        .build_recorder()
}

/// Registers HELP text so the exposition is self-describing (`promtool check metrics`).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(LEASE_ACQUISITIONS, "Lease acquire attempts by result.");
    describe_histogram!(
        LEASE_ACQUIRE_DURATION,
        Unit::Seconds,
        "Round trip of lease acquire writes."
    );
    describe_counter!(LEASE_RENEWALS, "Lease renew outcomes by result.");
    describe_histogram!(
        LEASE_RENEW_DURATION,
        Unit::Seconds,
        "Round trip of lease renew writes."
    );
    describe_counter!(
        LEASE_LOSSES,
        "Leases the worker stopped trusting, by reason."
    );
    describe_counter!(
        LEASE_RELEASES,
        "Leases released on purpose (drain, rebalance)."
    );
    describe_gauge!(LEASES_HELD, "Stream leases held by this worker.");
    describe_histogram!(
        TAKEOVER_GAP,
        Unit::Seconds,
        "Time a stream had no valid owner before this acquire."
    );
    describe_gauge!(
        CHECKPOINT_LAG_EVENTS,
        "Events received but not yet persisted as the checkpoint."
    );
    describe_gauge!(
        CHECKPOINT_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest event not yet persisted as the checkpoint."
    );
    describe_gauge!(
        STREAM_EVENT_LAG,
        Unit::Seconds,
        "Now minus the last event's own time, for upstreams that name it."
    );
    describe_gauge!(
        STREAM_LAST_EVENT_AGE,
        Unit::Seconds,
        "Seconds since the last event arrived for a held stream."
    );
    describe_counter!(CHECKPOINT_COMMITS, "Checkpoint writes by result.");
    describe_gauge!(
        WEBSOCKET_CONNECTIONS,
        "Open upstream WebSocket connections."
    );
    describe_counter!(WEBSOCKET_RECONNECTS, "Upstream reconnects by reason.");
    describe_counter!(
        UPSTREAM_CONNECTS_THROTTLED,
        "Upstream connects that waited for the worker's UPSTREAM_CONNECTS_PER_MINUTE budget."
    );
    describe_gauge!(
        UPSTREAM_CONNECTIONS,
        "Upstream connections the worker has open now (0 while it is down), labelled with its OWNER_ID."
    );
    describe_gauge!(
        UPSTREAM_STREAMS_PER_CONNECTION,
        "Mean held streams per open upstream connection of the worker (0 with none open)."
    );
    describe_histogram!(
        UPSTREAM_SUBSCRIBE_DURATION,
        Unit::Seconds,
        "From a stream asking for its upstream subscription to its first frame (connect budget and subscribe pacing waits included)."
    );
    describe_counter!(
        SINK_WRITES,
        "Sink outcomes: events accepted, duplicate or fenced; failed batches as error."
    );
    describe_counter!(
        FENCE_REGRESSIONS,
        "Lease tokens lifted past a sink's higher fence (the lease record was re-created)."
    );
    describe_counter!(
        SINK_REGRESSIONS,
        "Sink streams found behind what they had confirmed when opened again after a lost connection."
    );
    describe_counter!(
        SINK_GIVE_UPS,
        "Streams released because the sink refused SINK_MAX_FAILURES consecutive calls."
    );
    describe_gauge!(
        WORKER_UP,
        "1 while the worker reports to its sidecar, 0 when silent or disconnected."
    );
    describe_counter!(
        TELEMETRY_EVENTS_DROPPED,
        "Telemetry events the worker dropped because its buffer was full."
    );
    describe_gauge!(BUILD_INFO, "Build information; always 1.");
    describe_counter!(
        UPSTREAM_FRAMES_SKIPPED,
        "Upstream frames skipped, by reason."
    );
    describe_counter!(
        STREAM_GAP_EVENTS,
        "Events that will never reach the sink (every gap reason)."
    );
    describe_counter!(
        STREAM_GAPS,
        "Gaps in a stream's data (each one gap marker in the sink), by reason."
    );
    describe_counter!(
        STREAM_RESETS,
        "Upstream sequence resets (a restarted exchange), each a reset entry starting a new epoch in the sink."
    );
    describe_counter!(
        STREAM_SNAPSHOTS,
        "Order-book snapshot entries written (re-synchronisations), by reason (subscribe, gap, reset, checksum)."
    );
    describe_counter!(
        STREAM_CHECKSUM_FAILURES,
        "Order-book updates whose checksum disagreed with the book the worker kept."
    );
    describe_counter!(
        STREAM_BACKFILLS,
        "Backfills that ended, by result (filled, gap: part of the range recorded as a gap, stopped: the stream stopped first)."
    );
    describe_counter!(
        STREAM_BACKFILLED_EVENTS,
        "Events backfills fetched from the history and wrote."
    );
    describe_counter!(
        STREAM_BACKFILL_PAGES,
        "History pages backfills fetched (empty and failed ones included)."
    );
    describe_histogram!(
        STREAM_BACKFILL_WAIT,
        Unit::Seconds,
        "Waits of backfills, by reason (concurrency: a history request slot; retry_after: the history's Retry-After; hold: the upstream paused at STREAM_HOLD_MAX_BYTES)."
    );
    describe_histogram!(
        STREAM_BACKFILL_DURATION,
        Unit::Seconds,
        "How long backfills took, from the first history request to the end."
    );
    describe_histogram!(
        SINK_WRITE_DURATION,
        Unit::Seconds,
        "Round trip of sink batch writes."
    );
    describe_counter!(
        TRANSPORT_ERRORS,
        "Worker connections the sidecar closed, by reason."
    );
    describe_histogram!(
        LEASE_RENEW_LATENESS,
        Unit::Seconds,
        "How late lease renews started versus their schedule."
    );
    describe_counter!(
        EMF_LINES_DROPPED,
        "EMF lines dropped because stdout did not keep up."
    );
    describe_gauge!(
        WORKER_RESIDENT_MEMORY,
        Unit::Bytes,
        "Resident memory of the worker process."
    );
    describe_counter!(
        WORKER_CPU_SECONDS,
        Unit::Seconds,
        "CPU time of the worker process (user + system, whole seconds)."
    );
    describe_gauge!(
        WORKER_OPEN_FDS,
        "Open file descriptors of the worker process."
    );
    describe_counter!(POOL_CLAIMS, "Pool claims handled by result.");
    describe_counter!(
        USERS_RESERVED,
        "Users without a live worker and with work pending given a new worker, by path."
    );
    describe_histogram!(
        POOL_CLAIM_DURATION,
        Unit::Seconds,
        "Claim message enqueued to worker active."
    );
    describe_counter!(BROKER_REQUESTS, "Broker requests by result.");
    describe_histogram!(
        BROKER_REQUEST_DURATION,
        Unit::Seconds,
        "Broker request handling inside the worker."
    );
    describe_counter!(BROKER_RECONNECTS, "Broker connections reopened.");
    describe_counter!(
        MESSAGES_DEAD_LETTERED,
        "Invalid messages moved to a dead-letter list, by queue."
    );
    describe_counter!(
        ORPHANS_RESOLVED,
        "Anomalies the maintenance sweep resolved, by kind."
    );
}

/// The cluster gauges: only the observer publishes them.
pub const CLUSTER: &[&str] = &[
    STREAMS,
    ORPHANS,
    SWEEP_HELD,
    POOL_WORKERS,
    POOL_CLAIMS_PENDING,
    STREAM_UNOWNED_AGE,
    OBSERVER_LAST_SCAN,
];

/// Registers the cluster gauges' HELP text (observer recorder).
pub fn describe_cluster() {
    metrics::describe_gauge!(
        STREAMS,
        "Streams in the lease table by state (published by the observer sidecar only)."
    );
    metrics::describe_gauge!(
        ORPHANS,
        "Anomalies in the latest maintenance report, by kind (observer only)."
    );
    metrics::describe_gauge!(
        SWEEP_HELD,
        "1 when the latest maintenance sweep was held by its safety valve (observer only)."
    );
    metrics::describe_gauge!(
        POOL_WORKERS,
        "Broker workers by state, from Redis heartbeat marks (observer only)."
    );
    metrics::describe_gauge!(
        POOL_CLAIMS_PENDING,
        "Claim messages waiting in pool:claims (observer only)."
    );
    metrics::describe_gauge!(
        STREAM_UNOWNED_AGE,
        metrics::Unit::Seconds,
        "Seconds the oldest stream has been without a valid owner, 0 when all are owned (observer only)."
    );
    metrics::describe_counter!(
        OBSERVER_SCAN_ERRORS,
        "Lease-table scans of the observer that failed (observer only)."
    );
    metrics::describe_gauge!(
        OBSERVER_LAST_SCAN,
        metrics::Unit::Seconds,
        "Unix time of the observer's last successful lease-table scan (observer only)."
    );
    // A closed-label counter: on /metrics at 0 from the moment this sidecar observes.
    metrics::counter!(OBSERVER_SCAN_ERRORS).absolute(0);
}

/// The bounded `queue` label for a dead-letter list key (keys hold user ids).
fn queue_kind(queue: &str) -> &'static str {
    if queue.starts_with(leasehold_pool::keys::POOL_CLAIMS) {
        "claims"
    } else if queue.contains(":requests") {
        "requests"
    } else if queue.contains(":messages") {
        "control"
    } else {
        "other"
    }
}

/// Applies one event's metric updates (to the recorder in scope).
pub fn record(event: &TelemetryEvent) {
    use TelemetryEvent::*;
    match event {
        LeaseAcquired {
            duration,
            takeover_gap,
            ..
        } => {
            counter!(LEASE_ACQUISITIONS, "result" => "acquired").increment(1);
            histogram!(LEASE_ACQUIRE_DURATION).record(duration.as_secs_f64());
            if let Some(gap) = takeover_gap {
                histogram!(TAKEOVER_GAP).record(gap.as_secs_f64());
            }
        }
        LeaseAcquireConflict { duration, .. } => {
            counter!(LEASE_ACQUISITIONS, "result" => "conflict").increment(1);
            histogram!(LEASE_ACQUIRE_DURATION).record(duration.as_secs_f64());
        }
        LeaseAcquireFailed { .. } => counter!(LEASE_ACQUISITIONS, "result" => "error").increment(1),
        LeaseRenewed {
            duration, lateness, ..
        } => {
            counter!(LEASE_RENEWALS, "result" => "renewed").increment(1);
            histogram!(LEASE_RENEW_DURATION).record(duration.as_secs_f64());
            histogram!(LEASE_RENEW_LATENESS).record(lateness.as_secs_f64());
        }
        LeaseRenewFailed { .. } => counter!(LEASE_RENEWALS, "result" => "error").increment(1),
        LeaseLost { reason, .. } => {
            if *reason == LossReason::RenewRejected {
                counter!(LEASE_RENEWALS, "result" => "lost").increment(1);
            }
            counter!(LEASE_LOSSES, "reason" => reason.as_str()).increment(1);
        }
        LeaseReleased { .. } => counter!(LEASE_RELEASES).increment(1),
        CheckpointCommit { result, .. } => {
            counter!(CHECKPOINT_COMMITS, "result" => result.as_str()).increment(1)
        }
        StreamLag {
            stream_id,
            lag_events,
            lag_seconds,
            last_event_age_seconds,
            event_lag_seconds,
        } => {
            gauge!(CHECKPOINT_LAG_EVENTS, "stream_id" => stream_id.clone()).set(*lag_events as f64);
            gauge!(CHECKPOINT_LAG_SECONDS, "stream_id" => stream_id.clone()).set(*lag_seconds);
            gauge!(STREAM_LAST_EVENT_AGE, "stream_id" => stream_id.clone())
                .set(*last_event_age_seconds);
            if let Some(lag) = event_lag_seconds {
                gauge!(STREAM_EVENT_LAG, "stream_id" => stream_id.clone()).set(*lag);
            }
        }
        UpstreamReconnect { reason, .. } => {
            counter!(WEBSOCKET_RECONNECTS, "reason" => reason.clone()).increment(1)
        }
        UpstreamFrameSkipped { reason, .. } => {
            counter!(UPSTREAM_FRAMES_SKIPPED, "reason" => reason.as_str()).increment(1)
        }
        StreamGap {
            from_seq,
            to_seq,
            reason,
            ..
        } => {
            counter!(STREAM_GAP_EVENTS).increment(to_seq.saturating_sub(*from_seq) + 1);
            counter!(STREAM_GAPS, "reason" => reason.as_str()).increment(1);
        }
        StreamReset { .. } => counter!(STREAM_RESETS).increment(1),
        StreamSnapshot { reason, .. } => {
            counter!(STREAM_SNAPSHOTS, "reason" => reason.as_str()).increment(1)
        }
        StreamChecksumFailure { .. } => counter!(STREAM_CHECKSUM_FAILURES).increment(1),
        StreamBackfillWait {
            reason, duration, ..
        } => histogram!(STREAM_BACKFILL_WAIT, "reason" => reason.as_str())
            .record(duration.as_secs_f64()),
        StreamBackfill {
            result,
            pages,
            events,
            duration,
            ..
        } => {
            counter!(STREAM_BACKFILLS, "result" => result.as_str()).increment(1);
            counter!(STREAM_BACKFILLED_EVENTS).increment(*events);
            counter!(STREAM_BACKFILL_PAGES).increment(u64::from(*pages));
            histogram!(STREAM_BACKFILL_DURATION).record(duration.as_secs_f64());
        }
        SinkWrite {
            accepted,
            duplicate,
            fenced,
            duration,
            ..
        } => {
            counter!(SINK_WRITES, "result" => "accepted").increment(*accepted);
            counter!(SINK_WRITES, "result" => "duplicate").increment(*duplicate);
            counter!(SINK_WRITES, "result" => "fenced").increment(*fenced);
            histogram!(SINK_WRITE_DURATION).record(duration.as_secs_f64());
        }
        SinkWriteFailed { events, .. } => {
            counter!(SINK_WRITES, "result" => "error").increment(*events)
        }
        SinkGaveUp { .. } => counter!(SINK_GIVE_UPS).increment(1),
        UpstreamConnectThrottled { .. } => counter!(UPSTREAM_CONNECTS_THROTTLED).increment(1),
        UpstreamSubscribed { duration, .. } => {
            histogram!(UPSTREAM_SUBSCRIBE_DURATION).record(duration.as_secs_f64())
        }
        SinkRegression { .. } => counter!(SINK_REGRESSIONS).increment(1),
        FenceLifted { .. } => counter!(FENCE_REGRESSIONS).increment(1),
        EventsDropped { count } => counter!(TELEMETRY_EVENTS_DROPPED).increment(*count),
        PoolClaim {
            result, duration, ..
        } => {
            counter!(POOL_CLAIMS, "result" => result.as_str()).increment(1);
            if *result == ClaimResult::Claimed {
                histogram!(POOL_CLAIM_DURATION).record(duration.as_secs_f64());
            }
        }
        BrokerRequest {
            result, duration, ..
        } => {
            counter!(BROKER_REQUESTS, "result" => result.as_str()).increment(1);
            histogram!(BROKER_REQUEST_DURATION).record(duration.as_secs_f64());
        }
        BrokerReconnect { .. } => counter!(BROKER_RECONNECTS).increment(1),
        MessageDeadLettered { queue, .. } => {
            counter!(MESSAGES_DEAD_LETTERED, "queue" => queue_kind(queue)).increment(1)
        }
        OrphanSweep {
            resolved, dry_run, ..
        } => {
            if !dry_run {
                for (kind, count) in resolved {
                    counter!(ORPHANS_RESOLVED, "kind" => kind.as_str()).increment(*count);
                }
            }
        }
        UserReserved { path, .. } => counter!(USERS_RESERVED, "path" => path.as_str()).increment(1),
        // The cluster-wide pool and orphan gauges come from the observer (Redis),
        // so every sidecar reports the same numbers and only one publishes them.
        PoolWorkerState { .. } | PoolReconciled { .. } => {}
        // State-only events: the view turns them into gauges (connections, leases
        // held, worker up, upstream connections: those need the worker's id
        // from its heartbeat) on every upkeep.
        WorkerHeartbeat {
            process: Some(usage),
            ..
        } => {
            // CPU time needs the previous heartbeat: the sidecar state adds it
            // (`worker_cpu`).
            gauge!(WORKER_RESIDENT_MEMORY).set(usage.resident_memory_bytes as f64);
            gauge!(WORKER_OPEN_FDS).set(usage.open_fds as f64);
        }
        UpstreamConnected { .. }
        | UpstreamDisconnected { .. }
        | UpstreamConnections { .. }
        | WorkerHeartbeat { process: None, .. }
        | StreamStopped { .. } => {}
    }
}

/// Registers every counter with a closed label set at 0, on `/metrics` from the
/// sidecar's start: `increase()` then sees a task's first event (a series that
/// appears at 1 has no increase), so the alert rules need no `unless … offset`
/// workaround that re-fires lifetime values after a Prometheus restart.
/// Prometheus only: CloudWatch and OTLP get a counter once it moves (zero
/// deltas would be billed as datums every interval, and the alarms treat
/// missing data as not breaching).
pub fn zero_counters() {
    // (counter, its label, every value the label takes)
    let labelled: [(&'static str, &'static str, &[&'static str]); 16] = [
        (
            LEASE_ACQUISITIONS,
            "result",
            &["acquired", "conflict", "error"],
        ),
        (LEASE_RENEWALS, "result", &["renewed", "error", "lost"]),
        (
            LEASE_LOSSES,
            "reason",
            &LossReason::ALL.map(LossReason::as_str),
        ),
        (
            CHECKPOINT_COMMITS,
            "result",
            &CommitResult::ALL.map(CommitResult::as_str),
        ),
        (
            UPSTREAM_FRAMES_SKIPPED,
            "reason",
            &SkipReason::ALL.map(SkipReason::as_str),
        ),
        (
            SINK_WRITES,
            "result",
            &["accepted", "duplicate", "fenced", "error"],
        ),
        (
            POOL_CLAIMS,
            "result",
            &ClaimResult::ALL.map(ClaimResult::as_str),
        ),
        (
            BROKER_REQUESTS,
            "result",
            &RequestResult::ALL.map(RequestResult::as_str),
        ),
        (
            MESSAGES_DEAD_LETTERED,
            "queue",
            &["claims", "requests", "control", "other"],
        ),
        (
            ORPHANS_RESOLVED,
            "kind",
            &OrphanKind::ALL.map(OrphanKind::as_str),
        ),
        (
            USERS_RESERVED,
            "path",
            &ReservePath::ALL.map(ReservePath::as_str),
        ),
        (
            TRANSPORT_ERRORS,
            "reason",
            &TransportError::ALL.map(TransportError::as_str),
        ),
        (
            STREAM_GAPS,
            "reason",
            &GapReason::ALL.map(GapReason::as_str),
        ),
        (
            STREAM_SNAPSHOTS,
            "reason",
            &SnapshotReason::ALL.map(SnapshotReason::as_str),
        ),
        (
            STREAM_BACKFILLS,
            "result",
            &BackfillResult::ALL.map(BackfillResult::as_str),
        ),
        (WEBSOCKET_RECONNECTS, "reason", &RECONNECT_REASONS),
    ];
    for (name, label, values) in labelled {
        for value in values {
            counter!(name, label => *value).absolute(0);
        }
    }
    for name in [
        LEASE_RELEASES,
        UPSTREAM_CONNECTS_THROTTLED,
        STREAM_GAP_EVENTS,
        STREAM_RESETS,
        STREAM_CHECKSUM_FAILURES,
        STREAM_BACKFILLED_EVENTS,
        STREAM_BACKFILL_PAGES,
        SINK_GIVE_UPS,
        SINK_REGRESSIONS,
        FENCE_REGRESSIONS,
        TELEMETRY_EVENTS_DROPPED,
        BROKER_RECONNECTS,
        EMF_LINES_DROPPED,
        WORKER_CPU_SECONDS,
    ] {
        counter!(name).absolute(0);
    }
}

/// Why the sidecar closed a worker connection (`leasehold_sidecar_transport_errors_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    /// The peer sent no valid preamble (wrong version, or not a worker).
    Preamble,
    /// A frame could not be read (too large, cut short).
    Frame,
    /// A frame did not decode to a telemetry event.
    Decode,
}

impl TransportError {
    /// Every value, for the counter at 0 from the start.
    pub const ALL: [TransportError; 3] = [
        TransportError::Preamble,
        TransportError::Frame,
        TransportError::Decode,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportError::Preamble => "preamble",
            TransportError::Frame => "frame",
            TransportError::Decode => "decode",
        }
    }
}

/// Counts a connection the sidecar closed.
pub fn transport_error(reason: TransportError) {
    counter!(TRANSPORT_ERRORS, "reason" => reason.as_str()).increment(1);
}

/// Sets the upstream connection gauges from the worker's latest report (the
/// view's [`crate::view::WorkerView::upstream_connections`]).
pub fn set_upstream_gauges(upstream: &crate::view::UpstreamConnections) {
    gauge!(UPSTREAM_CONNECTIONS, "worker" => upstream.worker.clone())
        .set(upstream.connections as f64);
    gauge!(UPSTREAM_STREAMS_PER_CONNECTION).set(upstream.streams_per_connection);
}

/// Sets the gauges the sidecar owns (re-set on every upkeep so they never idle out).
pub fn set_worker_gauges(up: bool, leases_held: usize, connections: usize, component: &str) {
    gauge!(WORKER_UP).set(if up { 1.0 } else { 0.0 });
    gauge!(LEASES_HELD).set(leases_held as f64);
    gauge!(WEBSOCKET_CONNECTIONS).set(connections as f64);
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "component" => component.to_owned())
        .set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_held_streams_keep_their_per_stream_samples() {
        let text = "\
# HELP leasehold_stream_last_event_age_seconds Seconds since.
# TYPE leasehold_stream_last_event_age_seconds gauge
leasehold_stream_last_event_age_seconds{stream_id=\"a\"} 0.2
leasehold_stream_last_event_age_seconds{stream_id=\"b\"} 0.1
leasehold_checkpoint_lag_events{stream_id=\"q\\\"x\"} 3
leasehold_stream_gaps_total{reason=\"retention\"} 1
leasehold_worker_up 1
";
        let kept = drop_unheld_stream_series(text.to_owned(), &["b".into(), "q\"x".into()]);
        assert_eq!(
            kept,
            text.replace(
                "leasehold_stream_last_event_age_seconds{stream_id=\"a\"} 0.2\n",
                ""
            )
        );
        let none = drop_unheld_stream_series(text.to_owned(), &[]);
        assert!(!none.contains("stream_id"), "{none}");
        assert!(none.contains("leasehold_worker_up 1") && none.contains("reason=\"retention\""));
        // Nothing to drop: the text is returned as it came.
        let all = ["a".into(), "b".into(), "q\"x".into()];
        assert_eq!(drop_unheld_stream_series(text.to_owned(), &all), text);
    }

    #[test]
    fn only_the_current_worker_keeps_its_worker_samples() {
        let text = "\
# TYPE leasehold_upstream_connections gauge
leasehold_upstream_connections{worker=\"w1\"} 3
leasehold_upstream_connections{worker=\"w\\\"2\"} 4
leasehold_upstream_streams_per_connection 2.5
leasehold_checkpoint_lag_events{stream_id=\"worker=\\\"w1\"} 3
";
        let w1 = "leasehold_upstream_connections{worker=\"w1\"} 3\n";
        let w2 = "leasehold_upstream_connections{worker=\"w\\\"2\"} 4\n";
        assert_eq!(
            drop_other_worker_series(text.to_owned(), Some("w\"2")),
            text.replace(w1, "")
        );
        assert_eq!(
            drop_other_worker_series(text.to_owned(), Some("w1")),
            text.replace(w2, "")
        );
        assert_eq!(
            drop_other_worker_series(text.to_owned(), None),
            text.replace(w1, "").replace(w2, ""),
            "no worker known: none of its samples, the rest untouched"
        );
    }
}
