//! The dashboard's variables, read once with every problem reported at once.

use std::net::SocketAddr;
use std::time::Duration;

use leasehold_control::settings::{TableSettings, table_settings};
use leasehold_platform::settings::{
    ConfigError, Documented, Env, Fallback, Lookup, Parser, Setting, parse,
};
use leasehold_pool::settings::REDIS_URL;

use crate::collector::CollectorSettings;
use crate::model::streams::Thresholds;
use crate::sources::sidecars::{DiscoveryPolicy, Network, SidecarTarget, private_networks};
use crate::web::Access;

/// A bearer token: at least 16 characters that can travel in a header and a
/// cookie. Secrets Manager values often end in a newline: trimmed, not refused.
/// The problem is described, never the value.
const TOKEN: Parser<String> = Parser {
    parse: |raw| {
        if raw.len() < 16 {
            Err("must be at least 16 characters".into())
        } else if !crate::web::token_is_header_safe(raw) {
            Err(
                "may only hold visible ASCII without ; , \" or \\ (it travels in a header and a cookie)"
                    .into(),
            )
        } else {
            Ok(raw.to_owned())
        }
    },
    show: |_| "[redacted]".to_owned(),
};

/// Comma-separated CIDRs.
const NETWORKS: Parser<Vec<Network>> = Parser {
    parse: |raw| {
        let networks = raw
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(Network::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if networks.is_empty() {
            return Err("must list at least one network".into());
        }
        Ok(networks)
    },
    show: |networks| {
        networks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    },
};

/// A Redis URL for the sink (the stream workers' `SINK_URL` forms, without
/// `memory:`, which only `leasehold dev` can share). Never echoed: it may hold
/// a password.
const SINK_URL: Parser<String> = leasehold_sink::url::REDIS_SINK_URL_PARSER;

/// Longest Grafana link accepted.
pub const GRAFANA_URL_MAX: usize = 2_048;

/// A link to Grafana: `http`/`https` with a host, no user or password in it,
/// at most [`GRAFANA_URL_MAX`] bytes. The problem is described, never the
/// value (a pasted link may carry a credential).
const GRAFANA_URL: Parser<String> = Parser {
    parse: |raw| {
        if raw.len() > GRAFANA_URL_MAX {
            return Err(format!("must be at most {GRAFANA_URL_MAX} bytes"));
        }
        let url = url::Url::parse(raw).map_err(|_| "is not a URL".to_owned())?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must be an http:// or https:// URL".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "must not hold a user name or password (the link is shown on every trends page)"
                    .into(),
            );
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("must name a host".into());
        }
        Ok(url.to_string())
    },
    show: Clone::clone,
};

