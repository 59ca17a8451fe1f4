//! `leasehold dashboard`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold_control::clock::SystemClock;
use leasehold_control::config::{
    self, ConfigError, DASHBOARD_ALLOW_ANONYMOUS, DASHBOARD_LISTEN, DASHBOARD_REFRESH_MS,
    DASHBOARD_SIDECARS, DASHBOARD_STOPPED_AFTER_SECONDS, DASHBOARD_TOKEN, Problems,
};
use leasehold_control::store::dynamodb::{DynamoLeaseStore, load_sdk_config};
use leasehold_dashboard::pool::{BusReader, PoolReader};
use leasehold_dashboard::sidecars::SidecarTarget;
use leasehold_dashboard::streams::Thresholds;
use leasehold_dashboard::{CollectorSettings, Dashboard, DashboardConfig, Sources};
use leasehold_worker::broker::bus::BusConnector;

use crate::Failure;
use crate::stream::shutdown_on_signal;

/// `leasehold dashboard`: flags mirror the environment variables.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// HTTP address; anything but loopback also needs DASHBOARD_TOKEN [env: DASHBOARD_LISTEN]
    #[arg(long)]
    listen: Option<String>,
    /// Comma-separated sidecar base URLs, e.g. http://sidecars.local:9464 [env: DASHBOARD_SIDECARS]
    #[arg(long)]
    sidecars: Option<String>,
}

/// Everything `leasehold dashboard` reads from the environment, validated at once.
pub struct DashboardSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// Sidecar sources.
    pub sidecars: Vec<SidecarTarget>,
    /// Collector timings and thresholds.
    pub collector: CollectorSettings,
}

/// Parses the dashboard's own settings (the table and Redis come separately).
pub fn dashboard_settings(
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Problems,
) -> DashboardSettings {
    let raw = lookup(DASHBOARD_LISTEN.name).unwrap_or_else(|| DASHBOARD_LISTEN.default.into());
    let listen = problems
        .parse(&DASHBOARD_LISTEN, Some(raw), |raw| {
            raw.parse::<SocketAddr>()
                .map_err(|_| "must be HOST:PORT with an IP address")
        })
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    // Secrets Manager values often end in a newline: trimmed, not refused.
    let token = lookup(DASHBOARD_TOKEN.name)
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    if let Some(token) = &token {
        // The problem is described, never the value.
        if token.len() < 16 {
            problems.add(&DASHBOARD_TOKEN, "must be at least 16 characters");
        }
        if !leasehold_dashboard::http::token_is_header_safe(token) {
            problems.add(
                &DASHBOARD_TOKEN,
                "may only hold visible ASCII without ; , \" or \\ (it travels in a header and a cookie)",
            );
        }
    }
    let anonymous = problems
        .parse(
            &DASHBOARD_ALLOW_ANONYMOUS,
            lookup(DASHBOARD_ALLOW_ANONYMOUS.name),
            |raw| match raw {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err("must be true or false"),
            },
        )
        .unwrap_or(false);
    if !listen.ip().is_loopback() && token.is_none() && !anonymous {
        problems.add(
            &DASHBOARD_LISTEN,
            format_args!(
                "{listen} is reachable from other hosts: set {} (or {}=true behind an authenticating proxy)",
                DASHBOARD_TOKEN.name, DASHBOARD_ALLOW_ANONYMOUS.name
            ),
        );
    }
    let mut sidecars = Vec::new();
    for raw in lookup(DASHBOARD_SIDECARS.name)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.trim().is_empty())
    {
        match SidecarTarget::parse(raw) {
            Ok(target) => sidecars.push(target),
            Err(problem) => problems.add(&DASHBOARD_SIDECARS, problem),
        }
    }
    let refresh = problems
        .parse(
            &DASHBOARD_REFRESH_MS,
            lookup(DASHBOARD_REFRESH_MS.name),
            config::positive_number,
        )
        .unwrap_or(2_000);
    let stopped_after = problems
        .parse(
            &DASHBOARD_STOPPED_AFTER_SECONDS,
            lookup(DASHBOARD_STOPPED_AFTER_SECONDS.name),
            config::positive_number,
        )
        .unwrap_or(300);
    DashboardSettings {
        listen,
        token,
        sidecars,
        collector: CollectorSettings {
            refresh: Duration::from_millis(refresh),
            thresholds: Thresholds {
                stopped_after_ms: stopped_after.saturating_mul(1000) as i64,
                ..Thresholds::default()
            },
            ..CollectorSettings::default()
        },
    }
}

