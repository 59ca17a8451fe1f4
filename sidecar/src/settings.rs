//! The sidecar's variables, read once with every problem reported at once.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_control::pacing::ScanPacing;
use leasehold_control::settings::{LeaseSettings, lease_settings};
use leasehold_platform::settings::{
    ConfigError, Documented, Env, Fallback, Lookup, Parser, Setting, parse,
};
use leasehold_pool::settings::REDIS_URL;
use leasehold_telemetry::settings::TELEMETRY_ADDR;

use crate::cloudwatch::{CloudWatchConfig, Mode};

/// `off`, `emf` or `api`.
const MODE: Parser<Mode> = Parser {
    parse: |raw| match raw {
        "off" => Ok(Mode::Off),
        "emf" => Ok(Mode::Emf),
        "api" => Ok(Mode::Api),
        _ => Err("must be off, emf or api".into()),
    },
    show: |mode| {
        match mode {
            Mode::Off => "off",
            Mode::Emf => "emf",
            Mode::Api => "api",
        }
        .to_owned()
    },
};

/// The observer scans this often while the table is small.
pub const OBSERVER_SCAN_BASE: Duration = Duration::from_secs(15);

/// The `SIDECAR_LISTEN` variable, defined with the telemetry settings because
/// workers read its port too (the `sidecar_url` they derive).
pub use leasehold_telemetry::settings::SIDECAR_LISTEN;
/// The `WORKER_SILENCE_MS` variable.
pub const WORKER_SILENCE_MS: Setting<Duration> = Setting::new(
    "WORKER_SILENCE_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(5_000)),
    "the sidecar reports `leasehold_worker_up 0` after this long without any event \
     (heartbeats included)",
);
/// The `STREAM_SERIES_IDLE_SECONDS` variable.
pub const STREAM_SERIES_IDLE_SECONDS: Setting<Duration> = Setting::new(
    "STREAM_SERIES_IDLE_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(120)),
    "the memory of per-stream gauges (`stream_id` label) is freed this long after their last \
     update; they leave the export as soon as the worker no longer holds the stream or stops \
     reporting ([metrics.md](metrics.md))",
);
/// The `SIDECAR_OBSERVER` variable.
pub const SIDECAR_OBSERVER: Setting<bool> = Setting::new(
    "SIDECAR_OBSERVER",
    parse::BOOL,
    Fallback::Value(|| true),
    "`true`: compete for the observer lease and, while holding it, publish the cluster gauges \
     (needs the lease settings and an AWS region); `false` or `--no-observer`: never",
);
/// The `SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND` variable.
pub const SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND: Setting<u64> = Setting::new(
    "SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND",
    parse::POSITIVE,
    Fallback::Value(|| 500),
    "lease records per second the observer may scan on average (eventually consistent): it \
     scans every `max(15 s, records ÷ this)`, at most 60 s \
     ([lease-table.md](lease-table.md#what-readers-cost))",
);
/// The `CLOUDWATCH_MODE` variable.
pub const CLOUDWATCH_MODE: Setting<Mode> = Setting::new(
    "CLOUDWATCH_MODE",
    MODE,
    Fallback::Value(|| Mode::Off),
    "`off`, `emf` (Embedded Metric Format lines on stdout for the awslogs driver) or `api` \
     (`PutMetricData`)",
);
/// The `CLOUDWATCH_NAMESPACE` variable.
pub const CLOUDWATCH_NAMESPACE: Setting<String> = Setting::new(
    "CLOUDWATCH_NAMESPACE",
    parse::TEXT,
    Fallback::Value(|| "Leasehold".to_owned()),
    "CloudWatch namespace for every metric",
);
/// The `CLOUDWATCH_INTERVAL_SECONDS` variable.
pub const CLOUDWATCH_INTERVAL_SECONDS: Setting<Duration> = Setting::new(
    "CLOUDWATCH_INTERVAL_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(60)),
    "how often the sidecar publishes to CloudWatch",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &SIDECAR_LISTEN,
    &WORKER_SILENCE_MS,
    &STREAM_SERIES_IDLE_SECONDS,
    &SIDECAR_OBSERVER,
    &SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND,
    &CLOUDWATCH_MODE,
    &CLOUDWATCH_NAMESPACE,
    &CLOUDWATCH_INTERVAL_SECONDS,
];

