//! `SINK_URL`: the one parser of the forms a sink is named by, for the stream
//! worker, `leasehold dev` and the dashboard's read of the sink.

use leasehold_platform::settings::Parser;

/// What a `SINK_URL` names.
#[derive(Clone, PartialEq, Eq)]
pub enum SinkUrl {
    /// `memory:`: an in-process sink (`leasehold dev`, tests).
    Memory,
    /// `redis://…`, `rediss://…` or `redis+unix://…`: a Redis (or Valkey)
    /// primary; the URL may hold a password.
    Redis(String),
}

impl std::fmt::Debug for SinkUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkUrl::Memory => f.write_str("Memory"),
            SinkUrl::Redis(_) => f.write_str("Redis([redacted])"),
        }
    }
}

/// The schemes a Redis sink URL may start with.
const REDIS_SCHEMES: [&str; 3] = ["redis://", "rediss://", "redis+unix://"];

impl SinkUrl {
    /// Parses a `SINK_URL`; the error never repeats the URL (it may hold a
    /// password).
    pub fn parse(raw: &str) -> Result<SinkUrl, String> {
        if raw == "memory:" {
            return Ok(SinkUrl::Memory);
        }
        if REDIS_SCHEMES.iter().any(|scheme| raw.starts_with(scheme)) {
            return Ok(SinkUrl::Redis(raw.to_owned()));
        }
        Err("must be redis://…, rediss://…, redis+unix://… or memory:".into())
    }
}

/// `SINK_URL` as a setting's parser: any form [`SinkUrl::parse`] takes.
pub const SINK_URL_PARSER: Parser<String> = Parser {
    parse: |raw| SinkUrl::parse(raw).map(|_| raw.to_owned()),
    show: Clone::clone,
};

/// A sink URL another process reads (the dashboard): a Redis only, since an
/// in-process sink is not reachable from outside the process that owns it.
pub const REDIS_SINK_URL_PARSER: Parser<String> = Parser {
    parse: |raw| {
        match SinkUrl::parse(raw) {
        Ok(SinkUrl::Redis(_)) => Ok(raw.to_owned()),
        Ok(SinkUrl::Memory) => Err(
            "memory: is an in-process sink; only `leasehold dev` has one, and it shares it with its dashboard by itself"
                .into(),
        ),
        Err(problem) => Err(problem),
    }
    },
    show: Clone::clone,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_and_nothing_else() {
        assert_eq!(SinkUrl::parse("memory:"), Ok(SinkUrl::Memory));
        for url in [
            "redis://h:6379",
            "rediss://u:p@h/0",
            "redis+unix:///run/r.sock",
        ] {
            assert!(
                matches!(SinkUrl::parse(url), Ok(SinkUrl::Redis(_))),
                "{url}"
            );
        }
        let refused = SinkUrl::parse("postgres://user:hunter2@db/x").unwrap_err();
        assert!(!refused.contains("hunter2"));
        assert!((REDIS_SINK_URL_PARSER.parse)("memory:").is_err());
        assert!((REDIS_SINK_URL_PARSER.parse)("rediss://h").is_ok());
        assert!(!format!("{:?}", SinkUrl::parse("redis://:pw@h").unwrap()).contains("pw"));
    }
}
