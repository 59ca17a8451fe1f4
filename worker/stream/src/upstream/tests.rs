//! The WebSocket adapter against the feed simulator and scripted servers.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use leasehold_telemetry::{SkipReason, TelemetryEvent};
use serde_json::Value;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

use super::*;
use leasehold_feed::{FeedConfig, FeedServer, event_frame};
use leasehold_telemetry::RecordingSink;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_util::sync::CancellationToken;

/// Generous: only a broken implementation takes this long.
const WAIT: Duration = Duration::from_secs(10);

/// What the subscription reported about its stream: the connection gauge
/// and the subscribe time (checked in the shared-connection tests) left out.
fn stream_events(telemetry: &RecordingSink) -> Vec<TelemetryEvent> {
    telemetry
        .take()
        .into_iter()
        .filter(|e| {
            !matches!(
                e,
                TelemetryEvent::UpstreamConnections { .. }
                    | TelemetryEvent::UpstreamSubscribed { .. }
            )
        })
        .collect()
}

fn upstream(config: WebSocketUpstreamConfig) -> (WebSocketUpstream, RecordingSink) {
    let sink = RecordingSink::new();
    (WebSocketUpstream::new(config, Arc::new(sink.clone())), sink)
}

async fn feed(config: FeedConfig) -> (FeedServer, CancellationToken) {
    let shutdown = CancellationToken::new();
    let server = FeedServer::start(([127, 0, 0, 1], 0).into(), config, shutdown.clone())
        .await
        .expect("feed starts");
    (server, shutdown)
}

async fn subscribe(
    upstream: &WebSocketUpstream,
    stream_id: &str,
    from_seq: u64,
) -> Result<Box<dyn Subscription>, UpstreamError> {
    timeout(WAIT, upstream.subscribe(stream_id, from_seq))
        .await
        .expect("subscribe in time")
}

async fn next(sub: &mut Box<dyn Subscription>) -> Result<UpstreamEvent, UpstreamError> {
    timeout(WAIT, sub.next()).await.expect("next in time")
}

/// What a scripted server saw from the client.
#[derive(Debug)]
struct Seen {
    uri: String,
    subscribe: Option<String>,
}

/// A one-connection server that optionally waits for a subscribe message, sends
/// `frames`, then stays open until the client leaves.
// tungstenite's handshake callback fixes the (large) error type.
#[allow(clippy::result_large_err)]
async fn scripted(
    wait_for_subscribe: bool,
    frames: Vec<Message>,
) -> (SocketAddr, JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut uri = String::new();
        let mut ws = tokio_tungstenite::accept_hdr_async(tcp, |req: &Request, resp: Response| {
            uri = req.uri().to_string();
            Ok(resp)
        })
        .await
        .expect("handshake");
        let mut subscribe = None;
        if wait_for_subscribe {
            while let Some(Ok(message)) = ws.next().await {
                if let Message::Text(text) = message {
                    subscribe = Some(text.to_string());
                    break;
                }
            }
        }
        for frame in frames {
            if ws.send(frame).await.is_err() {
                break;
            }
        }
        while let Some(Ok(_)) = ws.next().await {}
        Seen { uri, subscribe }
    });
    (addr, task)
}

fn skipped(stream_id: &str, reason: SkipReason) -> TelemetryEvent {
    TelemetryEvent::UpstreamFrameSkipped {
        stream_id: stream_id.to_owned(),
        reason,
    }
}

#[tokio::test]
async fn reads_the_feed_in_order_and_reports_connect_and_disconnect_once() {
    let (server, shutdown) = feed(FeedConfig {
        rate: 0.01,
        retention: 1000,
        backlog: 50,
    })
    .await;
    let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
    let mut sub = subscribe(&upstream, "eth-usd", 1)
        .await
        .expect("subscribed");
    for seq in 1..=50 {
        let event = next(&mut sub).await.expect("event");
        assert_eq!(event.seq, seq);
        assert_eq!(event.event_id, format!("eth-usd:{seq}"));
        assert_eq!(
            event.payload,
            event_frame("eth-usd", seq, server.ts_ms(seq))
        );
    }
    timeout(WAIT, sub.close()).await.expect("close in time");
    timeout(WAIT, sub.close())
        .await
        .expect("second close in time");
    assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
    drop(sub);
    let stream_id = "eth-usd".to_owned();
    assert_eq!(
        stream_events(&telemetry),
        vec![
            TelemetryEvent::UpstreamConnected {
                stream_id: stream_id.clone(),
                from_seq: 1
            },
            TelemetryEvent::UpstreamDisconnected { stream_id },
        ]
    );
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("feed stops");
}

