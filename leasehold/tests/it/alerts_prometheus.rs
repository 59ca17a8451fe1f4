//! The alert rules end to end: a real Prometheus loads `alerts/prometheus/*.yml`
//! and scrapes the real sidecars of two real stream workers. It stays quiet
//! (nothing pending, nothing firing) while the cluster is healthy, and when one
//! worker is paused (SIGSTOP) past its lease and resumed, it fires
//! `LeaseholdLeaseLost{reason="deadline_passed"}` for that worker's sidecar
//! and nothing else.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::{Cluster, LEASE_SECONDS, Prometheus, serial};
use serde_json::Value;

/// The scrape job: the `up`-based rules select `job=~"leasehold.*"`.
const JOB: &str = "leasehold-stream-workers";
/// How long the healthy cluster must stay quiet.
const QUIET: Duration = Duration::from_secs(45);

/// Every rule file in `alerts/prometheus/`, as an operator would load them.
fn rule_files() -> Vec<PathBuf> {
    let dir = leasehold_testkit::repo_root().join("alerts/prometheus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no rule file in {}", dir.display());
    files
}

fn owned_by(owners: &BTreeMap<String, String>, owner: &str) -> usize {
    owners.values().filter(|o| o.as_str() == owner).count()
}

/// `name{label=value,…} state` for each alert, for messages.
fn describe(alerts: &[Value]) -> Vec<String> {
    alerts
        .iter()
        .map(|a| {
            let labels = a["labels"].as_object().cloned().unwrap_or_default();
            let name = labels
                .get("alertname")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let rest: Vec<String> = labels
                .iter()
                .filter(|(k, _)| k.as_str() != "alertname")
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
                .collect();
            format!(
                "{name}{{{}}} {}",
                rest.join(","),
                a["state"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn label<'a>(alert: &'a Value, name: &str) -> &'a str {
    alert["labels"][name].as_str().unwrap_or("")
}

/// Everything a failure needs: the alerts, Prometheus's log, the cluster's.
async fn context(prometheus: &Prometheus, cluster: &Cluster) -> String {
    let alerts = prometheus.alerts().await;
    format!(
        "alerts: {}\n--- prometheus log\n{}\n{}",
        serde_json::to_string_pretty(&alerts).unwrap(),
        prometheus.log(),
        cluster.logs()
    )
}

/// Polls the active alerts until `done` holds for them; panics with the
/// context after `timeout`. Returns the alerts and the time it took.
async fn wait_alerts(
    prometheus: &Prometheus,
    cluster: &Cluster,
    what: &str,
    timeout: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, Duration) {
    let start = Instant::now();
    loop {
        let alerts = prometheus.alerts().await;
        if done(&alerts) {
            return (alerts, start.elapsed());
        }
        if start.elapsed() > timeout {
            panic!(
                "{what}: not within {timeout:?}; last seen {:?}\n{}",
                describe(&alerts),
                context(prometheus, cluster).await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Both targets up and reporting a live worker, and the observer's cluster
/// gauges present: the quiet that follows is not missing data.
async fn assert_scraping(prometheus: &Prometheus, cluster: &Cluster, targets: &[String]) {
    let active = prometheus.targets().await;
    let mut healthy: Vec<&str> = active
        .iter()
        .filter(|t| t["health"] == "up" && t["labels"]["job"] == JOB)
        .filter_map(|t| t["labels"]["instance"].as_str())
        .collect();
    healthy.sort_unstable();
    let mut expected: Vec<&str> = targets.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(
        healthy,
        expected,
        "targets not all up: {}\n{}",
        serde_json::to_string_pretty(&active).unwrap(),
        context(prometheus, cluster).await
    );
    let workers_up = prometheus
        .query(&format!(r#"leasehold_worker_up{{job="{JOB}"}} == 1"#))
        .await;
    assert_eq!(
        workers_up.len(),
        targets.len(),
        "leasehold_worker_up: {workers_up:?}\n{}",
        context(prometheus, cluster).await
    );
    let streams = prometheus.query("cluster:leasehold_streams:max").await;
    assert!(
        !streams.is_empty(),
        "no cluster gauges from the observer\n{}",
        context(prometheus, cluster).await
    );
}

/// Every rule file loaded, every alert of them known to Prometheus, and no
/// rule failing to evaluate (a failing rule is silent too).
async fn assert_rules_healthy(prometheus: &Prometheus, cluster: &Cluster) {
    let in_files: usize = rule_files()
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .filter(|l| l.trim_start().starts_with("- alert:"))
                .count()
        })
        .sum();
    let groups = prometheus.rule_groups().await;
    let rules: Vec<&Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    let alerting = rules.iter().filter(|r| r["type"] == "alerting").count();
    assert_eq!(alerting, in_files, "alerting rules loaded vs in the files");
    let failing: Vec<String> = rules
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
        .collect();
    assert!(
        failing.is_empty(),
        "rules not evaluating: {failing:#?}\n{}",
        context(prometheus, cluster).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_is_quiet_on_a_healthy_cluster_and_fires_lease_lost_for_a_paused_worker() {
    let _serial = serial().await;
    let Some(binary) = leasehold_testkit::prometheus() else {
        return;
    };
    let Some(mut cluster) = Cluster::start(2, 20).await else {
        return;
    };
    let began = Instant::now();
    cluster.start_worker_with_sidecar("w1", &[]);
    cluster.start_worker_with_sidecar("w2", &[]);
    cluster
        .wait_owners(Duration::from_secs(40), |o| {
            o.len() == 2 && owned_by(o, "w1") == 1 && owned_by(o, "w2") == 1
        })
        .await;
    let targets: Vec<String> = cluster.sidecars.values().map(|s| s.http.clone()).collect();
    let prometheus = Prometheus::start(&binary, JOB, &targets, &rule_files()).await;

    // Settling: until the first scrapes land, `absent(up{job=~"leasehold.*"} == 1)`
    // (LeaseholdSidecarTargetAbsent) is true, so that alert may be pending for
    // an evaluation or two. Wait for data and for an empty alert list.
    let settle = Instant::now();
    loop {
        let ready = prometheus
            .targets()
            .await
            .iter()
            .all(|t| t["health"] == "up")
            && prometheus.query(r#"leasehold_worker_up == 1"#).await.len() == targets.len()
            && !prometheus
                .query("cluster:leasehold_streams:max")
                .await
                .is_empty();
        if ready {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(30),
            "Prometheus never saw the cluster\n{}",
            context(&prometheus, &cluster).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, quiet_after) = wait_alerts(
        &prometheus,
        &cluster,
        "an empty alert list once scraping",
        Duration::from_secs(10),
        <[Value]>::is_empty,
    )
    .await;
    assert_scraping(&prometheus, &cluster, &targets).await;

    // Healthy: nothing pending or firing at any poll for QUIET.
    let healthy = Instant::now();
    while healthy.elapsed() < QUIET {
        let alerts = prometheus.alerts().await;
        assert!(
            alerts.is_empty(),
            "alert(s) on a healthy cluster after {:?}: {:?}\n{}",
            healthy.elapsed(),
            describe(&alerts),
            context(&prometheus, &cluster).await
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_scraping(&prometheus, &cluster, &targets).await;
    assert_rules_healthy(&prometheus, &cluster).await;
    let owners = cluster.owners().await;
    assert!(
        owners.len() == 2 && owned_by(&owners, "w1") == 1,
        "ownership moved during the quiet phase: {owners:?}"
    );

    // Fault: w1 frozen past its lease; w2 takes its stream over.
    let victim = cluster.sidecars["w1"].http.clone();
    cluster.workers["w1"].signal("STOP");
    let paused = Instant::now();
    let takeover = cluster
        .wait_owners(Duration::from_secs(20), |o| {
            o.len() == 2 && owned_by(o, "w2") == 2
        })
        .await;
    // Its silent sidecar reports the worker down (pending: `for: 2m`).
    let is_down = |a: &Value| {
        label(a, "alertname") == "LeaseholdWorkerDown" && label(a, "instance") == victim
    };
    let (_, down_after) = wait_alerts(
        &prometheus,
        &cluster,
        "LeaseholdWorkerDown pending for the paused worker",
        Duration::from_secs(20),
        |alerts| alerts.iter().any(|a| is_down(a) && a["state"] == "pending"),
    )
    .await;
    let past_lease = Duration::from_secs(LEASE_SECONDS + 2);
    if let Some(rest) = past_lease.checked_sub(paused.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let stopped_for = paused.elapsed();
    cluster.workers["w1"].signal("CONT");

    // Resumed, it finds its own deadline passed and reports the loss.
    let is_lost = |a: &Value| {
        label(a, "alertname") == "LeaseholdLeaseLost"
            && label(a, "instance") == victim
            && label(a, "job") == JOB
            && label(a, "reason") == "deadline_passed"
            && label(a, "severity") == "warning"
            && a["state"] == "firing"
    };
    let (_, fired_after) = wait_alerts(
        &prometheus,
        &cluster,
        "LeaseholdLeaseLost{reason=\"deadline_passed\"} firing for the paused worker",
        Duration::from_secs(30),
        |alerts| alerts.iter().any(is_lost),
    )
    .await;
    // Once its heartbeats are back, that is the only alert: the worker is no
    // longer down, w2's takeover lost nothing, no stale write reached the sink.
    let (alerts, alone_after) = wait_alerts(
        &prometheus,
        &cluster,
        "LeaseholdLeaseLost as the only alert",
        Duration::from_secs(20),
        |alerts| alerts.len() == 1 && is_lost(&alerts[0]),
    )
    .await;
    eprintln!(
        "quiet {QUIET:?} after settling in {quiet_after:?}; w1 stopped for {stopped_for:?} \
         (takeover {takeover:?}, WorkerDown pending after {down_after:?}); \
         LeaseLost firing {fired_after:?} after SIGCONT, alone {alone_after:?} later: {:?}; \
         whole test {:?}",
        describe(&alerts),
        began.elapsed()
    );
    cluster.stop_workers();
}