/// The `DASHBOARD_LISTEN` variable.
pub const DASHBOARD_LISTEN: Setting<SocketAddr> = Setting::new(
    "DASHBOARD_LISTEN",
    parse::SOCKET_ADDR,
    Fallback::Value(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
    "the dashboard's address (`--listen`); anything but loopback needs `DASHBOARD_TOKEN` or \
     `DASHBOARD_ALLOW_ANONYMOUS=true` (exit 2 otherwise)",
);
/// The `DASHBOARD_TOKEN` variable.
pub const DASHBOARD_TOKEN: Setting<String> = Setting::secret(
    "DASHBOARD_TOKEN",
    TOKEN,
    Fallback::Unset,
    "bearer token (at least 16 characters) for every page and API call; browsers use the \
     `/login` form, which sets an HTTP-only same-site session cookie derived from the token \
     (an HMAC with a 12-hour expiry, never the token itself; `POST /logout` clears it) (never \
     printed)",
);
/// The `DASHBOARD_ALLOW_ANONYMOUS` variable.
pub const DASHBOARD_ALLOW_ANONYMOUS: Setting<bool> = Setting::new(
    "DASHBOARD_ALLOW_ANONYMOUS",
    parse::BOOL,
    Fallback::Value(|| false),
    "`true`: listen beyond loopback without a token (behind an authenticating proxy)",
);
/// The `DASHBOARD_SIDECARS` variable.
pub const DASHBOARD_SIDECARS: Setting<Vec<String>> = Setting::new(
    "DASHBOARD_SIDECARS",
    parse::LIST,
    Fallback::Unset,
    "override (`--sidecars`): comma-separated sidecar base URLs; when set, exactly these are \
     polled (every address a host name resolves to) and nothing is discovered. Unset (the \
     normal case): sidecars are found through the `sidecar_url` that workers publish \
     ([lease-table.md](lease-table.md#finding-sidecars-sidecar_url))",
);
/// The `DASHBOARD_SIDECAR_NETWORKS` variable.
pub const DASHBOARD_SIDECAR_NETWORKS: Setting<Vec<Network>> = Setting::new(
    "DASHBOARD_SIDECAR_NETWORKS",
    NETWORKS,
    Fallback::Value(private_networks),
    "comma-separated CIDRs a discovered `sidecar_url` must lie in; link-local, EC2's IPv6 \
     metadata range (`fd00:ec2::/32`), NAT64 prefixes (`64:ff9b::/96`, `64:ff9b:1::/48`, \
     which reach any IPv4 address), unspecified, multicast, broadcast and (outside `dev`) \
     loopback addresses are refused whatever this says. Add your VPC's IPv6 or non-RFC 1918 \
     ranges here. *Addition.*",
);
/// The `DASHBOARD_TRUST_PROXY` variable.
pub const DASHBOARD_TRUST_PROXY: Setting<bool> = Setting::new(
    "DASHBOARD_TRUST_PROXY",
    parse::BOOL,
    Fallback::Value(|| false),
    "`true`: a proxy in front terminates TLS and sets `X-Forwarded-Proto`; `https` there \
     marks the token cookie `Secure`. Leave `false` when clients reach the dashboard directly \
     (they could send the header themselves). *Addition.*",
);
/// The `DASHBOARD_ALLOWED_HOSTS` variable.
pub const DASHBOARD_ALLOWED_HOSTS: Setting<Vec<String>> = Setting::new(
    "DASHBOARD_ALLOWED_HOSTS",
    parse::LIST,
    Fallback::Unset,
    "host names (no port) the dashboard answers to besides loopback names and addresses; any \
     other `Host` gets 421. The check is on whenever this is set, and always for a loopback \
     dashboard without a token (DNS rebinding). *Addition.*",
);
/// The `DASHBOARD_REFRESH_MS` variable.
pub const DASHBOARD_REFRESH_MS: Setting<Duration> = Setting::new(
    "DASHBOARD_REFRESH_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(2_000)),
    "how often the dashboard re-reads its sources (and pages refresh themselves) while the \
     lease table is small; see the next row",
);
/// The `DASHBOARD_SCAN_ITEMS_PER_SECOND` variable.
pub const DASHBOARD_SCAN_ITEMS_PER_SECOND: Setting<u64> = Setting::new(
    "DASHBOARD_SCAN_ITEMS_PER_SECOND",
    parse::POSITIVE,
    Fallback::Value(|| 1_000),
    "lease records per second the dashboard may scan on average (eventually consistent): the \
     refresh interval is `max(DASHBOARD_REFRESH_MS, records ÷ this)`, at most 60 s, so the \
     scan's read units stay bounded as the table grows \
     ([lease-table.md](lease-table.md#what-readers-cost))",
);
/// The `DASHBOARD_STOPPED_AFTER_SECONDS` variable.
pub const DASHBOARD_STOPPED_AFTER_SECONDS: Setting<Duration> = Setting::new(
    "DASHBOARD_STOPPED_AFTER_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(300)),
    "no checkpoint for this long, while behind or with unknown lag, makes a stream's verdict \
     `stopped` (not for a session-mode stream, whose table checkpoint is written only every \
     `CHECKPOINT_INTERVAL_MS`: its verdict rests on the lag its worker reports, and a dead \
     worker shows as its session expiring)",
);
/// The `DASHBOARD_SINK_URL` variable.
pub const DASHBOARD_SINK_URL: Setting<String> = Setting::secret(
    "DASHBOARD_SINK_URL",
    SINK_URL,
    Fallback::Unset,
    "the stream workers' Redis sink (`redis://…`, `rediss://…`, `redis+unix://…`, \
     `redis+cluster://…`, `rediss+cluster://…`; may hold a password: never printed; `memory:` \
     is refused, since only `leasehold dev` has an in-process sink and it shares it with its \
     dashboard by itself). When set, a stream's page reads that stream's newest sink entry \
     (`XREVRANGE leasehold:sink:{id} + - COUNT 1`, within 0.5 s, connected on first use) and \
     shows its `seq` next to the checkpoint with the difference; unset, unreachable or \
     refused, the page says so. The `dashboard` Redis user may run that read \
     ([deploy/redis-acl.conf](../deploy/redis-acl.conf)). *Addition.*",
);
/// The `DASHBOARD_GRAFANA_URL` variable.
// Secret only in that a refused value is never echoed (a pasted link can
// carry a credential); an accepted one is shown on the trends page.
pub const DASHBOARD_GRAFANA_URL: Setting<String> = Setting::secret(
    "DASHBOARD_GRAFANA_URL",
    GRAFANA_URL,
    Fallback::Unset,
    "a Grafana dashboard the trends page links to for longer history: `http://` or `https://` \
     with a host, no user name or password, at most 2,048 bytes; anything else stops the \
     dashboard at start with a message that does not repeat the value (never printed, since a \
     pasted link can carry a credential; an accepted one is shown on the trends page). \
     *Addition.*",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &DASHBOARD_LISTEN,
    &DASHBOARD_TOKEN,
    &DASHBOARD_ALLOW_ANONYMOUS,
    &DASHBOARD_SIDECARS,
    &DASHBOARD_SIDECAR_NETWORKS,
    &DASHBOARD_TRUST_PROXY,
    &DASHBOARD_ALLOWED_HOSTS,
    &DASHBOARD_REFRESH_MS,
    &DASHBOARD_SCAN_ITEMS_PER_SECOND,
    &DASHBOARD_STOPPED_AFTER_SECONDS,
    &DASHBOARD_SINK_URL,
    &DASHBOARD_GRAFANA_URL,
];

/// Everything `leasehold dashboard` reads from the environment, validated at once.
#[derive(Debug)]
pub struct DashboardSettings {
    /// The lease table.
    pub table: TableSettings,
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// Sidecar sources (`DASHBOARD_SIDECARS`, the override).
    pub sidecars: Vec<SidecarTarget>,
    /// Which discovered sidecars may be polled.
    pub discovery: DiscoveryPolicy,
    /// Proxy trust and the Host allow-list.
    pub access: Access,
    /// The pool's Redis, if the pool is shown (may hold a password: never print).
    pub redis_url: Option<leasehold_platform::settings::Redacted<String>>,
    /// Collector timings and thresholds.
    pub collector: CollectorSettings,
    /// The sink's Redis, if stream pages show its last seq (may hold a
    /// password: never print).
    pub sink_url: Option<leasehold_platform::settings::Redacted<String>>,
    /// Grafana, linked from the trends page.
    pub grafana_url: Option<String>,
}

/// Reads the dashboard's settings; `lookup` gives flags precedence over the environment.
pub fn parse(lookup: Lookup) -> Result<DashboardSettings, ConfigError> {
    let mut env = Env::new(lookup);
    let table = table_settings(&mut env);
    let listen = env.get(&DASHBOARD_LISTEN);
    // A token that is set but invalid is reported as such, not as a missing one.
    let token_given = env.raw(DASHBOARD_TOKEN.name).is_some();
    let token = env.optional(&DASHBOARD_TOKEN);
    let anonymous = env.get(&DASHBOARD_ALLOW_ANONYMOUS);
    if !listen.ip().is_loopback() && !token_given && !anonymous {
        env.problem(
            DASHBOARD_LISTEN.name,
            format_args!(
                "{listen} is reachable from other hosts: set {} (or {}=true behind an authenticating proxy)",
                DASHBOARD_TOKEN.name, DASHBOARD_ALLOW_ANONYMOUS.name
            ),
        );
    }
    let mut sidecars = Vec::new();
    for raw in env.optional(&DASHBOARD_SIDECARS).unwrap_or_default() {
        match SidecarTarget::parse(&raw) {
            Ok(target) => sidecars.push(target),
            Err(problem) => env.problem(DASHBOARD_SIDECARS.name, problem),
        }
    }
    let discovery = DiscoveryPolicy {
        networks: env.get(&DASHBOARD_SIDECAR_NETWORKS),
        allow_loopback: false,
    };
    let access = Access::new(
        listen,
        token_given,
        env.get(&DASHBOARD_TRUST_PROXY),
        env.optional(&DASHBOARD_ALLOWED_HOSTS).unwrap_or_default(),
    );
    let refresh = env.get(&DASHBOARD_REFRESH_MS);
    let scan_items_per_second =
        u32::try_from(env.get(&DASHBOARD_SCAN_ITEMS_PER_SECOND)).unwrap_or(u32::MAX);
    let stopped_after = env.get(&DASHBOARD_STOPPED_AFTER_SECONDS);
    let redis_url = env.optional(&REDIS_URL).map(Into::into);
    let sink_url = env.optional(&DASHBOARD_SINK_URL).map(Into::into);
    let grafana_url = env.optional(&DASHBOARD_GRAFANA_URL);
    env.finish(DashboardSettings {
        sink_url,
        grafana_url,
        table,
        listen,
        token,
        sidecars,
        discovery,
        access,
        redis_url,
        collector: CollectorSettings {
            refresh,
            scan_items_per_second,
            thresholds: Thresholds {
                stopped_after_ms: i64::try_from(stopped_after.as_millis()).unwrap_or(i64::MAX),
                ..Thresholds::default()
            },
            ..CollectorSettings::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use leasehold_platform::settings::fixed_lookup;

    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<DashboardSettings, ConfigError> {
        parse(&fixed_lookup(pairs))
    }

    #[test]
    fn loopback_by_default_and_elsewhere_only_with_a_token() {
        let defaults = settings(&[]).unwrap();
        assert!(defaults.listen.ip().is_loopback());
        assert!(defaults.token.is_none());
        assert_eq!(defaults.collector.refresh, Duration::from_secs(2));
        assert_eq!(defaults.collector.scan_items_per_second, 1_000);
        assert_eq!(defaults.discovery, DiscoveryPolicy::default());
        assert_eq!(
            defaults.access.allowed_hosts,
            Some(Vec::new()),
            "anonymous on loopback: the Host check is on"
        );
        assert!(!defaults.access.trust_proxy);
        let behind = settings(&[
            ("DASHBOARD_SIDECAR_NETWORKS", "10.20.0.0/16, fd00::/8"),
            ("DASHBOARD_ALLOWED_HOSTS", "Dash.Example.com"),
            ("DASHBOARD_TRUST_PROXY", "true"),
        ])
        .unwrap();
        assert_eq!(behind.discovery.networks.len(), 2);
        assert!(
            !behind.discovery.allow_loopback,
            "never loopback outside dev"
        );
        assert_eq!(
            behind.access.allowed_hosts,
            Some(vec!["dash.example.com".to_owned()])
        );
        let err = settings(&[("DASHBOARD_LISTEN", "0.0.0.0:8080")])
            .err()
            .unwrap();
        assert!(err.to_string().contains("DASHBOARD_TOKEN"), "{err}");
        assert!(
            settings(&[
                ("DASHBOARD_LISTEN", "0.0.0.0:8080"),
                ("DASHBOARD_ALLOW_ANONYMOUS", "true")
            ])
            .is_ok()
        );
        let open = settings(&[
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
    fn the_sink_and_grafana_links_are_optional_and_validated() {
        let defaults = settings(&[]).unwrap();
        assert!(defaults.sink_url.is_none() && defaults.grafana_url.is_none());
        let set = settings(&[
            ("DASHBOARD_SINK_URL", "rediss://dashboard:pw@cache:6379/0"),
            (
                "DASHBOARD_GRAFANA_URL",
                "https://grafana.example/d/leasehold?orgId=1",
            ),
        ])
        .unwrap();
        assert!(set.sink_url.is_some());
        assert_eq!(
            set.grafana_url.as_deref(),
            Some("https://grafana.example/d/leasehold?orgId=1")
        );
        let long = format!("https://grafana.example/{}", "a".repeat(GRAFANA_URL_MAX));
        for bad in [
            "javascript:alert('CANARY')",
            "ftp://grafana.example/CANARY",
            "https://admin:CANARY@grafana.example/",
            "https://CANARY@grafana.example/",
            "not a url CANARY",
            "data:text/html,CANARY",
            long.as_str(),
        ] {
            let err = settings(&[("DASHBOARD_GRAFANA_URL", bad)])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            let text = err.to_string();
            assert!(text.contains("DASHBOARD_GRAFANA_URL"), "{text}");
            assert!(!text.contains("CANARY"), "{text}");
            assert!(!text.contains("aaaaaaaa"), "the value is not echoed");
        }
    }

    #[test]
    fn bad_tokens_are_refused_without_echoing_them() {
        for bad in [
            "short-CANARY",
            "CANARY;with-a-semicolon-x",
            "CANARY with spaces inside",
        ] {
            let err = settings(&[("DASHBOARD_TOKEN", bad)])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(!err.to_string().contains("CANARY"), "{err}");
        }
        let err = settings(&[("DASHBOARD_SIDECAR_NETWORKS", "10.0.0.1/8,nope")])
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("DASHBOARD_SIDECAR_NETWORKS"),
            "{err}"
        );
        for bad in ["memory:", "http://user:CANARY@cache"] {
            let err = settings(&[("DASHBOARD_SINK_URL", bad)])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(err.to_string().contains("DASHBOARD_SINK_URL"), "{err}");
            assert!(!err.to_string().contains("CANARY"), "{err}");
        }
        let err = settings(&[("DASHBOARD_SIDECARS", "http://h:1/path,nope")])
            .err()
            .unwrap();
        assert_eq!(err.problems.len(), 2, "{err}");
    }
}
