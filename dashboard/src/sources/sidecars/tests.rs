//! Hostile `sidecar_url` values and hostile sidecars. Each case names the
//! check it proves: with that check removed, the case fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// Every address allowed by the networks, so each refusal below comes from
/// its own check, not from the allow-list.
fn everything() -> DiscoveryPolicy {
    DiscoveryPolicy {
        networks: vec![
            Network::parse("0.0.0.0/0").unwrap(),
            Network::parse("::/0").unwrap(),
        ],
        allow_loopback: false,
    }
}

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

#[test]
fn networks_parse_and_match() {
    let ten = Network::parse("10.0.0.0/8").unwrap();
    assert!(ten.contains("10.255.0.1".parse().unwrap()));
    assert!(!ten.contains("11.0.0.1".parse().unwrap()));
    assert!(
        !ten.contains("::ffff:10.0.0.1".parse().unwrap()),
        "v6 never matches v4"
    );
    let ula = Network::parse("fd00::/8").unwrap();
    assert!(ula.contains("fd12::1".parse().unwrap()));
    assert!(!ula.contains("fe80::1".parse().unwrap()));
    assert!(Network::parse("10.0.0.1/8").is_err(), "host bits set");
    assert!(Network::parse("10.0.0.0/33").is_err());
    assert!(Network::parse("10.0.0.0").is_err());
    assert_eq!(
        private_networks()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    );
}

#[test]
fn hostile_urls_are_refused_each_by_its_own_check() {
    let open = everything();
    for (raw, refusal) in [
        // The ECS credentials endpoint, directly and as an IPv4-mapped IPv6
        // address (the mapping check: without it ::ffff:… is "just IPv6").
        ("http://169.254.169.254:80", Refusal::LinkLocal),
        ("http://169.254.170.2:80", Refusal::LinkLocal),
        ("http://[::ffff:169.254.169.254]:80", Refusal::LinkLocal),
        ("http://[fe80::1]:80", Refusal::LinkLocal),
        ("http://[febf::1]:80", Refusal::LinkLocal),
        // EC2's IPv6 metadata endpoint, and 169.254.169.254 through NAT64
        // (well-known and local-use prefixes): allowed networks or not.
        ("http://[fd00:ec2::254]:80", Refusal::MetadataOrNat64),
        ("http://[fd00:ec2:0:1::9]:80", Refusal::MetadataOrNat64),
        ("http://[64:ff9b::a9fe:a9fe]:80", Refusal::MetadataOrNat64),
        ("http://[64:ff9b:1::a9fe:a9fe]:80", Refusal::MetadataOrNat64),
        // Loopback and unspecified (0.0.0.0 reaches the local host on Linux).
        ("http://127.0.0.1:9464", Refusal::Loopback),
        ("http://127.1.2.3:9464", Refusal::Loopback),
        ("http://[::1]:9464", Refusal::Loopback),
        ("http://[::ffff:127.0.0.1]:9464", Refusal::Loopback),
        ("http://0.0.0.0:9464", Refusal::Unspecified),
        ("http://[::]:9464", Refusal::Unspecified),
        ("http://224.0.0.1:9464", Refusal::Multicast),
        ("http://[ff02::1]:9464", Refusal::Multicast),
        ("http://255.255.255.255:9464", Refusal::Broadcast),
        // Forms: other schemes, userinfo tricks, names (decimal, octal, hex
        // "addresses" are names to the strict grammar), paths.
        ("https://10.0.0.1:9464", Refusal::Form(UrlProblem::Scheme)),
        ("file:///etc/passwd", Refusal::Form(UrlProblem::Scheme)),
        ("gopher://10.0.0.1:70", Refusal::Form(UrlProblem::Scheme)),
        (
            "http://10.0.0.1@169.254.169.254/",
            Refusal::Form(UrlProblem::Userinfo),
        ),
        (
            "http://10.0.0.1:9464@169.254.169.254:80",
            Refusal::Form(UrlProblem::Userinfo),
        ),
        ("http://2852039166/", Refusal::Form(UrlProblem::Port)),
        ("http://2852039166:80/", Refusal::Form(UrlProblem::NotAnIp)),
        (
            "http://0251.0376.0251.0376:80",
            Refusal::Form(UrlProblem::NotAnIp),
        ),
        (
            "http://0xa9.0xfe.0xa9.0xfe:80",
            Refusal::Form(UrlProblem::NotAnIp),
        ),
        (
            "http://169.254.169.254.nip.io:80",
            Refusal::Form(UrlProblem::NotAnIp),
        ),
        ("http://10.0.0.1:9464/../x", Refusal::Form(UrlProblem::Path)),
    ] {
        assert_eq!(open.check(raw), Err(refusal), "{raw}");
    }
    // The allow-list: the default policy only takes RFC 1918 addresses.
    let production = DiscoveryPolicy::default();
    assert_eq!(
        production.check("http://8.8.8.8:9464"),
        Err(Refusal::OutsideNetworks)
    );
    assert_eq!(
        production.check("http://100.64.0.1:9464"),
        Err(Refusal::OutsideNetworks)
    );
    for good in [
        "http://10.0.3.7:9464",
        "http://172.31.0.9:9464/",
        "http://192.168.1.2:9464",
    ] {
        assert!(production.check(good).is_ok(), "{good}");
    }
    // Not even when the operator widened the networks to every ULA and NAT64.
    let widened = DiscoveryPolicy {
        networks: vec![
            Network::parse("fd00::/8").unwrap(),
            Network::parse("64:ff9b::/32").unwrap(),
        ],
        allow_loopback: false,
    };
    assert_eq!(
        widened.check("http://[fd00:ec2::254]:80"),
        Err(Refusal::MetadataOrNat64)
    );
    assert!(
        widened.check("http://[fd00:1::5]:9464").is_ok(),
        "other ULAs pass"
    );
    // Loopback only in dev.
    assert!(
        DiscoveryPolicy::dev()
            .check("http://127.0.0.1:9464")
            .is_ok()
    );
    assert_eq!(
        DiscoveryPolicy::dev().check("http://169.254.169.254:80"),
        Err(Refusal::LinkLocal)
    );
}

