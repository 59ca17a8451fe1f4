//! A real Prometheus server (Debian's package) scrapes a running sidecar; the
//! contract's series are read back through its HTTP query API.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::transport::{BufferedShipper, ShipperConfig};
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};
use leasehold_testkit::{http_get, prometheus};
use tokio_util::sync::CancellationToken;

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn query(addr: &str, promql: &str) -> serde_json::Value {
    let path = format!(
        "/api/v1/query?query={}",
        promql
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace('"', "%22")
            .replace('=', "%3D")
    );
    match http_get(addr, &path).await {
        Ok((200, _, body)) => serde_json::from_str(&body).unwrap_or_default(),
        _ => serde_json::Value::Null,
    }
}

fn value(response: &serde_json::Value) -> Option<String> {
    response["data"]["result"][0]["value"][1]
        .as_str()
        .map(String::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_contract_series() {
    let Some(binary) = prometheus() else { return };
    let shutdown = CancellationToken::new();
    let sidecar = Sidecar::start(SidecarConfig::loopback(), shutdown.clone())
        .await
        .unwrap();
    let shipper = BufferedShipper::start(
        ShipperConfig {
            heartbeat: Duration::from_millis(200),
            ..ShipperConfig::new(sidecar.telemetry_addr.to_string(), "stream-worker", "w1")
        },
        shutdown.clone(),
    );
    shipper.emit(TelemetryEvent::LeaseAcquired {
        stream_id: "btc-usd".into(),
        fence_token: 1,
        expires_at_ms: 0,
        duration: Duration::from_millis(4),
        takeover_gap: None,
        previous_owner: None,
    });

    let dir = std::env::temp_dir().join(leasehold_testkit::unique_name("prometheus"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: leasehold-sidecar\n    static_configs:\n      - targets: ['{}']\n",
            sidecar.http_addr
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let web = format!("127.0.0.1:{port}");
    let _server = Killed(
        Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let started = Instant::now();
    loop {
        let up = value(&query(&web, r#"up{job="leasehold-sidecar"}"#).await);
        let worker = value(&query(&web, "leasehold_worker_up").await);
        let acquired = value(
            &query(
                &web,
                r#"leasehold_lease_acquisitions_total{result="acquired"}"#,
            )
            .await,
        );
        if up.as_deref() == Some("1")
            && worker.as_deref() == Some("1")
            && acquired.as_deref() == Some("1")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Prometheus never saw the series: up={up:?} worker_up={worker:?} acquired={acquired:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let build = query(&web, "leasehold_build_info").await;
    let components: Vec<_> = build["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["metric"]["component"].as_str())
        .collect();
    assert!(components.contains(&"sidecar"), "{build}");
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}
