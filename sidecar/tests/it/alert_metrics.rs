//! The alert artefacts under `alerts/` point at metrics that exist.
//!
//! A real sidecar (also the cluster observer) is fed one event of every
//! `TelemetryEvent` variant through a worker-side `BufferedShipper`; its `/metrics`
//! render is the truth. Every metric name referenced by the Prometheus rules
//! (alert and recording-rule expressions), the CloudWatch alarms (`MetricName`)
//! and the Grafana dashboard (`expr` fields and variable queries) must be in it,
//! so an alert can never silently point at nothing. The rule files are read with
//! a YAML parser and the names are taken out of PromQL with a small lexer (below),
//! which keeps every identifier that selects series: a misspelt name fails the
//! test whether or not it starts with `leasehold_`.
//!
//! The same files are checked for completeness: every alert has a severity,
//! summary, description and a `runbook_url` of the documented form (built from
//! the one runbook base setting, `alerts/prometheus/runbook_base.rules.yml`)
//! whose file exists, and at least one promtool case where it fires and one
//! where it stays silent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_control::store::LeaseStore;
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_sidecar::cloudwatch::{CloudWatchConfig, Mode, datums};
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::http_get;
use serde_yaml_ng::Value;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// Series Prometheus makes itself; rules may reference them.
const PROMETHEUS_OWN: &[&str] = &["up", "ALERTS", "ALERTS_FOR_STATE"];

/// The series whose `base_url` label is the runbook base (alerts/README.md).
const RUNBOOK_BASE_SERIES: &str = "leasehold:runbook_base_url:info";

/// What every `runbook_url` starts with: the base, read from that series when the
/// annotation is rendered; `<AlertName>.md` follows.
const RUNBOOK_URL_PREFIX: &str = r#"{{ with query "leasehold:runbook_base_url:info" }}{{ . | first | label "base_url" }}{{ end }}"#;

/// The rule files: the alerts, and the runbook base setting loaded next to them.
const RULE_FILES: &[&str] = &[
    "prometheus/leasehold.rules.yml",
    "prometheus/runbook_base.rules.yml",
];

