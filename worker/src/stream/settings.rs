//! The stream worker's configuration, parsed from the variables in
//! `leasehold_control::config` (every problem reported at once).

use std::time::Duration;

use leasehold_control::config::{
    self, BATCH_MAX_DELAY_MS, BATCH_MAX_EVENTS, ConfigError, DISCOVERY_INTERVAL_MS,
    DRAIN_TIMEOUT_MS, EnvVar, HANDOFF_POLL_MS, LeaseSettings, MAX_STREAMS, Problems,
    SINK_DEDUP_WINDOW, SINK_MAX_LEN, SINK_URL, STREAM_IDS, TELEMETRY_ADDR, TELEMETRY_BUFFER,
    UPSTREAM_ID_POINTER, UPSTREAM_MAX_FRAME_BYTES, UPSTREAM_SEQ_POINTER, UPSTREAM_SUBSCRIBE,
    UPSTREAM_URL,
};

use leasehold_control::transport::ShipperConfig;

use super::runner::RunnerConfig;
use super::worker::StreamWorkerConfig;
use crate::sink::SinkOptions;
use crate::upstream::WebSocketUpstreamConfig;

/// Everything `leasehold stream-worker` needs.
#[derive(Debug, Clone)]
pub struct StreamWorkerSettings {
    /// Lease table and keeper timings.
    pub lease: LeaseSettings,
    /// The upstream adapter.
    pub upstream: WebSocketUpstreamConfig,
    /// `SINK_URL` (may hold a password: never print it).
    pub sink_url: String,
    /// Sink sizing.
    pub sink: SinkOptions,
    /// Discovery, balancing, drain.
    pub worker: StreamWorkerConfig,
    /// Batching.
    pub runner: RunnerConfig,
    /// Where telemetry goes (`TELEMETRY_ADDR`).
    pub telemetry_addr: String,
    /// Events buffered while the sidecar is away (`TELEMETRY_BUFFER`).
    pub telemetry_buffer: usize,
}

fn number(
    problems: &mut Problems,
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &EnvVar,
    default: u64,
    zero_ok: bool,
) -> u64 {
    let parse = |raw: &str| match raw.parse::<u64>() {
        Ok(0) if !zero_ok => Err("must be greater than 0".to_owned()),
        Ok(value) => Ok(value),
        Err(_) => Err("must be a whole number".to_owned()),
    };
    problems
        .parse(var, lookup(var.name), parse)
        .unwrap_or(default)
}

impl StreamWorkerSettings {
    /// Where and how this worker ships its telemetry (`TELEMETRY_ADDR`,
    /// `TELEMETRY_BUFFER`, its owner id).
    pub fn shipper(&self) -> ShipperConfig {
        ShipperConfig {
            capacity: self.telemetry_buffer,
            ..ShipperConfig::new(
                self.telemetry_addr.clone(),
                "stream-worker",
                &self.lease.keeper.owner_id,
            )
        }
    }
}