#[tokio::test]
async fn replays_a_large_backlog_in_order() {
    let (server, shutdown) = feed(FeedConfig {
        rate: 0.01,
        retention: 100_000,
        backlog: 20_000,
    })
    .await;
    let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
    let mut sub = subscribe(&upstream, "bulk", 1).await.expect("subscribed");
    for seq in 1..=20_000 {
        assert_eq!(next(&mut sub).await.expect("event").seq, seq);
    }
    drop(sub);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("feed stops");
}

#[tokio::test]
async fn retention_exceeded_carries_the_earliest_sequence() {
    let (server, shutdown) = feed(FeedConfig {
        rate: 0.01,
        retention: 10,
        backlog: 100,
    })
    .await;
    let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
    let mut sub = subscribe(&upstream, "s", 5).await.expect("subscribed");
    let expected = UpstreamError::RetentionExceeded {
        requested: 5,
        earliest: Some(91),
    };
    assert_eq!(next(&mut sub).await, Err(expected.clone()));
    assert_eq!(expected.reason(), "retention_exceeded");
    // The subscription stays finished.
    assert_eq!(next(&mut sub).await, Err(expected));
    drop(sub);
    shutdown.cancel();
    timeout(WAIT, server.finished()).await.expect("feed stops");
}

/// Events 1, 2, 1, 2, 5 among frames the adapter must skip (not JSON,
/// binary, too large for a 1,024-byte limit, a missing or malformed id) and
/// a ping it answers itself.
fn events_among_bad_frames() -> Vec<Message> {
    let event = |seq: u64| Message::text(format!(r#"{{"seq":{seq},"event_id":"s:{seq}"}}"#));
    let oversized = format!(
        r#"{{"seq":2,"event_id":"s:2","pad":"{}"}}"#,
        "x".repeat(2000)
    );
    vec![
        event(1),
        Message::text("not json"),
        Message::binary(br#"{"seq":2,"event_id":"s:2"}"#.to_vec()),
        Message::text(oversized),
        Message::text(r#"{"event_id":"s:2"}"#),
        Message::text(r#"{"seq":2,"event_id":{"nested":true}}"#),
        Message::Ping(vec![1].into()),
        event(2),
        event(1),
        event(2),
        event(5),
    ]
}

/// What [`events_among_bad_frames`] reports, in order.
fn skips_among_bad_frames() -> Vec<TelemetryEvent> {
    vec![
        skipped("s", SkipReason::NotJson),
        skipped("s", SkipReason::NotJson),
        skipped("s", SkipReason::TooLarge),
        skipped("s", SkipReason::MissingField),
        skipped("s", SkipReason::MissingField),
    ]
}

async fn subscribed_to_bad_frames() -> (Box<dyn Subscription>, RecordingSink, JoinHandle<Seen>) {
    let (addr, server) = scripted(true, events_among_bad_frames()).await;
    let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
    config.max_frame_bytes = 1024;
    let (upstream, telemetry) = upstream(config);
    let sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
    (sub, telemetry, server)
}

#[tokio::test]
async fn bad_frames_are_skipped_and_reported_and_sequences_pass_as_sent() {
    let (mut sub, telemetry, server) = subscribed_to_bad_frames().await;
    assert_eq!(next(&mut sub).await.expect("event").seq, 1);
    let second = next(&mut sub).await.expect("event");
    assert_eq!((second.seq, second.event_id.as_str()), (2, "s:2"));
    // Replays and jumps are the runner's to judge: the adapter passes them on.
    for expected in [1, 2, 5] {
        assert_eq!(next(&mut sub).await.expect("event").seq, expected);
    }
    drop(sub);
    let seen = timeout(WAIT, server)
        .await
        .expect("server ends")
        .expect("server ok");
    assert_eq!(
        seen.subscribe.as_deref(),
        Some(r#"{"subscribe": "s", "from_seq": 1}"#)
    );
    let mut expected = vec![TelemetryEvent::UpstreamConnected {
        stream_id: "s".into(),
        from_seq: 1,
    }];
    expected.extend(skips_among_bad_frames());
    expected.push(TelemetryEvent::UpstreamDisconnected {
        stream_id: "s".into(),
    });
    assert_eq!(stream_events(&telemetry), expected);
}

/// The runner takes a busy stream's buffered frames through `next_ready`:
/// it must read them exactly as `next` does (the same events, the same
/// skips), and say `None` rather than wait when nothing is buffered.
#[tokio::test]
async fn next_ready_reads_buffered_frames_as_next_does_and_never_waits() {
    let (mut sub, telemetry, _server) = subscribed_to_bad_frames().await;
    let mut seqs = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seqs.len() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "read {seqs:?}");
        match sub.next_ready() {
            Some(event) => seqs.push(event.expect("event").seq),
            // Not here yet: the frames are still on their way.
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!(seqs, [1, 2, 1, 2, 5]);
    assert!(
        sub.next_ready().is_none(),
        "nothing more is buffered: next_ready must not wait for the next frame"
    );
    let mut taken = stream_events(&telemetry);
    taken.retain(|event| matches!(event, TelemetryEvent::UpstreamFrameSkipped { .. }));
    assert_eq!(taken, skips_among_bad_frames());
}

#[tokio::test]
async fn a_frame_beyond_the_hard_limit_closes_instead_of_buffering() {
    let (addr, _server) = scripted(false, vec![Message::text("x".repeat(200_000))]).await;
    let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
    config.max_frame_bytes = 1024;
    let (upstream, _) = upstream(config);
    let mut sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
    assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
}

#[tokio::test]
async fn custom_url_subscribe_template_and_pointers() {
    let frame = |seq: u64, id: u64| {
        Message::text(format!(
            r#"{{"data":{{"sequence":{seq},"id":{id}}},"px":1.5}}"#
        ))
    };
    let (addr, server) = scripted(true, vec![frame(7, 700), frame(8, 800)]).await;
    let config = WebSocketUpstreamConfig {
        url_template: format!("ws://{addr}/streams/{{stream_id}}?depth=1"),
        subscribe_template: r#"{"op":"sub","args":["{stream_id}"],"since":{from_seq}}"#.into(),
        seq_pointer: "/data/sequence".into(),
        id_pointer: "/data/id".into(),
        ..WebSocketUpstreamConfig::for_feed("unused")
    };
    let (upstream, _) = upstream(config);
    let stream_id = r#"a"b/c {from_seq}"#;
    let mut sub = subscribe(&upstream, stream_id, 7)
        .await
        .expect("subscribed");
    let first = next(&mut sub).await.expect("event");
    assert_eq!((first.seq, first.event_id.as_str()), (7, "700"));
    assert_eq!(
        first.payload,
        r#"{"data":{"sequence":7,"id":700},"px":1.5}"#
    );
    assert_eq!(next(&mut sub).await.expect("event").event_id, "800");
    sub.close().await;
    let seen = timeout(WAIT, server)
        .await
        .expect("server ends")
        .expect("server ok");
    assert_eq!(seen.uri, "/streams/a%22b%2Fc%20%7Bfrom_seq%7D?depth=1");
    let sent: Value = serde_json::from_str(&seen.subscribe.expect("subscribe sent")).expect("JSON");
    assert_eq!(
        sent["args"][0], stream_id,
        "stream id escaped, not re-substituted"
    );
    assert_eq!(sent["since"], 7);
}

#[tokio::test]
async fn empty_template_sends_nothing_and_from_zero_starts_anywhere() {
    let frames = vec![
        Message::text(r#"{"seq":42,"event_id":"x"}"#),
        Message::text(r#"{"seq":43,"event_id":"y"}"#),
    ];
    let (addr, server) = scripted(false, frames).await;
    let mut config = WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"));
    config.subscribe_template = String::new();
    let (upstream, _) = upstream(config);
    let mut sub = subscribe(&upstream, "s", 0).await.expect("subscribed");
    assert_eq!(next(&mut sub).await.expect("event").seq, 42);
    assert_eq!(next(&mut sub).await.expect("event").seq, 43);
    sub.close().await;
    let seen = timeout(WAIT, server)
        .await
        .expect("server ends")
        .expect("server ok");
    assert_eq!(seen.subscribe, None);
}

#[tokio::test]
async fn other_server_errors_and_close_frames_end_the_subscription() {
    let (addr, _server) = scripted(
        false,
        vec![Message::text(
            r#"{"error":"no such stream","code":"not_found"}"#,
        )],
    )
    .await;
    let (upstream_a, _) = upstream(WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/")));
    let mut sub = subscribe(&upstream_a, "s", 1).await.expect("subscribed");
    assert_eq!(
        next(&mut sub).await,
        Err(UpstreamError::Rejected("not_found: no such stream".into()))
    );

    let (addr, _server) = scripted(false, vec![Message::Close(None)]).await;
    let (upstream_b, telemetry) =
        upstream(WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/")));
    let mut sub = subscribe(&upstream_b, "s", 1).await.expect("subscribed");
    assert_eq!(next(&mut sub).await.map_err(|e| e.reason()), Err("closed"));
    drop(sub);
    let disconnects = telemetry
        .take()
        .into_iter()
        .filter(|e| matches!(e, TelemetryEvent::UpstreamDisconnected { .. }))
        .count();
    assert_eq!(disconnects, 1);
}

#[tokio::test]
async fn connect_errors_never_show_credentials() {
    // A port that was just free: connection refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    for url in [
        format!("ws://user:pass@127.0.0.1:{port}/x?token=abc"),
        "wss://user:pass@127.0.0.1:1/x?token=abc".to_owned(),
    ] {
        let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&url));
        let error = match upstream.subscribe("s", 1).await {
            Err(error) => error,
            Ok(_) => panic!("connecting to {url} should fail"),
        };
        assert_eq!(error.reason(), "connect", "{error}");
        let text = format!("{error} {error:?}");
        for secret in ["user", "pass", "token", "abc"] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
        assert!(text.contains("127.0.0.1"), "{text}");
        assert!(
            stream_events(&telemetry).is_empty(),
            "no connect event for a failed connect"
        );
    }
}

#[tokio::test]
async fn feed_shutdown_ends_the_subscription_as_closed() {
    let (server, shutdown) = feed(FeedConfig {
        rate: 100.0,
        ..FeedConfig::default()
    })
    .await;
    let (upstream, telemetry) = upstream(WebSocketUpstreamConfig::for_feed(&server.url()));
    let mut sub = subscribe(&upstream, "s", 1).await.expect("subscribed");
    assert_eq!(next(&mut sub).await.expect("event").seq, 1);
    shutdown.cancel();
    let error = loop {
        match next(&mut sub).await {
            Ok(_) => continue,
            Err(error) => break error,
        }
    };
    assert_eq!(error.reason(), "closed", "{error}");
    timeout(WAIT, server.finished()).await.expect("feed stops");
    drop(sub);
    let events = stream_events(&telemetry);
    assert_eq!(
        events.last(),
        Some(&TelemetryEvent::UpstreamDisconnected {
            stream_id: "s".into()
        })
    );
    assert_eq!(events.len(), 2, "{events:?}");
}

#[tokio::test]
async fn subscribe_refuses_an_invalid_config() {
    let (upstream, _) = upstream(WebSocketUpstreamConfig::for_feed("http://host/"));
    let error = upstream.subscribe("s", 1).await.err().expect("refused");
    assert_eq!(error.reason(), "config");
}

/// A WebSocket server that sends one event for stream `s` and then either keeps
/// reading (a live but quiet upstream: tungstenite answers the client's pings)
/// or freezes (never reads again: pings go unanswered, as behind a half-open
/// connection or a stopped process).
async fn one_event_then(frozen: bool) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(socket).await.unwrap();
        ws.send(Message::text(event_frame("s", 1, 0)))
            .await
            .unwrap();
        if frozen {
            tokio::time::sleep(Duration::from_secs(60)).await;
        } else {
            while let Some(Ok(_)) = ws.next().await {}
        }
    });
    (addr, server)
}

fn quick_idle(addr: SocketAddr) -> WebSocketUpstreamConfig {
    WebSocketUpstreamConfig {
        subscribe_template: String::new(),
        idle_timeout: Duration::from_millis(300),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    }
}

#[tokio::test]
async fn a_frozen_upstream_ends_the_subscription_after_the_idle_timeout() {
    let (addr, server) = one_event_then(true).await;
    let (upstream, events) = upstream(quick_idle(addr));
    let mut sub = subscribe(&upstream, "s", 1).await.unwrap();
    assert_eq!(next(&mut sub).await.unwrap().seq, 1);
    let silent_since = Instant::now();
    let error = next(&mut sub)
        .await
        .expect_err("a frozen upstream is noticed");
    assert_eq!(error.reason(), "idle");
    let waited = silent_since.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(2),
        "noticed after {waited:?}"
    );
    assert!(
        events
            .snapshot()
            .iter()
            .any(|e| matches!(e, TelemetryEvent::UpstreamDisconnected { .. })),
        "the connection is reported gone"
    );
    server.abort();
}

#[tokio::test]
async fn a_quiet_upstream_that_answers_pings_is_kept() {
    let (addr, server) = one_event_then(false).await;
    let (upstream, _) = upstream(quick_idle(addr));
    let mut sub = subscribe(&upstream, "s", 1).await.unwrap();
    assert_eq!(next(&mut sub).await.unwrap().seq, 1);
    // Five idle timeouts without data: the pongs keep it alive.
    let waited = timeout(Duration::from_millis(1500), sub.next()).await;
    assert!(
        waited.is_err(),
        "still waiting for data, not failed: {waited:?}"
    );
    server.abort();
}

#[tokio::test]
async fn the_event_time_gives_the_arrival_lag_when_a_pointer_names_it() {
    use leasehold_control::clock::Clock;
    let five_seconds_ago = leasehold_control::clock::SystemClock.now_ms_u64() - 5_000;
    for pointer in [Some("/ts_ms"), None] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(socket).await.unwrap();
            ws.send(Message::text(event_frame("s", 1, five_seconds_ago)))
                .await
                .unwrap();
            while let Some(Ok(_)) = ws.next().await {}
        });
        let config = WebSocketUpstreamConfig {
            subscribe_template: String::new(),
            ts_pointer: pointer.map(str::to_owned),
            ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
        };
        let (upstream, _) = upstream(config);
        let mut sub = subscribe(&upstream, "s", 1).await.unwrap();
        let event = next(&mut sub).await.unwrap();
        match pointer {
            Some(_) => {
                let lag = event.arrival_lag.expect("a time was named");
                assert!((4.9..7.0).contains(&lag), "arrival lag {lag}");
            }
            None => assert_eq!(event.arrival_lag, None),
        }
        server.abort();
    }
}

