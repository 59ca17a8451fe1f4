//! The lease settings every lease holder reads: table, timings, identity.

use std::time::Duration;

use leasehold_platform::settings::{Documented, Env, Fallback, Parser, Setting, parse};

use crate::keeper::KeeperConfig;

/// A DynamoDB table name (3-255 of a-z A-Z 0-9 _ - .).
const TABLE_NAME: Parser<String> = Parser {
    parse: |raw| {
        let valid = raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if (3..=255).contains(&raw.len()) && valid {
            Ok(raw.to_owned())
        } else {
            Err("is not a DynamoDB table name (3-255 of a-z A-Z 0-9 _ - .)".into())
        }
    },
    show: Clone::clone,
};

/// An identity written into records: 1 to 256 characters.
const IDENTITY: Parser<String> = Parser {
    parse: |raw| {
        if raw.is_empty() || raw.len() > 256 {
            Err("must be 1 to 256 characters".into())
        } else {
            Ok(raw.to_owned())
        }
    },
    show: Clone::clone,
};

/// The `LEASE_TABLE` variable.
pub const LEASE_TABLE: Setting<String> = Setting::new(
    "LEASE_TABLE",
    TABLE_NAME,
    Fallback::Value(|| "websocket-leases".to_owned()),
    "DynamoDB table holding the leases (string partition key `stream_id`); the name is the \
     original lease specification's",
);
/// The `LEASE_SECONDS` variable.
pub const LEASE_SECONDS: Setting<Duration> = Setting::new(
    "LEASE_SECONDS",
    parse::POSITIVE_SECONDS,
    Fallback::Value(|| Duration::from_secs(30)),
    "lease duration in seconds; a crashed holder's streams are taken over after about this \
     long",
);
/// The `LEASE_RENEW_INTERVAL_MS` variable.
pub const LEASE_RENEW_INTERVAL_MS: Setting<Duration> = Setting::new(
    "LEASE_RENEW_INTERVAL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Derived("LEASE_SECONDS/3"),
    "how often each held lease is renewed (10 s by default: the original specification's 30 s \
     lease renewed every 10 s)",
);
/// The `LEASE_SAFETY_MARGIN_MS` variable.
pub const LEASE_SAFETY_MARGIN_MS: Setting<Duration> = Setting::new(
    "LEASE_SAFETY_MARGIN_MS",
    parse::MILLIS,
    Fallback::Derived("LEASE_SECONDS/10"),
    "the holder stops side effects this long before its lease could expire (deadline = renew \
     sent + lease − margin); must be shorter than the lease",
);
/// The `LEASE_SKEW_MARGIN_MS` variable.
pub const LEASE_SKEW_MARGIN_MS: Setting<Duration> = Setting::new(
    "LEASE_SKEW_MARGIN_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::from_millis(1000)),
    "a taker waits this long past `lease_expires_at` before taking over, to absorb clock skew \
     between hosts",
);
/// How holders prove they are alive (`LEASE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseMode {
    /// One lease per stream, renewed by its holder: the original lease
    /// specification's protocol, shared with seed-style clients.
    #[default]
    PerStream,
    /// One session record per worker, renewed by it; every stream it holds
    /// names the session and lives as long as it does (docs/lease-table.md).
    Session,
}

impl LeaseMode {
    /// The value of `LEASE_MODE` and of the mode record's `lease_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::PerStream => "per-stream",
            LeaseMode::Session => "session",
        }
    }
}

/// Parses a `LEASE_MODE` value (also `leasehold dev --lease-mode`).
pub fn parse_lease_mode(raw: &str) -> Result<LeaseMode, String> {
    match raw {
        "per-stream" => Ok(LeaseMode::PerStream),
        "session" => Ok(LeaseMode::Session),
        _ => Err("must be per-stream or session".into()),
    }
}

const LEASE_MODE_PARSER: Parser<LeaseMode> = Parser {
    parse: parse_lease_mode,
    show: |mode| mode.as_str().to_owned(),
};

/// The `LEASE_MODE` variable.
pub const LEASE_MODE: Setting<LeaseMode> = Setting::new(
    "LEASE_MODE",
    LEASE_MODE_PARSER,
    Fallback::Value(|| LeaseMode::PerStream),
    "`per-stream`: one renewed lease per stream (the original specification's protocol). \
     `session`: one renewed session record per worker (`leasehold#session#{owner}`), every \
     stream it holds lives by it, a takeover is a two-item transaction \
     ([lease-table.md](lease-table.md#session-mode-lease_modesession)). The table declares \
     its mode in `leasehold#mode`; a stream worker of the other mode exits 2",
);
/// The `CHECKPOINT_INTERVAL_MS` variable.
pub const CHECKPOINT_INTERVAL_MS: Setting<Duration> = Setting::new(
    "CHECKPOINT_INTERVAL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(300_000)),
    "session mode: how often a held stream's sink-confirmed checkpoint is written to the \
     lease table (also on release and hand-off); a takeover resumes from the sink's last \
     sequence, so this bounds only how stale `checkpoint` reads. In `per-stream` mode the \
     checkpoint rides on every renew at no extra write and this is not used",
);
/// The `OWNER_ID` variable.
pub const OWNER_ID: Setting<String> = Setting::new(
    "OWNER_ID",
    IDENTITY,
    Fallback::Derived("ECS task id, else hostname"),
    "this process's identity in `owner_id`; `stream-worker` reads the task id from the ECS \
     task metadata endpoint v4, the sidecar uses the host name (1 to 256 characters)",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &LEASE_TABLE,
    &LEASE_SECONDS,
    &LEASE_RENEW_INTERVAL_MS,
    &LEASE_SAFETY_MARGIN_MS,
    &LEASE_SKEW_MARGIN_MS,
    &LEASE_MODE,
    &CHECKPOINT_INTERVAL_MS,
    &OWNER_ID,
];

