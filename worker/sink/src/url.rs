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
    /// `redis+cluster://[user:password@]host:port[,host:port…][/]` (or
    /// `rediss+cluster://`, TLS): a Redis Cluster (or ElastiCache with cluster
    /// mode, or Serverless), as one `redis://` (`rediss://`) URL per seed
    /// node, each with the credentials.
    RedisCluster(Vec<String>),
}

impl std::fmt::Debug for SinkUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkUrl::Memory => f.write_str("Memory"),
            SinkUrl::Redis(_) => f.write_str("Redis([redacted])"),
            SinkUrl::RedisCluster(nodes) => {
                write!(f, "RedisCluster({} nodes, [redacted])", nodes.len())
            }
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
            // The whole URL, as the client will read it (a port `notaport`
            // passed the scheme check and failed only at the first connect).
            use redis::IntoConnectionInfo;
            return match raw.into_connection_info() {
                Ok(_) => Ok(SinkUrl::Redis(raw.to_owned())),
                Err(_) => Err(
                    "is not a valid Redis URL (expected redis://[user:password@]host[:port][/db], rediss://… or redis+unix:///path)"
                        .into(),
                ),
            };
        }
        for (cluster, node) in [
            ("redis+cluster://", "redis://"),
            ("rediss+cluster://", "rediss://"),
        ] {
            if let Some(rest) = raw.strip_prefix(cluster) {
                return cluster_nodes(rest, node).map(SinkUrl::RedisCluster);
            }
        }
        Err(
            "must be redis://…, rediss://…, redis+unix://…, redis+cluster://…, rediss+cluster://… or memory:"
                .into(),
        )
    }
}

/// Where a Redis URL points, for errors: `host:port` (or the socket path),
/// never the user, password or database.
pub fn redis_address(url: &str) -> String {
    use redis::IntoConnectionInfo;
    match url.into_connection_info().map(|info| info.addr().clone()) {
        Ok(redis::ConnectionAddr::Tcp(host, port)) => format!("{host}:{port}"),
        Ok(redis::ConnectionAddr::TcpTls { host, port, .. }) => format!("{host}:{port} (TLS)"),
        Ok(redis::ConnectionAddr::Unix(path)) => format!("unix socket {}", path.display()),
        _ => "an unreadable address".to_owned(),
    }
}

/// `[user:password@]host:port[,host:port…][/]` as one node URL each.
fn cluster_nodes(rest: &str, scheme: &str) -> Result<Vec<String>, String> {
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, rest),
    };
    if hosts.contains('/') || hosts.contains('?') {
        return Err(
            "a cluster URL names no database and no options: host:port[,host:port…]".into(),
        );
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|host| match credentials {
            Some(credentials) => format!("{scheme}{credentials}@{host}"),
            None => format!("{scheme}{host}"),
        })
        .collect();
    let well_formed = hosts.split(',').all(|host| {
        host.rsplit_once(':')
            .is_some_and(|(name, port)| !name.is_empty() && port.parse::<u16>().is_ok())
    });
    if !well_formed {
        return Err("a cluster URL lists host:port pairs separated by commas".into());
    }
    Ok(nodes)
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
        Ok(SinkUrl::Redis(_) | SinkUrl::RedisCluster(_)) => Ok(raw.to_owned()),
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
        assert_eq!(
            SinkUrl::parse("redis+cluster://u:pw@a:7000,b:7001/"),
            Ok(SinkUrl::RedisCluster(vec![
                "redis://u:pw@a:7000".into(),
                "redis://u:pw@b:7001".into()
            ]))
        );
        assert_eq!(
            SinkUrl::parse("rediss+cluster://c:7000"),
            Ok(SinkUrl::RedisCluster(vec!["rediss://c:7000".into()]))
        );
        for bad in [
            "redis+cluster://a",
            "redis+cluster://a:1/0",
            "redis+cluster://:pw@",
        ] {
            assert!(SinkUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(
            !format!("{:?}", SinkUrl::parse("redis+cluster://:pw@a:1").unwrap()).contains("pw")
        );
        let refused = SinkUrl::parse("postgres://user:hunter2@db/x").unwrap_err();
        assert!(!refused.contains("hunter2"));
        assert!((REDIS_SINK_URL_PARSER.parse)("memory:").is_err());
        // Errors say where, never who.
        assert_eq!(
            redis_address("redis://user:secret@db.internal:6380/2"),
            "db.internal:6380"
        );
        assert_eq!(redis_address("rediss://:secret@h"), "h:6379 (TLS)");
        // Validated whole, and the refusal never repeats the URL.
        for bad in ["redis://h:notaport", "redis://:secret@h:99999", "rediss://"] {
            let refused = SinkUrl::parse(bad).expect_err(bad);
            assert!(
                !refused.contains("secret") && !refused.contains("notaport"),
                "{refused}"
            );
        }
        assert!((REDIS_SINK_URL_PARSER.parse)("rediss://h").is_ok());
        assert!(!format!("{:?}", SinkUrl::parse("redis://:pw@h").unwrap()).contains("pw"));
    }
}