/// Runs the dashboard until SIGTERM or Ctrl-C.
pub async fn dashboard(args: DashboardArgs) -> Result<(), Failure> {
    let lookup = |name: &str| {
        let flag = match name {
            "DASHBOARD_LISTEN" => args.listen.clone(),
            "DASHBOARD_SIDECARS" => args.sidecars.clone(),
            _ => None,
        };
        flag.or_else(|| config::process_env(name))
    };
    let mut problems = Problems::default();
    let table = config::table_settings(&lookup, &mut problems);
    let settings = dashboard_settings(&lookup, &mut problems);
    // Without REDIS_URL the dashboard shows streams only; with it, the form is
    // checked now and the connection is made (and remade) by the reader.
    let pool: Option<Arc<dyn PoolReader>> = match lookup(config::REDIS_URL.name) {
        Some(url) => match BusConnector::redis(url) {
            Ok(connector) => Some(Arc::new(BusReader::new(connector))),
            Err(err) => {
                problems.add(&config::REDIS_URL, err);
                None
            }
        },
        None => None,
    };
    let sdk = load_sdk_config().await;
    if sdk.region().is_none() {
        problems.add(
            &config::AWS_REGION,
            "not set, and no region in the AWS profile",
        );
    }
    problems
        .finish(())
        .map_err(|err: ConfigError| Failure::Config(err))?;
    let store = DynamoLeaseStore::from_sdk_config(&sdk, table.table);
    let shutdown = shutdown_on_signal();
    let dashboard = Dashboard::start(
        DashboardConfig {
            listen: settings.listen,
            token: settings.token,
            sources: Sources {
                leases: Arc::new(store),
                pool,
                sidecars: settings.sidecars,
            },
            settings: settings.collector,
            clock: Arc::new(SystemClock),
        },
        shutdown,
    )
    .await
    .map_err(|err| Failure::Runtime(err.into()))?;
    println!("dashboard: http://{}/", dashboard.addr);
    dashboard.finished().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<DashboardSettings, ConfigError> {
        let lookup = config::fixed_lookup(pairs);
        let mut problems = Problems::default();
        let settings = dashboard_settings(&lookup, &mut problems);
        problems.finish(settings)
    }

    #[test]
    fn loopback_by_default_and_elsewhere_only_with_a_token() {
        let settings = parse(&[]).unwrap();
        assert!(settings.listen.ip().is_loopback());
        assert!(settings.token.is_none());
        let err = parse(&[("DASHBOARD_LISTEN", "0.0.0.0:8080")])
            .err()
            .unwrap();
        assert!(err.to_string().contains("DASHBOARD_TOKEN"), "{err}");
        assert!(
            parse(&[
                ("DASHBOARD_LISTEN", "0.0.0.0:8080"),
                ("DASHBOARD_ALLOW_ANONYMOUS", "true")
            ])
            .is_ok()
        );
        let open = parse(&[
            ("DASHBOARD_LISTEN", "0.0.0.0:8080"),
            ("DASHBOARD_TOKEN", "abcdefghijklmnop\n"),
        ])
        .unwrap();
        assert_eq!(
            open.token.as_deref(),
            Some("abcdefghijklmnop"),
            "a trailing newline is trimmed"
        );
    }

    #[test]
    fn bad_tokens_are_refused_without_echoing_them() {
        for bad in [
            "short-CANARY",
            "CANARY;with-a-semicolon-x",
            "CANARY with spaces inside",
        ] {
            let err = parse(&[("DASHBOARD_TOKEN", bad)])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(!err.to_string().contains("CANARY"), "{err}");
        }
        let err = parse(&[("DASHBOARD_SIDECARS", "http://h:1/path,nope")])
            .err()
            .unwrap();
        assert_eq!(err.problems.len(), 2, "{err}");
    }
}