#[test]
fn discovery_dedups_bounds_and_summarises_without_values() {
    let mut values: Vec<String> = (0..MAX_DISCOVERED + 5)
        .map(|i| format!("http://10.0.{}.{}:9464", i / 250, i % 250 + 1))
        .collect();
    values.push("http://10.0.0.1:9464/".into()); // a duplicate of the first
    values.push("http://10.0.0.1@169.254.169.254/".into());
    values.push("http://[::ffff:169.254.169.254]:80".into());
    let discovery = Discovery::from_values(
        values.iter().map(String::as_str),
        &DiscoveryPolicy::default(),
    );
    assert_eq!(discovery.accepted.len(), MAX_DISCOVERED);
    assert_eq!(discovery.refused.get(&Refusal::OverLimit), Some(&5));
    let summary = discovery.summary().unwrap();
    assert!(
        summary.starts_with("7 sidecar_url values refused"),
        "{summary}"
    );
    assert!(
        !summary.contains("169.254") && !summary.contains("10.0."),
        "{summary}"
    );
    assert_eq!(Discovery::default().summary(), None);
}

/// A one-answer-per-connection HTTP server: counts requests, answers `reply`.
async fn server(reply: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
    server_on("127.0.0.1", reply).await
}

/// [`server`] on a loopback address of the test's choosing.
async fn server_on(ip: &str, reply: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut request = [0_u8; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(&reply).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, hits)
}

