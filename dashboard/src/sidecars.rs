//! Finding sidecars and reading their `/status`.
//!
//! **Discovery.** Every worker publishes its sidecar's base URL as `sidecar_url`:
//! a stream worker in its presence record (`leasehold#worker#{owner}`), a broker
//! worker in its pool mark (idle) and in `worker:metadata:{user_id}` (claimed).
//! Each refresh the collector gathers those values and polls them; this works
//! the same for ECS services and `RunTask` tasks, with no DNS and no Cloud Map.
//! `DASHBOARD_SIDECARS` is an override: when set, only those sidecars are
//! polled (host names are resolved, every address one sidecar), and nothing is
//! discovered.
//!
//! **A discovered URL is untrusted input**: anyone who can write a presence
//! record or a metadata hash chooses where the dashboard connects. So a
//! `sidecar_url` is accepted only when it is `http://IP:PORT` (the strict form
//! of [`leasehold_telemetry::sidecar_url`]: plain HTTP, no userinfo, no path, an
//! IP literal, never a name) and its address (an IPv4-mapped IPv6 address counts
//! as the IPv4 address it reaches) is not link-local (169.254.0.0/16 holds the
//! ECS credentials and metadata endpoints; fe80::/10), not EC2's IPv6 metadata
//! range or a NAT64 prefix, not unspecified, multicast or broadcast, is loopback
//! only in `dev`, and lies in one of
//! `DASHBOARD_SIDECAR_NETWORKS` (default: the RFC 1918 private ranges). The
//! dashboard connects to the parsed address, never to the text; it follows no
//! redirect, bounds each poll's time and body, polls at most
//! [`MAX_DISCOVERED`] distinct sidecars per refresh, and shows a failure as a
//! fixed category ([`SidecarProblem`]), never a response body or an error text
//! derived from the URL.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold_telemetry::sidecar_url::{SidecarUrl, UrlProblem};
use leasehold_telemetry::status::SidecarStatus;
use serde::Serialize;

/// Largest `/status` body read (a worker with thousands of leases is far below).
pub const MAX_STATUS_BYTES: usize = 2 << 20;

/// Most distinct discovered sidecars polled in one refresh; the rest are
/// counted as refused (`over the limit`), so a flood of presence records cannot
/// make the dashboard open unbounded connections.
pub const MAX_DISCOVERED: usize = 1_000;

/// Sidecars polled at once.
const POLL_CONCURRENCY: usize = 64;

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

/// An IP network in CIDR form (`10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    base: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parses `ADDRESS/PREFIX`; the address must be the network's first one.
    pub fn parse(raw: &str) -> Result<Network, String> {
        let (address, prefix) = raw
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{raw:?} must be a CIDR like 10.0.0.0/8"))?;
        let base: IpAddr = address
            .parse()
            .map_err(|_| format!("{raw:?} must be a CIDR like 10.0.0.0/8"))?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{raw:?} has an invalid prefix length"))?;
        let network = Network { base, prefix };
        if !network.contains(base) || network.masked(base) != bits(base) {
            return Err(format!("{raw:?} has host bits set"));
        }
        Ok(network)
    }

    /// Whether `ip` is in this network (IPv4 and IPv6 never match each other).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.base.is_ipv4() && self.masked(ip) == self.masked(self.base)
    }

    fn masked(&self, ip: IpAddr) -> u128 {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let keep = u32::from(self.prefix);
        let mask = if keep == 0 {
            0
        } else {
            (u128::MAX << (width - keep)) & (u128::MAX >> (128 - width))
        };
        bits(ip) & mask
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The default `DASHBOARD_SIDECAR_NETWORKS`: the RFC 1918 private ranges,
/// where awsvpc task addresses live.
pub fn private_networks() -> Vec<Network> {
    ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
        .iter()
        .filter_map(|cidr| Network::parse(cidr).ok())
        .collect()
}

/// Which discovered `sidecar_url` values the dashboard may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryPolicy {
    /// `DASHBOARD_SIDECAR_NETWORKS`: a sidecar's address must be in one.
    pub networks: Vec<Network>,
    /// Loopback sidecars are accepted (`leasehold dev` only).
    pub allow_loopback: bool,
}

impl Default for DiscoveryPolicy {
    /// Production: the RFC 1918 ranges, no loopback.
    fn default() -> Self {
        DiscoveryPolicy {
            networks: private_networks(),
            allow_loopback: false,
        }
    }
}