fn alerts_dir() -> PathBuf {
    leasehold_testkit::repo_root().join("alerts")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// --- PromQL names ------------------------------------------------------------------

/// Metric names a PromQL expression selects. Not a parser: a lexer that skips
/// strings, label matchers `{…}`, ranges and subqueries `[…]`, comments, numbers
/// and durations (also after `offset`), Grafana `$variables`, the label lists of
/// `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, identifiers followed
/// by `(` (functions, aggregations) and the operators spelt as words. What is left
/// are metric names.
fn promql_metric_names(expr: &str) -> Vec<String> {
    const WORD_OPERATORS: &[&str] = &["and", "or", "unless", "bool", "inf", "nan"];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut label_list_follows = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            '{' => i = skip_to(&chars, i, '}'),
            '[' => i = skip_to(&chars, i, ']'),
            '(' if label_list_follows => {
                label_list_follows = false;
                i = skip_to(&chars, i, ')');
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '$' => {
                i += 1;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let lower = word.to_ascii_lowercase();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let followed_by_paren = chars.get(next) == Some(&'(');
                // `sum by (…) (…)`: an aggregation whose modifier comes first.
                let rest: String = chars[next..].iter().take(8).collect();
                let modifier_follows = ["by", "without"].iter().any(|m| {
                    rest.strip_prefix(m)
                        .is_some_and(|after| after.starts_with(|c: char| !ident(c)))
                });
                if GROUPING.contains(&lower.as_str()) {
                    label_list_follows = followed_by_paren;
                } else if lower == "offset" {
                    // The duration (possibly negative) is not a name.
                    i = next;
                    if chars.get(i) == Some(&'-') {
                        i += 1;
                    }
                    while i < chars.len() && ident(chars[i]) {
                        i += 1;
                    }
                } else if !followed_by_paren
                    && !modifier_follows
                    && !WORD_OPERATORS.contains(&lower.as_str())
                {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Index just past the string literal starting at `start` (escapes honoured).
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Index just past the first `close` after `start`, skipping string literals.
fn skip_to(chars: &[char], start: usize, close: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i),
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

#[test]
fn the_lexer_keeps_metric_names_only() {
    let expr = r#"
        # comment with not_a_metric
        histogram_quantile(0.99, sum by (cluster, le) (rate(a_bucket{job=~"x.*", le!="}"}[5m])))
        / on (job) group_left (team) clamp_min(sum without (instance) (b_total offset -5m), 1e-3)
        > bool 2 and c:recorded:max unless ignoring (x) d @ start()
        or label_replace(e, "dst", "$1", "src", "(.*)") or f[$__rate_interval] * $factor
    "#;
    assert_eq!(
        promql_metric_names(expr),
        ["a_bucket", "b_total", "c:recorded:max", "d", "e", "f"]
    );
    assert_eq!(
        promql_metric_names("leasehold_worker_up == 0"),
        ["leasehold_worker_up"]
    );
}

// --- what the artefacts reference -----------------------------------------------------

struct Rules {
    /// Metric names read by expressions (alerts and recording rules).
    referenced: BTreeSet<String>,
    /// Names recording rules define.
    recorded: BTreeSet<String>,
    /// Alert name → its rules: one, or one per severity (a burn-rate alert
    /// that pages on a fast burn and opens a ticket on a slow one).
    alerts: BTreeMap<String, Vec<Value>>,
}

fn rules() -> Rules {
    let mut rules = Rules {
        referenced: BTreeSet::new(),
        recorded: BTreeSet::new(),
        alerts: BTreeMap::new(),
    };
    let files: Vec<Value> = RULE_FILES
        .iter()
        .map(|file| yaml(&alerts_dir().join(file)))
        .collect();
    for rule in files.iter().flat_map(|file| {
        file["groups"]
            .as_sequence()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_sequence().expect("rules"))
    }) {
        let expr = rule["expr"].as_str().expect("every rule has an expr");
        rules.referenced.extend(promql_metric_names(expr));
        if let Some(record) = rule["record"].as_str() {
            rules.recorded.insert(record.to_owned());
        }
        if let Some(alert) = rule["alert"].as_str() {
            let same_name = rules.alerts.entry(alert.to_owned()).or_default();
            assert!(
                same_name
                    .iter()
                    .all(|other| other["labels"]["severity"] != rule["labels"]["severity"]),
                "alert {alert} defined twice with the same severity"
            );
            same_name.push(rule.clone());
        }
    }
    assert!(!rules.alerts.is_empty() && !rules.recorded.is_empty());
    rules
}

/// Every value under a `key` anywhere in the document (CloudFormation tags such
/// as `!Sub` are walked through).
fn values_of_key(value: &Value, key: &str, out: &mut Vec<String>) {
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                if k.as_str() == Some(key)
                    && let Some(s) = v.as_str()
                {
                    out.push(s.to_owned());
                }
                values_of_key(v, key, out);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|v| values_of_key(v, key, out)),
        Value::Tagged(tagged) => values_of_key(&tagged.value, key, out),
        _ => {}
    }
}

/// Every (MetricName, Dimensions) an alarm reads, from the template's mappings
/// that carry a `MetricName` (single alarms and metric-math queries alike).
fn cloudwatch_alarm_series() -> BTreeSet<(String, BTreeSet<(String, String)>)> {
    fn walk(value: &Value, out: &mut BTreeSet<(String, BTreeSet<(String, String)>)>) {
        match value {
            Value::Mapping(map) => {
                if let Some(name) = map.get("MetricName").and_then(Value::as_str) {
                    let dimensions = map
                        .get("Dimensions")
                        .and_then(Value::as_sequence)
                        .into_iter()
                        .flatten()
                        .filter_map(|d| {
                            Some((
                                d.get("Name")?.as_str()?.to_owned(),
                                d.get("Value")?.as_str()?.to_owned(),
                            ))
                        })
                        .collect();
                    out.insert((name.to_owned(), dimensions));
                }
                for value in map.values() {
                    walk(value, out);
                }
            }
            Value::Sequence(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Tagged(tagged) => walk(&tagged.value, out),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(
        &yaml(&alerts_dir().join("cloudwatch/alarms.yaml")),
        &mut out,
    );
    out
}

fn cloudwatch_metric_names() -> BTreeSet<String> {
    let template = yaml(&alerts_dir().join("cloudwatch/alarms.yaml"));
    let mut names = Vec::new();
    values_of_key(&template, "MetricName", &mut names);
    assert!(names.len() > 10, "MetricName values found: {names:?}");
    names.into_iter().collect()
}

fn grafana_metric_names() -> BTreeSet<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&alerts_dir().join("grafana/leasehold.json")))
            .expect("the Grafana dashboard is JSON");
    fn walk(value: &serde_json::Value, exprs: &mut Vec<String>, queries: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v.as_str()) {
                        ("expr", Some(expr)) => exprs.push(expr.to_owned()),
                        ("query" | "definition", Some(q)) if q.starts_with("label_values(") => {
                            queries.push(q.to_owned())
                        }
                        _ => {}
                    }
                    walk(v, exprs, queries);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, exprs, queries)),
            _ => {}
        }
    }
    let (mut exprs, mut queries) = (Vec::new(), Vec::new());
    walk(&dashboard, &mut exprs, &mut queries);
    assert!(exprs.len() > 20, "expr fields found: {}", exprs.len());
    assert!(!queries.is_empty(), "no label_values() variable queries");
    // `label_values(SELECTOR, label)`: the selector is PromQL, the label is not.
    for query in queries {
        let inner = &query["label_values(".len()..query.rfind(',').expect("label_values(m, l)")];
        exprs.push(inner.to_owned());
    }
    exprs.iter().flat_map(|e| promql_metric_names(e)).collect()
}