fn answer(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

fn one(addr: SocketAddr) -> Discovery {
    Discovery::from_values(
        [SidecarUrl::new(addr).to_string().as_str()],
        &DiscoveryPolicy::dev(),
    )
}

/// Polls the one sidecar at `addr` with `timeout` for it and for the poll.
async fn poll_one(addr: SocketAddr, timeout: Duration) -> Vec<SidecarReport> {
    poll_discovered(
        &one(addr),
        &PollLimits::new(timeout, timeout),
        &HashSet::new(),
    )
    .await
    .reports
}

#[tokio::test]
async fn a_silent_sidecar_is_reported_not_fatal() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let reports = poll_one(addr, Duration::from_millis(500)).await;
    assert_eq!(reports.len(), 1);
    assert!(reports[0].status.is_none());
    assert_eq!(reports[0].error.as_deref(), Some("unreachable"));
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    // The redirect points at a second server standing in for 169.254.169.254
    // (which a test cannot bind): it must never be asked.
    let (target, target_hits) = server(answer("200 OK", "", b"{}")).await;
    let location = format!("location: http://{target}/status\r\n");
    let (redirector, _) = server(answer("302 Found", &location, b"")).await;
    let reports = poll_one(redirector, Duration::from_secs(2)).await;
    assert_eq!(
        reports[0].error.as_deref(),
        Some(SidecarProblem::Redirect.as_str())
    );
    assert!(reports[0].status.is_none());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(target_hits.load(Ordering::SeqCst), 0, "redirect followed");
}

#[tokio::test]
async fn a_huge_body_is_cut_off_and_never_shown() {
    let body = format!(
        "{{\"secret\":\"{}\"}}",
        "CANARY".repeat(MAX_STATUS_BYTES / 4)
    );
    let (addr, _) = server(answer("200 OK", "", body.as_bytes())).await;
    let reports = poll_one(addr, Duration::from_secs(5)).await;
    assert_eq!(
        reports[0].error.as_deref(),
        Some(SidecarProblem::TooLarge.as_str())
    );
    let (addr, _) = server(answer("500 Oops", "", b"CANARY stack trace")).await;
    let reports = poll_one(addr, Duration::from_secs(5)).await;
    assert_eq!(
        reports[0].error.as_deref(),
        Some(SidecarProblem::HttpStatus.as_str())
    );
    let (addr, _) = server(answer("200 OK", "", b"CANARY not json")).await;
    let reports = poll_one(addr, Duration::from_secs(5)).await;
    assert_eq!(
        reports[0].error.as_deref(),
        Some(SidecarProblem::NotStatus.as_str())
    );
    let shown = serde_json::to_string(&reports).unwrap();
    assert!(!shown.contains("CANARY"), "{shown}");
}

