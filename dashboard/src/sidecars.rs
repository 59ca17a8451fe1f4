//! Finding sidecars and reading their `/status`.
//!
//! Discovery is DNS, the way Prometheus's `dns_sd` and ECS service discovery
//! (Cloud Map / Service Connect) work: `DASHBOARD_SIDECARS` lists base URLs such
//! as `http://stream-workers.leasehold.local:9464`; every address a host name
//! resolves to is one sidecar (one per task in `awsvpc` mode). Literal
//! addresses are used as they are (`dev` lists its sidecars' loopback ports).
//! A sidecar that does not answer within the timeout is shown as unreachable.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use leasehold_telemetry::status::SidecarStatus;
use serde::Serialize;

/// Largest `/status` body read (a worker with thousands of leases is far below).
const MAX_STATUS_BYTES: usize = 8 << 20;

/// One configured sidecar source, as parsed from `DASHBOARD_SIDECARS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarTarget {
    /// Host name or address, as written.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl SidecarTarget {
    /// Parses `http://HOST:PORT` (or `HOST:PORT`); paths are not allowed.
    pub fn parse(raw: &str) -> Result<SidecarTarget, String> {
        let rest = raw.trim().strip_prefix("http://").unwrap_or(raw.trim());
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') || rest.is_empty() {
            return Err(format!("{raw:?} must be http://HOST:PORT"));
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{raw:?} has no port"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{raw:?} has an invalid port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{raw:?} has no host"));
        }
        Ok(SidecarTarget {
            host: host.to_owned(),
            port,
        })
    }
}

/// What one sidecar said.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarReport {
    /// Base URL of this sidecar (its `/status` is `{url}/status`).
    pub url: String,
    /// The `/status` body, when it answered.
    pub status: Option<SidecarStatus>,
    /// Why it did not (no secrets: transport errors only).
    pub error: Option<String>,
}

/// Resolves every target and reads each sidecar's `/status` concurrently.
pub async fn poll(targets: &[SidecarTarget], timeout: Duration) -> Vec<SidecarReport> {
    let mut addresses: Vec<SocketAddr> = Vec::new();
    let mut reports = Vec::new();
    for target in targets {
        let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
        let problem = match tokio::time::timeout(timeout, lookup).await {
            Ok(Ok(found)) => {
                addresses.extend(found);
                continue;
            }
            Ok(Err(err)) => format!("cannot resolve {}: {err}", target.host),
            Err(_) => format!(
                "{} did not resolve within {} ms",
                target.host,
                timeout.as_millis()
            ),
        };
        reports.push(SidecarReport {
            url: format!("http://{}:{}", target.host, target.port),
            status: None,
            error: Some(problem),
        });
    }
    addresses.sort();
    addresses.dedup();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let fetched = futures_util::future::join_all(addresses.into_iter().map(|address| {
        let client = client.clone();
        async move {
            let url = format!("http://{address}");
            match tokio::time::timeout(timeout, fetch(&client, &url)).await {
                Ok(Ok(status)) => SidecarReport {
                    url,
                    status: Some(status),
                    error: None,
                },
                Ok(Err(err)) => SidecarReport {
                    url,
                    status: None,
                    error: Some(err),
                },
                Err(_) => SidecarReport {
                    url,
                    status: None,
                    error: Some(format!("no answer within {} ms", timeout.as_millis())),
                },
            }
        }
    }))
    .await;
    reports.extend(fetched);
    reports
}

async fn fetch(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    base: &str,
) -> Result<SidecarStatus, String> {
    let uri: hyper::Uri = format!("{base}/status")
        .parse()
        .map_err(|err| format!("bad address: {err}"))?;
    let response = client
        .get(uri)
        .await
        .map_err(|err| format!("unreachable: {err}"))?;
    if !response.status().is_success() {
        return Err(format!("/status answered {}", response.status()));
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_STATUS_BYTES)
        .collect()
        .await
        .map_err(|err| format!("reading /status: {err}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|err| format!("/status is not a sidecar status: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_refuse_paths_and_userinfo() {
        assert_eq!(
            SidecarTarget::parse("http://sidecars.local:9464/").unwrap(),
            SidecarTarget {
                host: "sidecars.local".into(),
                port: 9464
            }
        );
        assert_eq!(SidecarTarget::parse("127.0.0.1:80").unwrap().port, 80);
        assert!(SidecarTarget::parse("http://h:1/status").is_err());
        assert!(SidecarTarget::parse("http://user:pw@h:1").is_err());
        assert!(SidecarTarget::parse("http://h").is_err());
    }

    #[tokio::test]
    async fn a_silent_sidecar_is_reported_not_fatal() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let reports = poll(
            &[SidecarTarget {
                host: "127.0.0.1".into(),
                port,
            }],
            Duration::from_millis(500),
        )
        .await;
        assert_eq!(reports.len(), 1);
        assert!(reports[0].status.is_none());
        assert!(reports[0].error.as_deref().unwrap().contains("unreachable"));
    }
}