/// Parses the stream worker's settings; `lookup` gives flags precedence over the environment.
pub fn parse(lookup: &dyn Fn(&str) -> Option<String>) -> Result<StreamWorkerSettings, ConfigError> {
    let mut problems = Problems::default();
    let lease = match config::lease_settings(lookup) {
        Ok(lease) => Some(lease),
        Err(err) => {
            for problem in err.problems {
                problems.add_raw(problem);
            }
            None
        }
    };
    let url = lookup(UPSTREAM_URL.name).unwrap_or_default();
    if url.is_empty() {
        problems.add(&UPSTREAM_URL, "is required (the upstream WebSocket URL)");
    }
    let mut upstream = WebSocketUpstreamConfig::for_feed(&url);
    if let Some(template) = lookup(UPSTREAM_SUBSCRIBE.name) {
        upstream.subscribe_template = template;
    }
    if let Some(pointer) = lookup(UPSTREAM_SEQ_POINTER.name) {
        upstream.seq_pointer = pointer;
    }
    if let Some(pointer) = lookup(UPSTREAM_ID_POINTER.name) {
        upstream.id_pointer = pointer;
    }
    upstream.max_frame_bytes = usize::try_from(number(
        &mut problems,
        lookup,
        &UPSTREAM_MAX_FRAME_BYTES,
        1 << 20,
        false,
    ))
    .unwrap_or(usize::MAX);
    if !url.is_empty()
        && let Err(errors) = upstream.validate()
    {
        for error in errors {
            problems.add_raw(format!("upstream: {error}"));
        }
    }
    let sink_url = lookup(SINK_URL.name).unwrap_or_default();
    let valid_sink = sink_url == "memory:"
        || ["redis://", "rediss://", "redis+unix://"]
            .iter()
            .any(|p| sink_url.starts_with(p));
    if !valid_sink {
        // Never echo the URL: it may carry a password.
        problems.add(&SINK_URL, "is required: redis://…, rediss://… or memory:");
    }
    let sink = SinkOptions {
        dedup_window: number(&mut problems, lookup, &SINK_DEDUP_WINDOW, 10_000, false),
        max_len: number(&mut problems, lookup, &SINK_MAX_LEN, 0, true),
    };
    let worker = StreamWorkerConfig {
        max_streams: usize::try_from(number(&mut problems, lookup, &MAX_STREAMS, 100, false))
            .unwrap_or(usize::MAX),
        discovery_interval: Duration::from_millis(number(
            &mut problems,
            lookup,
            &DISCOVERY_INTERVAL_MS,
            5_000,
            false,
        )),
        handoff_poll: Duration::from_millis(number(
            &mut problems,
            lookup,
            &HANDOFF_POLL_MS,
            250,
            false,
        )),
        drain_timeout: Duration::from_millis(number(
            &mut problems,
            lookup,
            &DRAIN_TIMEOUT_MS,
            20_000,
            false,
        )),
        register: lookup(STREAM_IDS.name)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    };
    if worker
        .register
        .iter()
        .any(|s| s.starts_with(leasehold_control::schema::RESERVED_PREFIX))
    {
        problems.add(
            &STREAM_IDS,
            "stream ids cannot start with the reserved prefix leasehold#",
        );
    }
    let runner = RunnerConfig {
        batch_max_events: usize::try_from(number(
            &mut problems,
            lookup,
            &BATCH_MAX_EVENTS,
            500,
            false,
        ))
        .unwrap_or(usize::MAX),
        batch_max_delay: Duration::from_millis(number(
            &mut problems,
            lookup,
            &BATCH_MAX_DELAY_MS,
            20,
            true,
        )),
        ..RunnerConfig::default()
    };
    let telemetry_addr =
        lookup(TELEMETRY_ADDR.name).unwrap_or_else(|| TELEMETRY_ADDR.default.to_owned());
    let telemetry_buffer = usize::try_from(number(
        &mut problems,
        lookup,
        &TELEMETRY_BUFFER,
        65_536,
        false,
    ))
    .unwrap_or(usize::MAX);
    let lease = problems.finish(lease)?;
    Ok(StreamWorkerSettings {
        lease: lease.expect("lease settings parsed without problems"),
        upstream,
        sink_url,
        sink,
        worker,
        runner,
        telemetry_addr,
        telemetry_buffer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_control::config::fixed_lookup as lookup;

    #[test]
    fn minimal_configuration_uses_the_defaults() {
        let settings = parse(&lookup(&[
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
            ("STREAM_IDS", "a, b,,c"),
        ]))
        .unwrap();
        assert_eq!(settings.worker.register, ["a", "b", "c"]);
        assert_eq!(settings.sink.dedup_window, 10_000);
        assert_eq!(settings.worker.discovery_interval, Duration::from_secs(5));
        assert_eq!(settings.upstream.seq_pointer, "/seq");
    }

    #[test]
    fn every_problem_is_listed_and_no_secret_echoed() {
        let err = parse(&lookup(&[
            ("SINK_URL", "postgres://user:hunter2@db/x"),
            ("LEASE_SECONDS", "0"),
            ("BATCH_MAX_EVENTS", "many"),
        ]))
        .unwrap_err();
        let text = err.to_string();
        for name in [
            "UPSTREAM_URL",
            "SINK_URL",
            "LEASE_SECONDS",
            "BATCH_MAX_EVENTS",
        ] {
            assert!(text.contains(name), "{name} missing: {text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
    }
}