#[tokio::test]
async fn a_slow_body_is_bounded_by_the_timeout() {
    // Headers at once, then a byte every 200 ms of a body that never ends
    // (declared within the size limit, so only time can stop it).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0_u8; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n{")
                    .await;
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if socket.write_all(b" ").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let started = std::time::Instant::now();
    let reports = tokio::time::timeout(
        Duration::from_secs(10),
        poll_one(addr, Duration::from_millis(700)),
    )
    .await
    .expect("the poll must end by itself");
    assert_eq!(
        reports[0].error.as_deref(),
        Some(SidecarProblem::Timeout.as_str())
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_status_keeps_only_what_the_views_use_with_lists_capped() {
    let leases: Vec<serde_json::Value> = (0..KEPT_LEASES + 10)
        .map(|i| serde_json::json!({"stream_id": format!("s-{i}"), "fence_token": 1, "expires_at_ms": 1}))
        .collect();
    let lag: serde_json::Map<String, serde_json::Value> = (0..KEPT_LAG_ENTRIES + 10)
        .map(|i| {
            (
                format!("s-{i:05}"),
                serde_json::json!({"lag_events": 1, "lag_seconds": 0.5}),
            )
        })
        .collect();
    let claims: Vec<serde_json::Value> = (1..=KEPT_CLAIMS as u64 + 5)
        .map(|seq| serde_json::json!({"seq": seq, "age_ms": 1, "seconds": 0.1}))
        .collect();
    let body = serde_json::json!({
        "component": "stream-worker", "owner_id": "x".repeat(KEPT_ID_LEN + 1),
        "worker_connected": true, "last_event_age_ms": 1, "worker_up": true,
        "events_received": 1, "events_dropped": 0, "leases": leases, "lag": lag,
        "websocket_connections": 0, "pool": null, "observer": true, "claims": claims,
    });
    let kept: KeptStatus = serde_json::from_value(body).unwrap();
    assert_eq!(kept.leases.len(), KEPT_LEASES);
    assert_eq!(kept.leases[0].stream_id, "s-0", "the first leases are kept");
    assert_eq!(kept.lag.len(), KEPT_LAG_ENTRIES);
    assert_eq!(kept.claims.len(), KEPT_CLAIMS);
    assert_eq!(
        kept.claims.last().map(|c| c.seq),
        Some(KEPT_CLAIMS as u64 + 5),
        "the newest claims are kept"
    );
    assert_eq!(
        kept.owner_id, None,
        "an owner id longer than any kept is dropped"
    );
    assert!(kept.observer && kept.worker_up);
    let shown = serde_json::to_value(&kept).unwrap();
    assert!(shown.get("events_received").is_none(), "{shown}");
}

#[tokio::test]
async fn bodies_past_the_byte_budget_are_refused_with_or_without_a_length() {
    let status = serde_json::json!({
        "component": "stream-worker", "owner_id": "w", "worker_up": true,
        "leases": [], "lag": {}, "observer": false,
    })
    .to_string();
    let budget = status.len() * 3 / 2;
    // With a length: refused before its body is read.
    let (first, _) = server(answer("200 OK", "", status.as_bytes())).await;
    let (second, _) = server(answer("200 OK", "", status.as_bytes())).await;
    // Without one (chunked): refused as soon as a chunk would go past.
    let mut chunked =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    chunked.extend_from_slice(format!("{:x}\r\n{status}\r\n0\r\n\r\n", status.len()).as_bytes());
    let (third, _) = server(chunked).await;
    let discovery = Discovery::from_values(
        [first, second, third]
            .map(|addr| SidecarUrl::new(addr).to_string())
            .iter()
            .map(String::as_str),
        &DiscoveryPolicy::dev(),
    );
    let limits = PollLimits {
        byte_budget: budget,
        ..PollLimits::new(Duration::from_secs(5), Duration::from_secs(5))
    };
    let poll = poll_discovered(&discovery, &limits, &HashSet::new()).await;
    assert!(poll.bytes_read <= budget, "{}", poll.bytes_read);
    let answered = poll.reports.iter().filter(|r| r.status.is_some()).count();
    let over = poll
        .reports
        .iter()
        .filter(|r| r.error.as_deref() == Some(SidecarProblem::OverBudget.as_str()))
        .count();
    assert_eq!((answered, over), (1, 2), "{:?}", poll.reports);
}

#[tokio::test]
async fn those_that_answered_last_time_are_asked_first() {
    // A poll of the concurrency's worth of silent addresses that sort first
    // (127.0.0.2) and one sidecar that answered last time (127.0.0.3), with a
    // deadline shorter than one sidecar's timeout: only the first batch is
    // ever asked, and the known sidecar must be in it.
    let mut silent = Vec::new();
    for _ in 0..POLL_CONCURRENCY {
        silent.push(TcpListener::bind("127.0.0.2:0").await.unwrap());
    }
    let status = serde_json::json!({
        "worker_up": true, "leases": [], "lag": {}, "observer": false,
    })
    .to_string();
    let (known, _) = server_on("127.0.0.3", answer("200 OK", "", status.as_bytes())).await;
    let urls: Vec<String> = silent
        .iter()
        .map(|listener| listener.local_addr().unwrap())
        .chain([known])
        .map(|addr| SidecarUrl::new(addr).to_string())
        .collect();
    let discovery =
        Discovery::from_values(urls.iter().map(String::as_str), &DiscoveryPolicy::dev());
    let known_url = SidecarUrl::new(known).to_string();
    let limits = PollLimits::new(Duration::from_secs(3), Duration::from_secs(1));
    let poll = poll_discovered(&discovery, &limits, &HashSet::from([known_url.clone()])).await;
    let report = poll.reports.iter().find(|r| r.url == known_url).unwrap();
    assert!(report.status.is_some(), "{report:?}");
}
