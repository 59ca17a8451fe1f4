//! `leasehold dev` as a newcomer runs it: one process, no AWS, no Redis. The
//! dashboard must show owned streams and a pool; with `--chaos`, takeovers must
//! appear in the ownership changes; Ctrl-C drains and the sink has no gaps.

use std::time::{Duration, Instant};

use crate::support::{Proc, serial, spawn_dev_chaos, spawn_dev_chaos_with};
use leasehold_testkit::http_get;
use serde_json::Value;

async fn api(addr: &str, path: &str) -> Value {
    let (status, _, body) = http_get(addr, path).await.expect("dashboard answers");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "never saw: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the dashboard shows all six of `dev`'s streams owned.
async fn wait_every_stream_owned(addr: &str) {
    wait_for("every stream owned", Duration::from_secs(20), async || {
        api(addr, "/api/streams").await["counts"]["owned"].as_u64() == Some(6)
    })
    .await;
}

/// Ctrl-C: `dev` must drain and exit cleanly, and its closing sink check
/// must cover some streams. Returns the check's line for the caller's counts.
fn interrupt_and_read_sink_check(dev: &mut Proc) -> String {
    dev.signal("INT");
    let status = dev.wait_exit(Duration::from_secs(30));
    let output = dev.output();
    assert!(
        status.success(),
        "dev did not exit cleanly: {status}\n{output}"
    );
    let check = output
        .lines()
        .find(|l| l.starts_with("sink check:"))
        .unwrap_or_else(|| panic!("no sink check\n{output}"))
        .to_owned();
    assert!(!check.starts_with("sink check: 0 streams"), "{check}");
    check
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_the_cluster_and_heals_under_chaos() {
    let _serial = serial().await;
    let (mut dev, addr) = spawn_dev_chaos("dev", Duration::from_secs(20));
    dev.wait_line("ready in", Duration::from_secs(1));

    wait_every_stream_owned(&addr).await;
    wait_for(
        "idle and claimed pool workers",
        Duration::from_secs(20),
        async || {
            let pool = api(&addr, "/api/pool").await;
            !pool["pool"]["idle"].as_array().unwrap().is_empty()
                && !pool["pool"]["claimed"].as_array().unwrap().is_empty()
        },
    )
    .await;
    wait_for(
        "a takeover in the ownership changes",
        Duration::from_secs(60),
        async || {
            api(&addr, "/api/changes").await["changes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["kind"] == "takeover")
        },
    )
    .await;
    let workers = api(&addr, "/api/workers").await;
    assert!(
        workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["worker_up"] == true),
        "sidecars report their workers: {workers}"
    );

    let check = interrupt_and_read_sink_check(&mut dev);
    assert!(
        check.contains(" 0 gaps, 0 duplicates, 0 token regressions, 0 gap markers"),
        "{check}"
    );
}

/// `dev --lease-mode session`: the same cluster with one session per worker.
/// Stream records are never renewed, so the dashboard counting every stream
/// owned long past a lease means it reads each stream's expiry from its
/// session; crashes are taken over by the transaction, and the sink check
/// stays clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_in_session_mode_heals_under_chaos() {
    heals_under_chaos("dev-session", &["--lease-mode", "session"]).await;
}

/// `dev --discovery-mode assigned` in session mode: the elected assigner
/// advises, workers query their own; under crashes, pauses and rolls every
/// stream is owned again (crash takeovers included) and the sink holds every
/// event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_assigned_discovery_heals_under_chaos() {
    heals_under_chaos(
        "dev-assigned",
        &["--lease-mode", "session", "--discovery-mode", "assigned"],
    )
    .await;
}

/// Runs `dev --chaos` with `extra` until every stream is owned, a takeover
/// happened and every stream is owned again; then drains and expects a clean
/// sink check.
async fn heals_under_chaos(name: &str, extra: &[&str]) {
    let _serial = serial().await;
    let (mut dev, addr) = spawn_dev_chaos_with(name, Duration::from_secs(20), extra);
    wait_every_stream_owned(&addr).await;
    wait_for(
        "a takeover in the ownership changes",
        Duration::from_secs(60),
        async || {
            api(&addr, "/api/changes").await["changes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["kind"] == "takeover")
        },
    )
    .await;
    wait_every_stream_owned(&addr).await;
    // A takeover's gap is from the old holder's end (its lease or, in
    // session mode, its session) to the new acquire: the skew margin and a
    // discovery pass, never more than a lease (dev's is 6 s). Session mode
    // measured it from the stream record's acquire-time expiry: 26-57 s.
    let changes = api(&addr, "/api/changes").await;
    for change in changes["changes"].as_array().unwrap() {
        if change["kind"] == "takeover" {
            let gap = change["gap_seconds"].as_f64();
            assert!(
                gap.is_some_and(|gap| gap <= 6.0),
                "{name}: takeover gap {gap:?} s: {change}"
            );
        }
    }
    let check = interrupt_and_read_sink_check(&mut dev);
    assert!(
        check.contains(" 0 gaps, 0 duplicates, 0 token regressions, 0 gap markers"),
        "{check}"
    );
}

/// `dev --feed exchange`: the same cluster on a Binance-shaped fake exchange
/// (live start, a short history, cuts). Under chaos, streams keep flowing;
/// every range the sink lacks is a gap marker (the audit's unmarked gaps stay
/// 0) and the dashboard's stream view carries the gap columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_on_an_exchange_shaped_feed_marks_what_it_cannot_backfill() {
    let _serial = serial().await;
    let (mut dev, addr) = spawn_dev_chaos_with(
        "dev-exchange",
        Duration::from_secs(20),
        &["--feed", "exchange"],
    );
    let line = dev.wait_line("feed          ws://", Duration::from_secs(1));
    assert!(line.contains("@trade"), "{line}");
    wait_every_stream_owned(&addr).await;
    wait_for(
        "a stream whose checkpoint moved",
        Duration::from_secs(30),
        async || {
            api(&addr, "/api/streams").await["streams"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["checkpoint"].as_u64().is_some_and(|c| c > 5_000))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    // A stream that lost data in the verdict's window is never `ok`.
    for stream in api(&addr, "/api/streams").await["streams"]
        .as_array()
        .unwrap()
    {
        if !stream["gaps"].is_null() {
            assert_ne!(stream["verdict"], "ok", "{stream}");
        }
    }
    let check = interrupt_and_read_sink_check(&mut dev);
    assert!(
        check.contains(" 0 gaps, 0 duplicates, 0 token regressions"),
        "{check}"
    );
}

/// `dev --feed book`: order books (Binance depth diffs, REST snapshots) under
/// chaos. Every stream's entries start at a snapshot, positions only move
/// forward, and each takeover or cut is a resync with its own snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_records_order_books_that_start_and_resync_at_snapshots() {
    let _serial = serial().await;
    let (mut dev, addr) =
        spawn_dev_chaos_with("dev-book", Duration::from_secs(20), &["--feed", "book"]);
    let line = dev.wait_line("feed          ws://", Duration::from_secs(1));
    assert!(
        line.contains("@depth") && line.contains("order books"),
        "{line}"
    );
    wait_every_stream_owned(&addr).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let check = interrupt_and_read_sink_check(&mut dev);
    assert!(
        check.contains(" 0 gaps, 0 duplicates, 0 token regressions"),
        "{check}"
    );
    let snapshots: u64 = check
        .rsplit_once(", ")
        .and_then(|(_, tail)| tail.strip_suffix(" book snapshots"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no snapshot count: {check}"));
    // One per stream at least, and the chaos' takeovers resync more.
    assert!(snapshots > 6, "{check}");
}
