//! Log output: one line per event on stderr, filtered by `LEASEHOLD_LOG`, as
//! text or JSON (`LEASEHOLD_LOG_FORMAT`); colours only on a terminal.

use std::io::IsTerminal;

use crate::settings::{
    ConfigError, Documented, Env, External, Fallback, Parser, Setting, parse, process_env,
};

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line (CloudWatch Logs Insights, Loki, …).
    Json,
}

/// The `LEASEHOLD_LOG_FORMAT` variable.
pub const LEASEHOLD_LOG_FORMAT: Setting<LogFormat> = Setting::new(
    "LEASEHOLD_LOG_FORMAT",
    Parser {
        parse: |raw| match raw {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err("must be text or json".into()),
        },
        show: |format| match format {
            LogFormat::Text => "text".into(),
            LogFormat::Json => "json".into(),
        },
    },
    Fallback::Value(|| LogFormat::Text),
    "`text` (one readable line per event) or `json` (one JSON object per line: `timestamp`, \
     `level`, `fields`, `target`); any other value exits 2. ANSI colours only when stderr is \
     a terminal. Warnings that can repeat per frame or attempt (frame skipped, reconnecting, \
     sink write failed, acquire failed, bad telemetry peer) are written once per stream and \
     reason every 10 s, the next line carrying `suppressed=N`; the metrics count every one",
);

/// The `LEASEHOLD_LOG` variable.
pub const LEASEHOLD_LOG: Setting<String> = Setting::new(
    "LEASEHOLD_LOG",
    parse::TEXT,
    Fallback::Value(|| "warn".to_owned()),
    "log filter, `tracing` EnvFilter syntax (e.g. `info,leasehold_control=debug`); `dev` logs \
     errors only unless this is set",
);

/// The AWS SDK's own variables, documented here because users set them.
pub const AWS_REGION: External = External {
    name: "AWS_REGION",
    doc: "AWS region, read by the AWS SDK (profiles and the ECS task environment also work); \
         commands that call AWS exit 2 when no region is found",
};
/// Endpoint override for every AWS service (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL: External = External {
    name: "AWS_ENDPOINT_URL",
    doc: "endpoint for all AWS APIs, e.g. a local DynamoDB-compatible server (read by the AWS \
         SDK)",
};
/// Endpoint override for DynamoDB only (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL_DYNAMODB: External = External {
    name: "AWS_ENDPOINT_URL_DYNAMODB",
    doc: "endpoint for DynamoDB only (read by the AWS SDK)",
};

/// Every variable of the process environment itself, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &LEASEHOLD_LOG,
    &LEASEHOLD_LOG_FORMAT,
    &AWS_REGION,
    &AWS_ENDPOINT_URL,
    &AWS_ENDPOINT_URL_DYNAMODB,
    &crate::ecs::ECS_CONTAINER_METADATA_URI_V4,
];

/// Logs to stderr with the filter from `LEASEHOLD_LOG`, else `default`, in the
/// `LEASEHOLD_LOG_FORMAT` format. An invalid format is a configuration error.
pub fn init(default: &str) -> Result<(), ConfigError> {
    use tracing_subscriber::EnvFilter;
    let mut env = Env::new(&process_env);
    let format = env.get(&LEASEHOLD_LOG_FORMAT);
    let format = env.finish(format)?;
    let filter =
        EnvFilter::try_from_env(LEASEHOLD_LOG.name).unwrap_or_else(|_| EnvFilter::new(default));
    // Escape codes in a file or a log driver's stream are noise.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// How often the same repeated warning may be written: once per window per key,
/// then one line carrying how many were held back.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Most keys remembered at once; beyond it, keys whose window has passed are
/// forgotten first and then anything (a flood of distinct keys is not a leak).
const MAX_KEYS: usize = 4096;

/// Rate limit for warnings that can repeat per frame or per attempt (a bad
/// upstream frame, a failing sink, a stranger on the telemetry port): the first
/// line of a key is written, repeats inside [`REPEAT_WINDOW`] are counted, and the
/// next line after the window says how many were suppressed. A burst that ends
/// inside a window leaves its count unprinted: the metric counts every one.
#[derive(Debug)]
pub struct RepeatLimiter {
    window: std::time::Duration,
    seen: std::sync::Mutex<std::collections::HashMap<String, (tokio::time::Instant, u64)>>,
}

impl RepeatLimiter {
    /// A limiter with the given window.
    pub fn new(window: std::time::Duration) -> Self {
        RepeatLimiter {
            window,
            seen: Default::default(),
        }
    }

    /// `Some(suppressed since the last line)` when a line for `key` may be
    /// written now, `None` when it is held back.
    pub fn admit(&self, key: &str) -> Option<u64> {
        let now = tokio::time::Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((written, suppressed)) = seen.get_mut(key) {
            if now.duration_since(*written) < self.window {
                *suppressed += 1;
                return None;
            }
            let held = *suppressed;
            *written = now;
            *suppressed = 0;
            return Some(held);
        }
        if seen.len() >= MAX_KEYS {
            let window = self.window;
            seen.retain(|_, (written, _)| now.duration_since(*written) < window);
            if seen.len() >= MAX_KEYS {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), (now, 0));
        Some(0)
    }
}

/// The process's limiter for repeated warnings.
pub fn repeats() -> &'static RepeatLimiter {
    static LIMITER: std::sync::LazyLock<RepeatLimiter> =
        std::sync::LazyLock::new(|| RepeatLimiter::new(REPEAT_WINDOW));
    &LIMITER
}

#[cfg(test)]
mod tests {
    #[tokio::test(start_paused = true)]
    async fn repeats_are_held_back_and_counted_per_key() {
        let limiter = super::RepeatLimiter::new(std::time::Duration::from_secs(10));
        assert_eq!(limiter.admit("frame:a"), Some(0));
        for _ in 0..41 {
            assert_eq!(limiter.admit("frame:a"), None);
        }
        // Another key is not held back by the first.
        assert_eq!(limiter.admit("frame:b"), Some(0));
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        assert_eq!(limiter.admit("frame:a"), Some(41));
        assert_eq!(limiter.admit("frame:a"), None);
        tokio::time::advance(std::time::Duration::from_secs(11)).await;
        assert_eq!(limiter.admit("frame:a"), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_keys_stays_bounded() {
        let limiter = super::RepeatLimiter::new(std::time::Duration::from_secs(10));
        for i in 0..3 * super::MAX_KEYS {
            assert_eq!(limiter.admit(&format!("k{i}")), Some(0));
        }
        assert!(limiter.seen.lock().unwrap().len() <= super::MAX_KEYS);
    }

    use super::*;

    #[test]
    fn the_format_is_text_or_json_and_nothing_else() {
        let parse = LEASEHOLD_LOG_FORMAT.parser.parse;
        assert_eq!(parse("json"), Ok(LogFormat::Json));
        assert_eq!(parse("text"), Ok(LogFormat::Text));
        assert!(parse("JSON-ish").is_err());
    }
}
