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
//!
//! **One refresh's poll is bounded as a whole** ([`PollLimits`]), not only per
//! sidecar: 1,000 records pointing at addresses that never answer would
//! otherwise stretch a refresh to (1,000 ÷ 64 at a time) × the per-sidecar
//! timeout, and 200 sidecars answering 2 MiB each would be 400 MiB. So the
//! poll has one deadline (sidecars not answered by then count as not
//! answering for that refresh; those that answered last time are asked
//! first, so a flood of new silent addresses cannot crowd them out) and one
//! byte budget shared by every body read (a body that would go past it is
//! refused, read no further, and counted). What is kept of an answer is
//! [`KeptStatus`]: the fields the views use, lists capped.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold_telemetry::sidecar_url::{SidecarUrl, UrlProblem};
use serde::Serialize;
use tokio::time::Instant;

mod kept;

pub use kept::{KEPT_CLAIMS, KEPT_GAPS, KEPT_ID_LEN, KEPT_LAG_ENTRIES, KEPT_LEASES, KeptStatus};

/// Largest `/status` body read (a worker with thousands of leases is far below).
pub const MAX_STATUS_BYTES: usize = 2 << 20;

/// Default for [`PollLimits::byte_budget`]: `/status` bytes one refresh reads
/// from all sidecars together. 1,000 stream workers at the default
/// `MAX_STREAMS` (100) answer about 20 KiB each, 20 MiB in all; at most 16
/// bodies of the largest size fit.
pub const DEFAULT_POLL_BYTE_BUDGET: usize = 32 << 20;

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
    /// The body would have gone past the refresh's byte budget
    /// ([`PollLimits::byte_budget`]): refused, read no further.
    OverBudget,
    /// Not asked: the refresh's poll deadline ([`PollLimits::whole_poll`])
    /// had passed before its turn came.
    PastDeadline,
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
            SidecarProblem::OverBudget => "answer over the refresh's byte budget",
            SidecarProblem::PastDeadline => "not asked before the refresh's deadline",
        }
    }
}

/// What one sidecar said.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarReport {
    /// Base URL of this sidecar (its `/status` is `{url}/status`): the
    /// canonical `http://IP:PORT` form of an accepted address.
    pub url: String,
    /// What is kept of its `/status` body, when it answered.
    pub status: Option<KeptStatus>,
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

/// How long and how much one refresh's poll of the sidecars may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollLimits {
    /// One sidecar: connecting and answering in full.
    pub per_sidecar: Duration,
    /// The whole poll, name lookups included: a sidecar that has not answered
    /// when it passes counts as not answering for this refresh.
    pub whole_poll: Duration,
    /// `/status` bytes read in one poll, all sidecars together.
    pub byte_budget: usize,
}

impl PollLimits {
    /// `per_sidecar` for each sidecar, `whole_poll` for all of them, and the
    /// default byte budget.
    pub fn new(per_sidecar: Duration, whole_poll: Duration) -> Self {
        PollLimits {
            per_sidecar,
            whole_poll,
            byte_budget: DEFAULT_POLL_BYTE_BUDGET,
        }
    }
}

/// What one poll found, and what it read.
#[derive(Debug, Clone, Default)]
pub struct Poll {
    /// One report per sidecar, sorted by URL.
    pub reports: Vec<SidecarReport>,
    /// `/status` bytes read, all sidecars together: never more than
    /// [`PollLimits::byte_budget`].
    pub bytes_read: usize,
}

/// The bytes one poll may read, shared by its concurrent reads. Bytes taken
/// are never given back, whether the body turned out to be a status or not:
/// the budget bounds what a refresh reads, not only what it keeps.
struct ByteBudget {
    limit: usize,
    spent: AtomicUsize,
    /// Body bytes actually read, counted apart from what was taken, so the
    /// figure a poll reports would show a read the budget failed to stop.
    read: AtomicUsize,
}