// --- what the sidecar exports ---------------------------------------------------------

/// Metric families (`# TYPE` lines, with their type) and sample names of a render.
fn exported(text: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut families = BTreeMap::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                families.insert(name.to_owned(), kind.to_owned());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_owned());
        }
    }
    (families, samples)
}

/// A referenced name is exported if it is a family or a sample name; a
/// histogram's `_bucket`/`_sum`/`_count` map to the histogram's base name.
fn is_exported(
    name: &str,
    families: &BTreeMap<String, String>,
    samples: &BTreeSet<String>,
) -> bool {
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .filter(|base| families.get(*base).map(String::as_str) == Some("histogram"));
    families.contains_key(base.unwrap_or(name)) || samples.contains(name)
}

/// An exhaustive match: adding a `TelemetryEvent` variant breaks this test's
/// build until the new variant is fed below too.
fn variant(event: &TelemetryEvent) -> &'static str {
    use TelemetryEvent::*;
    match event {
        LeaseAcquired { .. } => "LeaseAcquired",
        LeaseAcquireConflict { .. } => "LeaseAcquireConflict",
        LeaseAcquireFailed { .. } => "LeaseAcquireFailed",
        LeaseRenewed { .. } => "LeaseRenewed",
        LeaseRenewFailed { .. } => "LeaseRenewFailed",
        LeaseLost { .. } => "LeaseLost",
        LeaseReleased { .. } => "LeaseReleased",
        UpstreamConnected { .. } => "UpstreamConnected",
        UpstreamDisconnected { .. } => "UpstreamDisconnected",
        UpstreamConnectThrottled { .. } => "UpstreamConnectThrottled",
        UpstreamConnections { .. } => "UpstreamConnections",
        UpstreamSubscribed { .. } => "UpstreamSubscribed",
        UpstreamReconnect { .. } => "UpstreamReconnect",
        UpstreamFrameSkipped { .. } => "UpstreamFrameSkipped",
        StreamGap { .. } => "StreamGap",
        StreamReset { .. } => "StreamReset",
        StreamSnapshot { .. } => "StreamSnapshot",
        StreamChecksumFailure { .. } => "StreamChecksumFailure",
        StreamBackfillWait { .. } => "StreamBackfillWait",
        StreamBackfill { .. } => "StreamBackfill",
        SinkWrite { .. } => "SinkWrite",
        SinkWriteFailed { .. } => "SinkWriteFailed",
        SinkGaveUp { .. } => "SinkGaveUp",
        SinkRegression { .. } => "SinkRegression",
        FenceLifted { .. } => "FenceLifted",
        CheckpointCommit { .. } => "CheckpointCommit",
        StreamLag { .. } => "StreamLag",
        WorkerHeartbeat { .. } => "WorkerHeartbeat",
        EventsDropped { .. } => "EventsDropped",
        StreamStopped { .. } => "StreamStopped",
        PoolClaim { .. } => "PoolClaim",
        BrokerRequest { .. } => "BrokerRequest",
        BrokerReconnect { .. } => "BrokerReconnect",
        MessageDeadLettered { .. } => "MessageDeadLettered",
        PoolWorkerState { .. } => "PoolWorkerState",
        PoolReconciled { .. } => "PoolReconciled",
        OrphanSweep { .. } => "OrphanSweep",
        UserReserved { .. } => "UserReserved",
    }
}
const VARIANTS: usize = 38;