#[tokio::test]
async fn frames_matching_no_data_alternative_are_control_frames() {
    let (addr, server) = scripted(
        false,
        vec![
            Message::text(r#"{"type":"subscriptions","channels":[]}"#),
            Message::text(r#"{"type":"heartbeat","sequence":90,"trade_id":1}"#),
            Message::text(r#"{"type":"match","sequence":91,"trade_id":7}"#),
            Message::text(r#"{"type":"last_match","sequence":95,"trade_id":8}"#),
            // Data by its type, but without a sequence: still missing_field.
            Message::text(r#"{"type":"match","trade_id":9}"#),
            Message::text(r#"{"type":"error","error":"bad product","code":"bad_request"}"#),
        ],
    )
    .await;
    let config = WebSocketUpstreamConfig {
        subscribe_template: String::new(),
        seq_pointer: "/sequence".into(),
        id_pointer: "/trade_id".into(),
        data_match: crate::upstream::DataMatch::parse_list("/type=match,/type=last_match").unwrap(),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    };
    let (upstream, telemetry) = upstream(config);
    let mut sub = subscribe(&upstream, "s", 0).await.unwrap();
    assert_eq!(next(&mut sub).await.unwrap().seq, 91);
    assert_eq!(next(&mut sub).await.unwrap().seq, 95);
    assert!(matches!(
        next(&mut sub).await,
        Err(UpstreamError::Rejected(_))
    ));
    drop(sub);
    server.abort();
    let skips: Vec<TelemetryEvent> = telemetry
        .take()
        .into_iter()
        .filter(|e| matches!(e, TelemetryEvent::UpstreamFrameSkipped { .. }))
        .collect();
    assert_eq!(
        skips,
        vec![
            skipped("s", SkipReason::Control),
            skipped("s", SkipReason::Control),
            skipped("s", SkipReason::MissingField),
        ]
    );
}

/// A server that cuts a client whose last application ping is older than
/// `silent`, answering each ping with `pong`; it sends one event per 100 ms
/// when `busy`, so the client's ping must go out between frames too.
async fn cuts_silent_clients(
    silent: Duration,
    busy: bool,
) -> (SocketAddr, JoinHandle<(u64, bool)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(socket).await.unwrap();
        let mut last_ping = Instant::now();
        let mut pings = 0;
        let mut seq = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            tokio::select! {
                message = ws.next() => match message {
                    Some(Ok(Message::Text(text))) if text.as_str() == "ping" => {
                        pings += 1;
                        last_ping = Instant::now();
                        let _ = ws.send(Message::text("pong")).await;
                    }
                    Some(Ok(_)) => {}
                    _ => return (pings, false),
                },
                _ = tick.tick() => {
                    if last_ping.elapsed() > silent {
                        let _ = ws.close(None).await;
                        return (pings, true);
                    }
                    if Instant::now() > deadline {
                        return (pings, false);
                    }
                    if busy {
                        seq += 1;
                        let _ = ws.send(Message::text(event_frame("s", seq, 0))).await;
                    }
                }
            }
        }
    });
    (addr, server)
}

#[tokio::test]
async fn application_pings_keep_a_connection_the_server_would_cut() {
    for busy in [false, true] {
        let (addr, server) = cuts_silent_clients(Duration::from_millis(700), busy).await;
        let config = WebSocketUpstreamConfig {
            subscribe_template: String::new(),
            ping_text: Some("ping".into()),
            ping_interval: Duration::from_millis(200),
            ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
        };
        let (upstream, telemetry) = upstream(config);
        let mut sub = subscribe(&upstream, "s", 0).await.unwrap();
        let reader = tokio::spawn(async move { while sub.next().await.is_ok() {} });
        let (pings, cut) = timeout(WAIT, server).await.unwrap().unwrap();
        assert!(!cut, "busy={busy}: the server cut a pinging client");
        assert!(pings >= 10, "busy={busy}: {pings} pings in 3 s");
        reader.abort();
        // `pong` is not JSON: with application pings on it is a control frame.
        let events = stream_events(&telemetry);
        assert!(
            events.contains(&skipped("s", SkipReason::Control)),
            "busy={busy}"
        );
        assert!(
            !events.contains(&skipped("s", SkipReason::NotJson)),
            "busy={busy}"
        );
    }
    // Without them the same server cuts the client.
    let (addr, server) = cuts_silent_clients(Duration::from_millis(700), false).await;
    let (upstream, _) = upstream(WebSocketUpstreamConfig {
        subscribe_template: String::new(),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    });
    let mut sub = subscribe(&upstream, "s", 0).await.unwrap();
    let reader = tokio::spawn(async move { while sub.next().await.is_ok() {} });
    let (_, cut) = timeout(WAIT, server).await.unwrap().unwrap();
    assert!(cut, "a silent client is cut");
    reader.abort();
}

/// One stream's frames of the recorded Binance USD-M futures session (real
/// traffic, testdata/recordings), in the order they arrived.
fn recorded_binance_futures(stream: &str) -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/recordings/BINANCE_FUTURES.ws.1.0"
    );
    let recording = std::fs::read_to_string(path).expect("the recording");
    let tag = format!("\"stream\":\"{stream}\"");
    recording
        .lines()
        .skip(1)
        .filter(|line| !line.contains(" <- "))
        .filter_map(|line| line.split_once(": ").map(|(_, frame)| frame))
        .filter(|frame| frame.contains(&tag))
        .map(str::to_owned)
        .collect()
}

/// The recorded diffs read through the adapter with `range`, then judged by
/// the sequencer as a `live` stream: the steps it hands on.
async fn judged(frames: &[String], range: SeqRange) -> Vec<crate::sequence::Step<u64>> {
    use crate::sequence::{ResumeMode, SeqStep, Sequencer};
    let (addr, _server) = scripted(
        false,
        frames.iter().map(|f| Message::text(f.clone())).collect(),
    )
    .await;
    let config = WebSocketUpstreamConfig {
        url_template: format!("ws://{addr}/stream"),
        subscribe_template: String::new(),
        seq_pointer: "/data/u".into(),
        range: Some(range),
        id_pointer: "/data/u".into(),
        ..WebSocketUpstreamConfig::for_feed("unused")
    };
    let (upstream, _) = upstream(config);
    let mut sub = subscribe(&upstream, "sushiusdt", 0)
        .await
        .expect("subscribed");
    let mut sequencer = Sequencer::new(ResumeMode::Live, SeqStep::Increasing, None);
    let mut steps = Vec::new();
    for _ in frames {
        let event = next(&mut sub).await.expect("a diff");
        sequencer.arrive_covering(event.first_seq, event.seq, event.seq, &mut steps);
    }
    steps
}

fn gaps(steps: &[crate::sequence::Step<u64>]) -> Vec<(u64, u64)> {
    steps
        .iter()
        .filter_map(|step| match step {
            crate::sequence::Step::Gap { from, to, .. } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

/// A number in a recorded frame's `data`.
fn data_number(frame: &str, name: &str) -> u64 {
    serde_json::from_str::<Value>(frame).expect("JSON")["data"][name]
        .as_u64()
        .expect("a number")
}

#[tokio::test]
async fn recorded_futures_diffs_chain_by_their_previous_id_and_a_lost_one_is_a_gap() {
    let frames = recorded_binance_futures("sushiusdt@depth@100ms");
    assert!(frames.len() > 100, "{} diffs", frames.len());
    // USD-M futures: `U` is not the previous `u` + 1 (update ids are shared
    // with other symbols), `pu` is the previous `u`: every diff continues.
    let steps = judged(&frames, SeqRange::Prev("/data/pu".into())).await;
    assert_eq!(gaps(&steps), []);
    assert_eq!(steps.len(), frames.len(), "every diff written once");
    // Read by `U` instead, nearly every diff would look like a hole: why
    // futures need `UPSTREAM_SEQ_PREV_POINTER`.
    let by_first = judged(&frames, SeqRange::First("/data/U".into())).await;
    assert!(
        gaps(&by_first).len() > frames.len() / 2,
        "{}",
        gaps(&by_first).len()
    );
    // One diff lost on the way: exactly its range is a gap, from after the
    // diff before it to its own `u`.
    let lost = 50;
    let mut missing = frames.clone();
    missing.remove(lost);
    let steps = judged(&missing, SeqRange::Prev("/data/pu".into())).await;
    assert_eq!(
        gaps(&steps),
        [(
            data_number(&frames[lost - 1], "u") + 1,
            data_number(&frames[lost], "u")
        )]
    );
}

/// The worker's connect budget is shared by its streams: past it a connect
/// waits for the window (and is reported), within it none does.
#[tokio::test]
async fn connects_past_the_workers_budget_wait_for_the_window_and_are_counted() {
    let (server, shutdown) = feed(FeedConfig {
        rate: 0.01,
        retention: 1000,
        backlog: 5,
    })
    .await;
    let window = Duration::from_millis(400);
    let telemetry = RecordingSink::new();
    let upstream = WebSocketUpstream::new(
        WebSocketUpstreamConfig::for_feed(&server.url()),
        Arc::new(telemetry.clone()),
    )
    .with_connect_budget(super::budget::ConnectBudget::new(2, window));
    let started = tokio::time::Instant::now();
    let mut subs = Vec::new();
    for stream in ["a", "b", "c"] {
        subs.push(subscribe(&upstream, stream, 1).await.expect("subscribed"));
    }
    let throttled: Vec<_> = telemetry
        .take()
        .into_iter()
        .filter_map(|event| match event {
            TelemetryEvent::UpstreamConnectThrottled { stream_id, wait } => Some((stream_id, wait)),
            _ => None,
        })
        .collect();
    assert_eq!(throttled.len(), 1, "{throttled:?}");
    assert_eq!(throttled[0].0, "c");
    assert!(throttled[0].1 > Duration::ZERO && throttled[0].1 <= window);
    assert!(
        started.elapsed() >= window - Duration::from_millis(50),
        "the third connect waited for the first to leave the window"
    );
    for mut sub in subs {
        assert_eq!(next(&mut sub).await.expect("event").seq, 1);
        sub.close().await;
    }
    shutdown.cancel();
}

/// A server that sends a book and a delta after the subscribe, then a new
/// book after each further pair of client texts (unsubscribe, subscribe);
/// every text the client sent comes back through the handle.
async fn books_on_request() -> (SocketAddr, JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut ws = tokio_tungstenite::accept_async(tcp)
            .await
            .expect("handshake");
        let mut texts = Vec::new();
        let mut u = 100;
        while let Some(Ok(message)) = ws.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            texts.push(text.to_string());
            if texts.len() % 2 == 0 {
                continue;
            }
            let book = format!(r#"{{"type":"snapshot","data":{{"u":{u},"pu":-1}}}}"#);
            let delta = format!(r#"{{"type":"delta","data":{{"u":{},"pu":{u}}}}}"#, u + 1);
            u += 10;
            for frame in [book, delta] {
                if ws.send(Message::text(frame)).await.is_err() {
                    return texts;
                }
            }
        }
        texts
    });
    (addr, task)
}

#[tokio::test]
async fn a_book_in_the_stream_is_flagged_and_asked_for_again_on_the_same_connection() {
    let (addr, server) = books_on_request().await;
    let config = WebSocketUpstreamConfig {
        subscribe_template: r#"{"op":"subscribe","args":["orderbook.50.{stream_id}"]}"#.into(),
        unsubscribe_template: r#"{"op":"unsubscribe","args":["orderbook.50.{stream_id}"]}"#.into(),
        seq_pointer: "/data/u".into(),
        id_pointer: "/data/u".into(),
        range: Some(SeqRange::Prev("/data/pu".into())),
        snapshot_match: Some(DataMatch {
            pointer: "/type".into(),
            value: Some("snapshot".into()),
        }),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    };
    let (upstream, _) = upstream(config);
    let mut sub = subscribe(&upstream, "BTCUSDT", 0)
        .await
        .expect("subscribed");
    let book = next(&mut sub).await.expect("the book");
    // A book covers no range (its `pu` means nothing).
    assert_eq!((book.seq, book.snapshot, book.first_seq), (100, true, None));
    let delta = next(&mut sub).await.expect("a delta");
    assert_eq!(
        (delta.seq, delta.snapshot, delta.first_seq),
        (101, false, Some(101))
    );
    sub.resubscribe().await.expect("asked on the connection");
    let book = next(&mut sub).await.expect("the new book");
    assert_eq!((book.seq, book.snapshot), (110, true));
    sub.close().await;
    let texts = timeout(WAIT, server).await.unwrap().unwrap();
    assert_eq!(
        texts,
        [
            r#"{"op":"subscribe","args":["orderbook.50.BTCUSDT"]}"#,
            r#"{"op":"unsubscribe","args":["orderbook.50.BTCUSDT"]}"#,
            r#"{"op":"subscribe","args":["orderbook.50.BTCUSDT"]}"#,
        ]
    );
    // Without an unsubscribe the ask fails, and the runner reconnects.
    let (addr, _server) = books_on_request().await;
    let (upstream, _) = self::upstream(WebSocketUpstreamConfig {
        subscribe_template: "{}".into(),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    });
    let mut sub = subscribe(&upstream, "s", 0).await.expect("subscribed");
    assert!(sub.resubscribe().await.is_err());
}

/// A live upstream: one sequence for every connection, a frame every 2 ms
/// from wherever it is when a client subscribes, and every connection cut
/// once it is `cut_at` old (as Binance cuts at 24 h). Every other
/// connection lags 40 ms behind the others, so a new connection starts
/// ahead of the one it replaces, then behind it. Returns its address and
/// how many connections it accepted.
async fn live_upstream_cutting_at(
    cut_at: Duration,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (frames, _) = tokio::sync::broadcast::channel::<u64>(4_096);
    let ticker = frames.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        for seq in 1.. {
            tick.tick().await;
            let _ = ticker.send(seq);
        }
    });
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let lag = Duration::from_millis(if n % 2 == 1 { 40 } else { 0 });
            let mut heads = frames.subscribe();
            tokio::spawn(async move {
                let opened = Instant::now();
                let mut ws = tokio_tungstenite::accept_async(socket).await.unwrap();
                // Frames flow once the client has subscribed.
                let _subscribe = ws.next().await;
                heads = heads.resubscribe();
                let mut due = std::collections::VecDeque::new();
                loop {
                    let next_due = due.front().map(|(at, _)| *at);
                    tokio::select! {
                        seq = heads.recv() => {
                            let Ok(seq) = seq else { return };
                            due.push_back((Instant::now() + lag, seq));
                        }
                        _ = tokio::time::sleep_until(next_due.unwrap_or(opened)), if next_due.is_some() => {
                            while let Some((_, seq)) = due.front().filter(|(at, _)| *at <= Instant::now()).copied() {
                                due.pop_front();
                                if ws.send(Message::text(event_frame("s", seq, 0))).await.is_err() {
                                    return;
                                }
                            }
                        }
                        _ = tokio::time::sleep_until(opened + cut_at) => {
                            let _ = ws.close(None).await;
                            return;
                        }
                        message = ws.next() => if !matches!(message, Some(Ok(_))) { return },
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_connection_replaced_before_its_age_hands_on_every_sequence_once() {
    // Cut at 1.5 s, replaced from 0.54 s: room for a loaded machine.
    let (addr, accepted) = live_upstream_cutting_at(Duration::from_millis(1_500)).await;
    let (upstream, _telemetry) = upstream(WebSocketUpstreamConfig {
        max_connection_age: Duration::from_millis(600),
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/"))
    });
    let mut sub = subscribe(&upstream, "s", 0).await.expect("subscribed");
    let mut seqs = Vec::new();
    let until = Instant::now() + Duration::from_millis(3_000);
    while Instant::now() < until {
        let event = next(&mut sub)
            .await
            .expect("never cut: replaced before the server's age");
        seqs.push(event.seq);
    }
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 4,
        "replaced at least three times (the server alone would have cut once)"
    );
    let broken: Vec<_> = seqs.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    assert!(
        broken.is_empty(),
        "every sequence once, in order: {broken:?}"
    );
    assert!(seqs.len() > 500, "{} frames", seqs.len());
}