impl ByteBudget {
    fn new(limit: usize) -> Self {
        ByteBudget {
            limit,
            spent: AtomicUsize::new(0),
            read: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` if that many are left (all or nothing).
    fn take(&self, bytes: usize) -> bool {
        self.spent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |spent| {
                spent
                    .checked_add(bytes)
                    .filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn count_read(&self, bytes: usize) {
        self.read.fetch_add(bytes, Ordering::AcqRel);
    }

    fn read(&self) -> usize {
        self.read.load(Ordering::Acquire)
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

/// Reads every accepted sidecar's `/status` (concurrently, bounded);
/// `answered_before` (URLs) are asked first.
pub async fn poll_discovered(
    discovery: &Discovery,
    limits: &PollLimits,
    answered_before: &HashSet<String>,
) -> Poll {
    let deadline = Instant::now() + limits.whole_poll;
    let addresses = discovery.accepted.iter().map(SidecarUrl::addr).collect();
    let mut poll = poll_addresses(addresses, limits, deadline, answered_before).await;
    poll.reports.sort_by(|a, b| a.url.cmp(&b.url));
    poll
}

/// Resolves every `DASHBOARD_SIDECARS` target and reads each sidecar's
/// `/status`, all within the one deadline.
pub async fn poll(
    targets: &[SidecarTarget],
    limits: &PollLimits,
    answered_before: &HashSet<String>,
) -> Poll {
    let deadline = Instant::now() + limits.whole_poll;
    let mut addresses: Vec<SocketAddr> = Vec::new();
    let mut failed = Vec::new();
    for target in targets {
        let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
        let until = deadline.min(Instant::now() + limits.per_sidecar);
        let problem = match tokio::time::timeout_at(until, lookup).await {
            Ok(Ok(found)) => {
                addresses.extend(found);
                continue;
            }
            Ok(Err(_)) => SidecarProblem::Unresolved,
            Err(_) => SidecarProblem::Timeout,
        };
        failed.push(SidecarReport::failed(
            format!("http://{}:{}", target.host, target.port),
            problem,
        ));
    }
    let mut poll = poll_addresses(addresses, limits, deadline, answered_before).await;
    poll.reports.extend(failed);
    poll.reports.sort_by(|a, b| a.url.cmp(&b.url));
    poll
}

async fn poll_addresses(
    mut addresses: Vec<SocketAddr>,
    limits: &PollLimits,
    deadline: Instant,
    answered_before: &HashSet<String>,
) -> Poll {
    addresses.sort();
    addresses.dedup();
    let mut queue: Vec<(SocketAddr, String)> = addresses
        .into_iter()
        .map(|address| (address, SidecarUrl::new(address).to_string()))
        .collect();
    // Those that answered last time first (a stable sort keeps the address
    // order within each group): when the deadline cuts the poll short, it is
    // the newcomers that wait, not the fleet.
    queue.sort_by_key(|(_, url)| !answered_before.contains(url));
    let client = client(limits.per_sidecar);
    let budget = ByteBudget::new(limits.byte_budget);
    let budget = &budget;
    let reports: Vec<SidecarReport> = futures_util::stream::iter(queue)
        .map(|(address, url)| {
            let client = client.clone();
            async move {
                let now = Instant::now();
                if now >= deadline {
                    return SidecarReport::failed(url, SidecarProblem::PastDeadline);
                }
                let until = deadline.min(now + limits.per_sidecar);
                match tokio::time::timeout_at(until, fetch(&client, address, budget)).await {
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
    Poll {
        reports,
        bytes_read: budget.read(),
    }
}

/// One `GET /status` to `address`, bounded in size and by the poll's byte
/// budget (the caller bounds time); only what the views use is kept.
async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    address: SocketAddr,
    budget: &ByteBudget,
) -> Result<KeptStatus, SidecarProblem> {
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
    let declared = response
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let mut charged = 0;
    if let Some(declared) = declared {
        if declared > MAX_STATUS_BYTES {
            return Err(SidecarProblem::TooLarge);
        }
        // Taken before reading, so concurrent reads cannot all start bodies
        // the budget cannot hold and end with none complete.
        if !budget.take(declared) {
            return Err(SidecarProblem::OverBudget);
        }
        charged = declared;
    }
    let mut body = response.into_body();
    let mut read = Vec::with_capacity(charged);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| SidecarProblem::Unreachable)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let total = read.len() + data.len();
        if total > MAX_STATUS_BYTES {
            return Err(SidecarProblem::TooLarge);
        }
        // A body without a length is charged as it arrives.
        if total > charged {
            if !budget.take(total - charged) {
                return Err(SidecarProblem::OverBudget);
            }
            charged = total;
        }
        budget.count_read(data.len());
        read.extend_from_slice(&data);
    }
    serde_json::from_slice(&read).map_err(|_| SidecarProblem::NotStatus)
}

/// One refresh's poll: exactly the `DASHBOARD_SIDECARS` targets when there
/// are any, else the `published` URLs `policy` accepts; those in
/// `answered_before` are asked first. Dated by `clock` when it ends.
pub(crate) async fn read<'a>(
    targets: &[SidecarTarget],
    policy: &DiscoveryPolicy,
    published: impl IntoIterator<Item = &'a str>,
    limits: &PollLimits,
    answered_before: &HashSet<String>,
    clock: &dyn leasehold_control::clock::Clock,
) -> crate::sources::SidecarReadings {
    let (polled, refused) = if targets.is_empty() {
        let discovery = Discovery::from_values(published, policy);
        (
            poll_discovered(&discovery, limits, answered_before).await,
            discovery.summary(),
        )
    } else {
        (poll(targets, limits, answered_before).await, None)
    };
    crate::sources::SidecarReadings {
        reports: polled.reports,
        bytes_read: polled.bytes_read,
        refused,
        overridden: !targets.is_empty(),
        polled_ms: clock.now_ms(),
    }
}

#[cfg(test)]
mod tests;