fn every_variant() -> Vec<TelemetryEvent> {
    leasehold_telemetry::testing::every_event()
}

async fn metrics_text(sidecar: &Sidecar) -> String {
    let (code, _, body) = http_get(&sidecar.http_addr.to_string(), "/metrics")
        .await
        .unwrap();
    assert_eq!(code, 200);
    body
}

async fn events_received(sidecar: &Sidecar) -> u64 {
    let (_, _, body) = http_get(&sidecar.http_addr.to_string(), "/status")
        .await
        .unwrap();
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["events_received"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits until `/metrics` satisfies `ready` (10 s at most), returning the render.
async fn render_when(sidecar: &Sidecar, ready: impl Fn(&str) -> bool) -> String {
    for _ in 0..500 {
        let text = metrics_text(sidecar).await;
        if ready(&text) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sidecar did not export what was fed in 10 s");
}

#[tokio::test]
async fn every_metric_the_alerts_use_is_exported() {
    // What the artefacts reference.
    let rules = rules();
    let mut referenced: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for name in &rules.referenced {
        referenced
            .entry(name.clone())
            .or_default()
            .push("prometheus/leasehold.rules.yml");
    }
    for name in cloudwatch_metric_names() {
        referenced
            .entry(name)
            .or_default()
            .push("cloudwatch/alarms.yaml");
    }
    for name in grafana_metric_names() {
        referenced
            .entry(name)
            .or_default()
            .push("grafana/leasehold.json");
    }
    // The credential sealer runs without a sidecar and exports its own
    // (leasehold/tests/it/redis_acl.rs scrapes a real one).
    referenced.retain(|name, _| {
        !rules.recorded.contains(name)
            && !PROMETHEUS_OWN.contains(&name.as_str())
            && !leasehold_broker::sealer::METRICS.contains(&name.as_str())
    });

    // A real sidecar, observer of a lease table with one stream, fed every event.
    let table = Arc::new(MemoryLeaseStore::new());
    table.register("btc-usd", 0).await.unwrap();
    let shutdown = CancellationToken::new();
    // CloudWatch on, at an interval the test never reaches: the test reads
    // what the exporter would send.
    let cloudwatch = CloudWatchConfig {
        mode: Mode::Emf,
        namespace: "LeaseholdTest".into(),
        interval: Duration::from_secs(3600),
    };
    let sidecar = Sidecar::start(
        SidecarConfig {
            observer: Some(crate::support::observer(table).await),
            cloudwatch: Some((cloudwatch, None)),
            ..SidecarConfig::loopback()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let shipper = BufferedShipper::start(
        ShipperConfig {
            heartbeat: Duration::from_millis(200),
            ..ShipperConfig::new(sidecar.telemetry_addr.to_string(), "stream-worker", "w1")
        },
        shutdown.clone(),
    );
    let mut events = every_variant();
    let variants: BTreeSet<_> = events.iter().map(variant).collect();
    assert_eq!(variants.len(), VARIANTS, "one event of every variant");
    // And every closed label value, so every alarm's dimension value has moved.
    events.extend(leasehold_telemetry::testing::every_label_value());
    for event in &events {
        shipper.emit(event.clone());
    }
    // A connection that is not a worker: the sidecar counts a transport error.
    let mut stranger = tokio::net::TcpStream::connect(sidecar.telemetry_addr)
        .await
        .unwrap();
    stranger.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    for _ in 0..500 {
        if events_received(&sidecar).await >= events.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = render_when(&sidecar, |text| {
        text.contains("leasehold_streams{")
            && (leasehold_testkit::redis_url().is_none()
                || text.contains("leasehold_pool_workers{"))
            && text.contains("leasehold_sidecar_transport_errors_total{")
            // The sample, not its HELP text ("leasehold_worker_up 1 while …").
            && text.contains("\nleasehold_worker_up 1\n")
            && text.contains("leasehold_telemetry_events_dropped_total")
    })
    .await;
    // What CloudWatch would get: every name an alarm reads, the observer's
    // cluster gauges included (they once bypassed the push exporters).
    let pushed_datums = datums(
        sidecar
            .state
            .snapshot_reader()
            .expect("CloudWatch is on")
            .take(),
    );
    let pushed: BTreeSet<String> = pushed_datums.iter().map(|d| d.name.clone()).collect();
    // Each alarm reads one metric with exact dimensions: a dimension the export
    // does not carry (or a value it never sends) leaves the alarm without data
    // for ever, which CloudWatch does not report.
    let pushed_series: BTreeSet<(String, BTreeSet<(String, String)>)> = pushed_datums
        .iter()
        .map(|d| (d.name.clone(), d.dimensions.iter().cloned().collect()))
        .collect();
    let unmatched: Vec<String> = cloudwatch_alarm_series()
        .into_iter()
        .filter(|(name, _)| {
            leasehold_testkit::redis_url().is_some()
                || ![
                    "leasehold_pool_workers",
                    "leasehold_pool_claims_pending",
                    "leasehold_orphans",
                ]
                .contains(&name.as_str())
        })
        .filter(|series| !pushed_series.contains(series))
        .map(|(name, dimensions)| format!("{name}{dimensions:?}"))
        .collect();
    assert!(
        unmatched.is_empty(),
        "alarms whose metric and dimensions the CloudWatch export never sends: {unmatched:?}\nexported: {pushed_series:?}"
    );
    // The pool's gauges need the pool bus (the test Redis), as above.
    let pool_gauges = [
        "leasehold_pool_workers",
        "leasehold_pool_claims_pending",
        "leasehold_orphans",
    ];
    let not_pushed: Vec<String> = cloudwatch_metric_names()
        .into_iter()
        .filter(|name| !pushed.contains(name))
        .filter(|name| {
            leasehold_testkit::redis_url().is_some() || !pool_gauges.contains(&name.as_str())
        })
        .collect();
    assert!(
        not_pushed.is_empty(),
        "read by CloudWatch alarms but not in the CloudWatch export: {not_pushed:?}\nexported: {pushed:?}"
    );
    shutdown.cancel();
    // Observing ends with the sidecar: its cluster gauges leave the export
    // (another observer publishes them now).
    for _ in 0..250 {
        if !sidecar.state.is_observer() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!sidecar.state.is_observer());
    let after: BTreeSet<String> = datums(sidecar.state.snapshot_reader().expect("on").take())
        .into_iter()
        .map(|datum| datum.name)
        .collect();
    assert!(
        !after.contains("leasehold_streams"),
        "a former observer keeps pushing the cluster gauges: {after:?}"
    );
    let (families, samples) = exported(&text);

    let mut missing = Vec::new();
    for (name, files) in &referenced {
        if !is_exported(name, &families, &samples) {
            missing.push(format!("{name} (used in {})", files.join(", ")));
        }
    }
    assert!(
        missing.is_empty(),
        "referenced by alerts/ but not exported by the sidecar:\n  {}\n\n/metrics:\n{text}",
        missing.join("\n  ")
    );
    eprintln!("{} referenced metric names checked", referenced.len());
    // Sanity: the check did see the sidecar's own names from all three files.
    for name in [
        "leasehold_streams",
        "leasehold_worker_up",
        "leasehold_lease_renew_duration_seconds_bucket",
        "leasehold_checkpoint_lag_seconds",
    ] {
        assert!(referenced.contains_key(name), "{name} not referenced?");
    }
}

// --- completeness of the alert artefacts -----------------------------------------------

/// The `base_url` a runbook base file records (exactly one rule: the base series).
fn recorded_runbook_base(path: &Path) -> String {
    let file = yaml(path);
    let rules: Vec<&Value> = file["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .collect();
    assert_eq!(rules.len(), 1, "{}: one rule, the base", path.display());
    assert_eq!(
        rules[0]["record"].as_str(),
        Some(RUNBOOK_BASE_SERIES),
        "{}",
        path.display()
    );
    let base = rules[0]["labels"]["base_url"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no base_url label", path.display()));
    assert!(
        base.starts_with("https://") && base.ends_with('/'),
        "{}: base {base}",
        path.display()
    );
    base.to_owned()
}

#[test]
fn every_alert_has_labels_annotations_a_runbook_and_promtool_cases() {
    let rules = rules();
    // The one base setting, and the one the promtool cases run with.
    recorded_runbook_base(&alerts_dir().join("prometheus/runbook_base.rules.yml"));
    let fixture = "fixtures/runbook_base.rules.yml";
    recorded_runbook_base(&alerts_dir().join("prometheus/tests").join(fixture));
    for (name, rule) in rules
        .alerts
        .iter()
        .flat_map(|(name, same_name)| same_name.iter().map(move |rule| (name, rule)))
    {
        assert!(name.starts_with("Leasehold"), "{name}: component prefix");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name}: {annotation}"
            );
        }
        assert_eq!(
            rule["annotations"]["runbook_url"].as_str(),
            Some(format!("{RUNBOOK_URL_PREFIX}{name}.md").as_str()),
            "{name}: runbook_url"
        );
        let runbook = alerts_dir().join(format!("runbooks/{name}.md"));
        assert!(
            read(&runbook).starts_with(&format!("# {name}\n")),
            "{}",
            runbook.display()
        );
    }

    // promtool cases: alert name → (fires somewhere, silent somewhere).
    let mut cases: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let tests_dir = alerts_dir().join("prometheus/tests");
    for entry in std::fs::read_dir(&tests_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yml") {
            continue;
        }
        let file = yaml(&path);
        // The base is recorded before any alert template reads it, so even a
        // case's first evaluation shows the whole link.
        assert_eq!(
            file["rule_files"][0].as_str(),
            Some(fixture),
            "{}: rule_files must load the runbook base first",
            path.display()
        );
        for test in file["tests"].as_sequence().expect("tests") {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let alert = case["alertname"].as_str().expect("alertname").to_owned();
                let fires = case["exp_alerts"]
                    .as_sequence()
                    .is_some_and(|alerts| !alerts.is_empty());
                let entry = cases.entry(alert).or_default();
                if fires {
                    entry.0 = true;
                } else {
                    entry.1 = true;
                }
            }
        }
    }
    for name in rules.alerts.keys() {
        assert_eq!(
            cases.get(name),
            Some(&(true, true)),
            "{name}: needs a promtool case where it fires and one where it stays silent"
        );
    }
    for name in cases.keys() {
        assert!(
            rules.alerts.contains_key(name),
            "tests name unknown alert {name}"
        );
    }

    // CloudWatch alarms: the same runbooks; the base is a required parameter
    // (a default would link somewhere the runbooks are not).
    let template = yaml(&alerts_dir().join("cloudwatch/alarms.yaml"));
    let parameter = &template["Parameters"]["RunbookBaseUrl"];
    assert!(parameter.is_mapping(), "RunbookBaseUrl parameter");
    assert!(
        parameter.get("Default").is_none(),
        "RunbookBaseUrl must be passed at deploy time"
    );
    let mut descriptions = Vec::new();
    values_of_key(&template, "AlarmDescription", &mut descriptions);
    assert!(!descriptions.is_empty());
    for description in descriptions {
        let runbook = description
            .rsplit("${RunbookBaseUrl}")
            .next()
            .and_then(|rest| rest.strip_suffix(".md"))
            .unwrap_or_else(|| panic!("alarm without a runbook link: {description}"));
        assert!(
            rules.alerts.contains_key(runbook),
            "alarm links unknown runbook {runbook}"
        );
    }
}