/// Everything `leasehold sidecar` needs apart from AWS clients.
#[derive(Debug, Clone)]
pub struct SidecarSettings {
    /// HTTP address.
    pub listen: SocketAddr,
    /// Telemetry address.
    pub telemetry: SocketAddr,
    /// Worker called down after this long without events.
    pub worker_silence: Duration,
    /// Per-stream series disappear this long after their last update.
    pub stream_series_idle: Duration,
    /// The observer lease settings, when this sidecar competes for it.
    pub observer: Option<LeaseSettings>,
    /// How the observer's scans are paced.
    pub observer_pacing: ScanPacing,
    /// The pool's Redis for the pool gauges (may hold a password: never print).
    pub redis_url: Option<leasehold_platform::settings::Redacted<String>>,
    /// CloudWatch export.
    pub cloudwatch: CloudWatchConfig,
}

/// Reads the sidecar's settings; `lookup` gives flags precedence over the environment.
pub fn parse(lookup: Lookup) -> Result<SidecarSettings, ConfigError> {
    let mut env = Env::new(lookup);
    let listen = env.get(&SIDECAR_LISTEN);
    let telemetry = env.get(&TELEMETRY_ADDR);
    if !telemetry.ip().is_loopback() {
        // The telemetry port authenticates nothing: whoever reaches it can
        // feed this sidecar events (and so its metrics and /status).
        env.problem(
            TELEMETRY_ADDR.name,
            format!(
                "{telemetry} is not a loopback address: the telemetry port takes events from anyone who reaches it; \
                 the worker shares the task's network namespace and ships to 127.0.0.1"
            ),
        );
    }
    let worker_silence = env.get(&WORKER_SILENCE_MS);
    let stream_series_idle = env.get(&STREAM_SERIES_IDLE_SECONDS);
    let observer = env.get(&SIDECAR_OBSERVER).then(|| lease_settings(&mut env));
    let observer_pacing = ScanPacing::new(
        OBSERVER_SCAN_BASE,
        u32::try_from(env.get(&SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND)).unwrap_or(u32::MAX),
    );
    let redis_url = env.optional(&REDIS_URL).map(Into::into);
    let cloudwatch = CloudWatchConfig {
        mode: env.get(&CLOUDWATCH_MODE),
        namespace: env.get(&CLOUDWATCH_NAMESPACE),
        interval: env.get(&CLOUDWATCH_INTERVAL_SECONDS),
    };
    env.finish(SidecarSettings {
        listen,
        telemetry,
        worker_silence,
        stream_series_idle,
        observer,
        observer_pacing,
        redis_url,
        cloudwatch,
    })
}

#[cfg(test)]
mod tests {
    use leasehold_platform::settings::fixed_lookup;

    use super::*;

    #[test]
    fn defaults_and_every_problem_at_once() {
        let settings = parse(&fixed_lookup(&[("OWNER_ID", "sidecar-1")])).unwrap();
        assert_eq!(settings.listen, SocketAddr::from(([0, 0, 0, 0], 9464)));
        assert_eq!(settings.telemetry, SocketAddr::from(([127, 0, 0, 1], 9465)));
        assert_eq!(settings.cloudwatch.mode, Mode::Off);
        assert_eq!(settings.stream_series_idle, Duration::from_secs(120));
        assert!(settings.observer.is_some());
        assert_eq!(
            settings.observer_pacing.interval(10_000),
            Duration::from_secs(20),
            "10,000 records at 500 per second"
        );
        let err = parse(&fixed_lookup(&[
            ("SIDECAR_LISTEN", "everywhere"),
            ("CLOUDWATCH_MODE", "loud"),
            ("SIDECAR_OBSERVER", "maybe"),
        ]))
        .unwrap_err();
        assert_eq!(err.problems.len(), 3, "{err}");
    }

    #[test]
    fn the_telemetry_port_listens_on_loopback_only() {
        for refused in ["0.0.0.0:9465", "10.0.1.5:9465", "[::]:9465"] {
            let err = parse(&fixed_lookup(&[("TELEMETRY_ADDR", refused)])).unwrap_err();
            assert!(err.to_string().contains("TELEMETRY_ADDR"), "{err}");
        }
        assert!(parse(&fixed_lookup(&[("TELEMETRY_ADDR", "[::1]:9465")])).is_ok());
    }
}