/// Why a discovered `sidecar_url` was not polled (a fixed category).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// Not the strict `http://IP:PORT` form.
    Form(UrlProblem),
    /// 169.254.0.0/16 or fe80::/10 (the ECS credentials endpoint lives there).
    LinkLocal,
    /// `fd00:ec2::/32` (EC2's IPv6 instance metadata, `fd00:ec2::254`) or a
    /// NAT64 prefix (`64:ff9b::/96`, `64:ff9b:1::/48`), which reaches any IPv4
    /// address, the metadata endpoint included: refused whatever
    /// `DASHBOARD_SIDECAR_NETWORKS` says.
    MetadataOrNat64,
    /// Loopback outside `dev`.
    Loopback,
    /// 0.0.0.0 or `::`.
    Unspecified,
    /// A multicast address.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// Not in any of `DASHBOARD_SIDECAR_NETWORKS`.
    OutsideNetworks,
    /// Beyond [`MAX_DISCOVERED`] distinct sidecars in one refresh.
    OverLimit,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Form(problem) => write!(f, "malformed ({problem})"),
            Refusal::LinkLocal => f.write_str("link-local"),
            Refusal::MetadataOrNat64 => f.write_str("instance metadata or NAT64"),
            Refusal::Loopback => f.write_str("loopback"),
            Refusal::Unspecified => f.write_str("unspecified address"),
            Refusal::Multicast => f.write_str("multicast"),
            Refusal::Broadcast => f.write_str("broadcast"),
            Refusal::OutsideNetworks => f.write_str("outside DASHBOARD_SIDECAR_NETWORKS"),
            Refusal::OverLimit => f.write_str("over the per-refresh limit"),
        }
    }
}

/// EC2's IPv6 metadata range or a NAT64 prefix (see [`Refusal::MetadataOrNat64`]).
fn is_metadata_or_nat64(ip: IpAddr) -> bool {
    let IpAddr::V6(v6) = ip else {
        return false;
    };
    let s = v6.segments();
    let ec2_metadata = s[0] == 0xfd00 && s[1] == 0x0ec2;
    let well_known_nat64 = s[0] == 0x0064 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0];
    let local_nat64 = s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001;
    ec2_metadata || well_known_nat64 || local_nat64
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        // fe80::/10
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

impl DiscoveryPolicy {
    /// `leasehold dev`: loopback sidecars, plus the production ranges.
    pub fn dev() -> Self {
        let mut networks = private_networks();
        networks.extend(
            ["127.0.0.0/8", "::1/128"]
                .iter()
                .filter_map(|cidr| Network::parse(cidr).ok()),
        );
        DiscoveryPolicy {
            networks,
            allow_loopback: true,
        }
    }

    /// Accepts or refuses one discovered value.
    pub fn check(&self, raw: &str) -> Result<SidecarUrl, Refusal> {
        let url = SidecarUrl::parse(raw).map_err(Refusal::Form)?;
        let ip = url.effective_ip();
        if ip.is_unspecified() {
            return Err(Refusal::Unspecified);
        }
        if is_link_local(ip) {
            return Err(Refusal::LinkLocal);
        }
        if is_metadata_or_nat64(ip) {
            return Err(Refusal::MetadataOrNat64);
        }
        if ip.is_multicast() {
            return Err(Refusal::Multicast);
        }
        if ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
            return Err(Refusal::Broadcast);
        }
        if ip.is_loopback() && !self.allow_loopback {
            return Err(Refusal::Loopback);
        }
        if !self.networks.iter().any(|network| network.contains(ip)) {
            return Err(Refusal::OutsideNetworks);
        }
        Ok(url)
    }
}

/// Why a sidecar's `/status` could not be read: a fixed category, shown as
/// is. Never a response body, never an error text that could echo the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SidecarProblem {
    /// A `DASHBOARD_SIDECARS` host name did not resolve.
    Unresolved,
    /// No connection (refused, reset, unreachable).
    Unreachable,
    /// No complete answer within the timeout.
    Timeout,
    /// Answered a redirect (never followed).
    Redirect,
    /// Answered a status other than 200.
    HttpStatus,
    /// The body was larger than [`MAX_STATUS_BYTES`].
    TooLarge,
    /// The body was not a sidecar `/status` document.
    NotStatus,
}

impl SidecarProblem {
    /// The category's text.
    pub fn as_str(self) -> &'static str {
        match self {
            SidecarProblem::Unresolved => "host name did not resolve",
            SidecarProblem::Unreachable => "unreachable",
            SidecarProblem::Timeout => "no answer in time",
            SidecarProblem::Redirect => "answered a redirect (not followed)",
            SidecarProblem::HttpStatus => "answered an error status",
            SidecarProblem::TooLarge => "answer too large",
            SidecarProblem::NotStatus => "answer is not a sidecar status",
        }
    }
}

/// What one sidecar said.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarReport {
    /// Base URL of this sidecar (its `/status` is `{url}/status`): the
    /// canonical `http://IP:PORT` form of an accepted address.
    pub url: String,
    /// The `/status` body, when it answered.
    pub status: Option<SidecarStatus>,
    /// Why it did not: a fixed category text ([`SidecarProblem::as_str`]).
    pub error: Option<String>,
}

