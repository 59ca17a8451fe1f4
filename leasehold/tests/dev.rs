//! `leasehold dev` as a newcomer runs it: one process, no AWS, no Redis. The
//! dashboard must show owned streams and a pool; with `--chaos`, takeovers must
//! appear in the ownership changes; Ctrl-C drains and the sink has no gaps.

mod support;

use std::time::{Duration, Instant};

use leasehold_testkit::http_get;
use serde_json::Value;
use support::{serial, spawn_dev_chaos};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_the_cluster_and_heals_under_chaos() {
    let _serial = serial().await;
    let (mut dev, addr) = spawn_dev_chaos("dev", Duration::from_secs(20));
    dev.wait_line("ready in", Duration::from_secs(1));

    wait_for("every stream owned", Duration::from_secs(20), async || {
        api(&addr, "/api/streams").await["counts"]["owned"].as_u64() == Some(6)
    })
    .await;
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
        .unwrap_or_else(|| panic!("no sink check\n{output}"));
    assert!(
        check.ends_with("0 gaps, 0 duplicates, 0 token regressions"),
        "{check}"
    );
    assert!(!check.starts_with("sink check: 0 streams"), "{check}");
}
