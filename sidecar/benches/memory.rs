//! Sidecar memory over a simulated hour at 10,000 events/s, in each export mode:
//! Prometheus only, CloudWatch EMF, CloudWatch PutMetricData, OTLP.
//!
//! ```text
//! cargo bench -p leasehold-sidecar --bench memory -- [--minutes 60] [--rate 10000]
//! ```
//! Each mode runs in a child process of its own (RSS is per process, and an
//! allocator keeps what an earlier mode freed). A child feeds the sidecar's
//! ingest path directly, one simulated minute (`rate` × 60 events over 100
//! streams: renewals, sink writes, lag, checkpoints) at a time, and gives the
//! push exporters a real export after each one (their interval is 20 ms; the
//! next minute starts once CloudWatch has taken this one's samples).
//! PutMetricData and OTLP send to a closed loopback port: the requests fail,
//! which is the worst case for anything that would keep unsent data. RSS is
//! read after the first simulated minute and at the end; the target is flat
//! within 5 MB.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_sidecar::cloudwatch::{CloudWatchConfig, Mode};
use leasehold_sidecar::otlp::OtlpConfig;
use leasehold_sidecar::{Sidecar, SidecarConfig};
use leasehold_telemetry::{CommitResult, TelemetryEvent};
use leasehold_testkit::measure::{arg, rss_kib};
use tokio_util::sync::CancellationToken;

const MODES: [&str; 4] = ["prometheus", "emf", "put-metric-data", "otlp"];
const STREAMS: u64 = 100;

fn main() {
    let minutes = arg("--minutes", 60);
    let rate = arg("--rate", 10_000);
    if let Some(mode) = std::env::args().skip_while(|a| a != "--mode").nth(1) {
        run_mode(&mode, minutes, rate);
        return;
    }
    println!(
        "sidecar RSS over {minutes} simulated minutes at {rate} events/s ({} events per mode, 100 streams):",
        minutes * 60 * rate
    );
    for mode in MODES {
        let output = Command::new(std::env::current_exe().expect("this binary"))
            .args(["--mode", mode])
            .args(["--minutes", &minutes.to_string()])
            .args(["--rate", &rate.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .expect("run a mode");
        // EMF documents go to stdout; the child's figures are on its last line.
        let text = String::from_utf8_lossy(&output.stdout);
        let figures = text
            .lines()
            .rev()
            .find(|l| l.starts_with("rss "))
            .unwrap_or("rss ? ? ?");
        println!("  {mode:<16} {figures}");
    }
}

fn config(mode: &str) -> SidecarConfig {
    let cloudwatch = |mode| {
        Some((
            CloudWatchConfig {
                mode,
                namespace: "LeaseholdBench".into(),
                interval: Duration::from_millis(20),
            },
            None,
        ))
    };
    let closed_port = "http://127.0.0.1:9";
    let mut config = SidecarConfig {
        stream_series_idle: Duration::from_secs(600),
        ..SidecarConfig::loopback()
    };
    match mode {
        "prometheus" => {}
        "emf" => config.cloudwatch = cloudwatch(Mode::Emf),
        "put-metric-data" => {
            let sdk = leasehold_testkit::local_sdk_config(closed_port);
            let client = aws_sdk_cloudwatch::Client::new(&sdk);
            config.cloudwatch = cloudwatch(Mode::Api).map(|(c, _)| (c, Some(client)));
        }
        "otlp" => {
            config.otlp = Some(OtlpConfig {
                protocol: Some("http/protobuf".into()),
                endpoint: Some(closed_port.into()),
                interval: Some(Duration::from_millis(200)),
                ..Default::default()
            })
        }
        other => panic!("unknown mode {other}"),
    }
    config
}

/// One simulated minute's events.
fn minute(rate: u64, minute: u64) -> impl Iterator<Item = TelemetryEvent> {
    (0..rate * 60).map(move |i| {
        let stream_id = format!("stream-{:03}", i % STREAMS);
        match i % 4 {
            0 => TelemetryEvent::LeaseRenewed {
                stream_id,
                fence_token: 1,
                expires_at_ms: 0,
                duration: Duration::from_micros(800 + i % 1000),
                lateness: Duration::ZERO,
            },
            1 => TelemetryEvent::SinkWrite {
                stream_id,
                fence_token: 1,
                accepted: 50,
                duplicate: 0,
                fenced: 0,
                duration: Duration::from_micros(300 + i % 700),
            },
            2 => TelemetryEvent::StreamLag {
                stream_id,
                lag_events: i % 500,
                lag_seconds: 0.5,
                last_event_age_seconds: 0.01,
                event_lag_seconds: Some(0.2),
            },
            _ => TelemetryEvent::CheckpointCommit {
                stream_id,
                checkpoint: minute * rate * 60 + i,
                result: CommitResult::Committed,
            },
        }
    })
}

fn run_mode(mode: &str, minutes: u64, rate: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let sidecar = Sidecar::start(config(mode), shutdown.clone())
            .await
            .expect("sidecar");
        // As from a connected worker (its streams' series are exported).
        sidecar.state.view().connection(true);
        let started = Instant::now();
        let mut first = 0;
        for m in 0..minutes {
            for event in minute(rate, m) {
                sidecar.state.ingest(&event);
            }
            // A minute passes for the exporters too: wait until CloudWatch took
            // this minute's samples (its interval is 20 ms, but a failing
            // PutMetricData call retries for longer), and give OTLP a few ticks.
            tokio::time::sleep(Duration::from_millis(60)).await;
            let waiting = Instant::now();
            while sidecar.state.pending_push_samples() > 0
                && waiting.elapsed() < Duration::from_secs(30)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            sidecar.state.upkeep();
            if m == 0 {
                first = rss_kib("self");
            }
        }
        let last = rss_kib("self");
        let growth = last as f64 / 1024.0 - first as f64 / 1024.0;
        println!(
            "rss after minute 1 {:>6.1} MiB, after minute {minutes} {:>6.1} MiB, growth {:>+5.1} MiB ({}; {:.0} s wall)",
            first as f64 / 1024.0,
            last as f64 / 1024.0,
            growth,
            if growth.abs() <= 5.0 {
                "flat within 5 MB: met"
            } else {
                "NOT flat"
            },
            started.elapsed().as_secs_f64()
        );
        shutdown.cancel();
    });
    // Leave without the OTLP exporter's shutdown flush, which would wait on the
    // closed port: the figures are printed.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}