impl SidecarReport {
    fn failed(url: String, problem: SidecarProblem) -> Self {
        SidecarReport {
            url,
            status: None,
            error: Some(problem.as_str().to_owned()),
        }
    }
}

/// What one refresh's discovery found: accepted sidecars and refusals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Distinct accepted sidecars, at most [`MAX_DISCOVERED`].
    pub accepted: BTreeSet<SidecarUrl>,
    /// Refused values per reason (a value refused twice counts twice).
    pub refused: BTreeMap<Refusal, usize>,
}

impl Discovery {
    /// Checks every discovered value against `policy`.
    pub fn from_values<'a>(
        values: impl IntoIterator<Item = &'a str>,
        policy: &DiscoveryPolicy,
    ) -> Self {
        let mut discovery = Discovery::default();
        for raw in values {
            let refusal = match policy.check(raw) {
                Ok(url) if discovery.accepted.contains(&url) => continue,
                Ok(_) if discovery.accepted.len() >= MAX_DISCOVERED => Refusal::OverLimit,
                Ok(url) => {
                    discovery.accepted.insert(url);
                    continue;
                }
                Err(refusal) => refusal,
            };
            *discovery.refused.entry(refusal).or_default() += 1;
        }
        discovery
    }

    /// `"3 sidecar_url values refused: 2 link-local, 1 loopback"`, or `None`.
    /// Counts and categories only: never a value.
    pub fn summary(&self) -> Option<String> {
        let total: usize = self.refused.values().sum();
        (total > 0).then(|| {
            let parts: Vec<String> = self
                .refused
                .iter()
                .map(|(reason, count)| format!("{count} {reason}"))
                .collect();
            format!(
                "{total} sidecar_url value{} refused: {}",
                if total == 1 { "" } else { "s" },
                parts.join(", ")
            )
        })
    }
}

/// An HTTP client that connects only where it is told: no proxy, no
/// redirects (hyper's client never follows them), a connect timeout.
fn client(timeout: Duration) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Reads every accepted sidecar's `/status` (concurrently, bounded).
pub async fn poll_discovered(discovery: &Discovery, timeout: Duration) -> Vec<SidecarReport> {
    poll_addresses(
        discovery.accepted.iter().map(SidecarUrl::addr).collect(),
        timeout,
    )
    .await
}

/// Resolves every `DASHBOARD_SIDECARS` target and reads each sidecar's `/status`.
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
            Ok(Err(_)) => SidecarProblem::Unresolved,
            Err(_) => SidecarProblem::Timeout,
        };
        reports.push(SidecarReport::failed(
            format!("http://{}:{}", target.host, target.port),
            problem,
        ));
    }
    reports.extend(poll_addresses(addresses, timeout).await);
    reports
}

async fn poll_addresses(mut addresses: Vec<SocketAddr>, timeout: Duration) -> Vec<SidecarReport> {
    addresses.sort();
    addresses.dedup();
    let client = client(timeout);
    let mut reports: Vec<SidecarReport> = futures_util::stream::iter(addresses)
        .map(|address| {
            let client = client.clone();
            async move {
                let url = SidecarUrl::new(address).to_string();
                match tokio::time::timeout(timeout, fetch(&client, address)).await {
                    Ok(Ok(status)) => SidecarReport {
                        url,
                        status: Some(status),
                        error: None,
                    },
                    Ok(Err(problem)) => SidecarReport::failed(url, problem),
                    Err(_) => SidecarReport::failed(url, SidecarProblem::Timeout),
                }
            }
        })
        .buffer_unordered(POLL_CONCURRENCY)
        .collect()
        .await;
    reports.sort_by(|a, b| a.url.cmp(&b.url));
    reports
}

/// One `GET /status` to `address`, bounded in size (the caller bounds time).
async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    address: SocketAddr,
) -> Result<SidecarStatus, SidecarProblem> {
    let uri: hyper::Uri = format!("{}/status", SidecarUrl::new(address))
        .parse()
        .map_err(|_| SidecarProblem::Unreachable)?;
    let response = client
        .get(uri)
        .await
        .map_err(|_| SidecarProblem::Unreachable)?;
    let status = response.status();
    if status.is_redirection() {
        return Err(SidecarProblem::Redirect);
    }
    if status != hyper::StatusCode::OK {
        return Err(SidecarProblem::HttpStatus);
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_STATUS_BYTES)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<http_body_util::LengthLimitError>() {
                SidecarProblem::TooLarge
            } else {
                SidecarProblem::Unreachable
            }
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|_| SidecarProblem::NotStatus)
}

#[cfg(test)]
mod tests;