/// Where the lease table is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSettings {
    /// Table name.
    pub table: String,
}

/// Everything a lease holder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Table name.
    pub table: TableSettings,
    /// Keeper timings and identity.
    pub keeper: KeeperConfig,
}

/// Reads the table name alone (operator commands need nothing more).
pub fn table_settings(env: &mut Env) -> TableSettings {
    TableSettings {
        table: env.get(&LEASE_TABLE),
    }
}

/// Reads the lease settings; problems go to `env`, reported with the caller's.
pub fn lease_settings(env: &mut Env) -> LeaseSettings {
    let table = table_settings(env);
    let mode = env.get(&LEASE_MODE);
    let checkpoint_interval = env.get(&CHECKPOINT_INTERVAL_MS);
    let lease = env.get(&LEASE_SECONDS);
    let renew = env.or(&LEASE_RENEW_INTERVAL_MS, lease / 3);
    let safety = env.or(&LEASE_SAFETY_MARGIN_MS, lease / 10);
    let skew = env.get(&LEASE_SKEW_MARGIN_MS);
    if safety >= lease {
        env.problem(
            LEASE_SAFETY_MARGIN_MS.name,
            format_args!(
                "{} ms must be shorter than the lease ({} ms)",
                safety.as_millis(),
                lease.as_millis()
            ),
        );
    } else if renew >= lease - safety {
        env.problem(
            LEASE_RENEW_INTERVAL_MS.name,
            format_args!(
                "{} ms leaves no time to renew before the holder's deadline \
                 (lease {} ms - safety margin {} ms)",
                renew.as_millis(),
                lease.as_millis(),
                safety.as_millis()
            ),
        );
    }
    let owner_id = env.optional(&OWNER_ID).unwrap_or_else(default_owner_id);
    LeaseSettings {
        table,
        keeper: KeeperConfig {
            owner_id,
            lease,
            renew_interval: renew,
            safety_margin: safety,
            skew_margin: skew,
            retry: leasehold_platform::Backoff::default(),
            mode,
            checkpoint_interval,
        },
    }
}

/// The host name, which on ECS/Fargate is unique per task.
pub fn default_owner_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("leasehold-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use leasehold_platform::settings::{ConfigError, fixed_lookup};

    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<LeaseSettings, ConfigError> {
        let lookup = fixed_lookup(pairs);
        let mut env = Env::new(&lookup);
        let settings = lease_settings(&mut env);
        env.finish(settings)
    }

    #[test]
    fn defaults_follow_the_seed() {
        let settings = parse(&[("OWNER_ID", "w1")]).unwrap();
        assert_eq!(settings.table.table, "websocket-leases");
        assert_eq!(settings.keeper.lease, Duration::from_secs(30));
        assert_eq!(settings.keeper.renew_interval, Duration::from_secs(10));
        assert_eq!(settings.keeper.safety_margin, Duration::from_secs(3));
        assert_eq!(settings.keeper.skew_margin, Duration::from_secs(1));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse(&[
            ("LEASE_TABLE", "x"),
            ("LEASE_SECONDS", "ten"),
            ("LEASE_SKEW_MARGIN_MS", "-1"),
            ("OWNER_ID", &"w".repeat(300)),
        ])
        .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.problems.len(), 4, "{text}");
        for name in [
            "LEASE_TABLE",
            "LEASE_SECONDS",
            "LEASE_SKEW_MARGIN_MS",
            "OWNER_ID",
        ] {
            assert!(text.contains(name), "{name} missing from {text}");
        }
    }

    #[test]
    fn both_modes_parse_and_nothing_else() {
        let per_stream = parse(&[("OWNER_ID", "w")]).unwrap();
        assert_eq!(per_stream.keeper.mode, LeaseMode::PerStream);
        assert_eq!(
            per_stream.keeper.checkpoint_interval,
            Duration::from_secs(300)
        );
        let session = parse(&[
            ("LEASE_MODE", "session"),
            ("CHECKPOINT_INTERVAL_MS", "60000"),
            ("OWNER_ID", "w"),
        ])
        .unwrap();
        assert_eq!(session.keeper.mode, LeaseMode::Session);
        assert_eq!(session.keeper.checkpoint_interval, Duration::from_secs(60));
        let err = parse(&[("LEASE_MODE", "sessions"), ("OWNER_ID", "w")]).unwrap_err();
        assert!(err.to_string().contains("per-stream or session"), "{err}");
    }

    #[test]
    fn renew_interval_must_fit_before_the_deadline() {
        let err = parse(&[
            ("LEASE_SECONDS", "3"),
            ("LEASE_RENEW_INTERVAL_MS", "2800"),
            ("OWNER_ID", "w"),
        ])
        .unwrap_err();
        assert!(
            err.problems[0].starts_with("LEASE_RENEW_INTERVAL_MS"),
            "{err}"
        );
    }
}
