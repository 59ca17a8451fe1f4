//! The outbox's rules without a socket, and shared connections against a
//! scripted exchange that takes a list of streams per message.

use super::*;

fn at(start: Instant, ms: u64) -> Instant {
    start + Duration::from_millis(ms)
}

#[test]
fn subscribes_go_in_batches_and_never_faster_than_the_limit() {
    let start = Instant::now();
    let mut outbox = Outbox::new(3, 2);
    for stream in ["a", "b", "c", "d", "e", "f", "g"] {
        outbox.subscribe(stream.into());
    }
    let batch = |routes: &[&str]| -> Vec<String> { routes.iter().map(|r| (*r).into()).collect() };
    assert_eq!(
        outbox.poll(start),
        Some((Op::Subscribe, batch(&["a", "b", "c"])))
    );
    assert_eq!(
        outbox.poll(at(start, 10)),
        Some((Op::Subscribe, batch(&["d", "e", "f"])))
    );
    // Two messages in this second already: the third waits for the window.
    assert_eq!(outbox.poll(at(start, 20)), None);
    assert_eq!(outbox.due(at(start, 20)), Some(at(start, 1_000)));
    assert_eq!(
        outbox.poll(at(start, 1_000)),
        Some((Op::Subscribe, batch(&["g"])))
    );
    assert_eq!(outbox.poll(at(start, 2_000)), None);
    assert!(outbox.is_empty());
}

#[test]
fn an_unsubscribe_withdraws_a_subscribe_never_sent_and_keeps_the_order_otherwise() {
    let start = Instant::now();
    let mut outbox = Outbox::new(10, 0);
    outbox.subscribe("a".into());
    outbox.subscribe("b".into());
    outbox.unsubscribe("a".into());
    assert_eq!(outbox.poll(start), Some((Op::Subscribe, vec!["b".into()])));
    // A resubscribe of a stream the exchange knows: both go, in order, each
    // its own message (kinds are never mixed in one).
    outbox.unsubscribe("b".into());
    outbox.subscribe("b".into());
    assert_eq!(
        outbox.poll(start),
        Some((Op::Unsubscribe, vec!["b".into()]))
    );
    assert_eq!(outbox.poll(start), Some((Op::Subscribe, vec!["b".into()])));
    assert_eq!(outbox.poll(start), None);
}

/// A combined-stream exchange in Binance's shape: `SUBSCRIBE` and
/// `UNSUBSCRIBE` with a list of names, answered `{"result":null,"id":N}`;
/// a request naming a stream that starts with `refused` is refused with
/// `{"error":…,"id":N}`, which names no stream;
/// every 5 ms each subscribed name gets `{"stream":name,"data":{"u":n}}`,
/// and one frame for a name nobody subscribed. Returns its address and
/// every client message it read, by connection.
async fn combined_exchange() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<Vec<Value>>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let index = {
                let mut seen = record.lock().unwrap();
                seen.push(Vec::new());
                seen.len() - 1
            };
            let record = record.clone();
            tokio::spawn(async move {
                let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
                let mut names: Vec<String> = Vec::new();
                let mut n = 0u64;
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                loop {
                    tokio::select! {
                        message = ws.next() => {
                            let Some(Ok(Message::Text(text))) = message else { return };
                            let request: Value = serde_json::from_str(&text).unwrap();
                            record.lock().unwrap()[index].push(request.clone());
                            let params: Vec<String> =
                                serde_json::from_value(request["params"].clone()).unwrap();
                            // Binance refuses a whole request and names only its id.
                            let refused = params.iter().any(|name| name.starts_with("refused"));
                            match request["method"].as_str() {
                                _ if refused => {}
                                Some("SUBSCRIBE") => names.extend(params),
                                _ => names.retain(|name| !params.contains(name)),
                            }
                            let ack = if refused {
                                serde_json::json!({"error": {"code": 2, "msg": "Invalid request"}, "id": request["id"]})
                            } else {
                                serde_json::json!({"result": null, "id": request["id"]})
                            };
                            let _ = ws.send(Message::text(ack.to_string())).await;
                        }
                        _ = tick.tick() => {
                            n += 1;
                            for name in names.iter().map(String::as_str).chain(["nobody@depth"]) {
                                let frame = serde_json::json!({"stream": name, "data": {"u": n}});
                                if ws.send(Message::text(frame.to_string())).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn shared_config(addr: std::net::SocketAddr, per_connection: usize) -> WebSocketUpstreamConfig {
    WebSocketUpstreamConfig {
        subscribe_template:
            r#"{"method":"SUBSCRIBE","params":{stream_ids_json},"id":{request_id}}"#.into(),
        unsubscribe_template:
            r#"{"method":"UNSUBSCRIBE","params":{stream_ids_json},"id":{request_id}}"#.into(),
        seq_pointer: "/data/u".into(),
        id_pointer: "/data/u".into(),
        streams_per_connection: per_connection,
        route_pointer: Some("/stream".into()),
        route_template: "{stream_id}@depth".into(),
        subscribe_batch: 10,
        subscribes_per_second: 5,
        ..WebSocketUpstreamConfig::for_feed(&format!("ws://{addr}/stream"))
    }
}

async fn first_event(sub: &mut Box<dyn Subscription>) -> UpstreamEvent {
    timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("an event in time")
        .expect("an event")
}

#[tokio::test]
async fn streams_fill_a_connection_before_another_opens_and_get_only_their_frames() {
    let (addr, seen) = combined_exchange().await;
    let telemetry = leasehold_telemetry::RecordingSink::new();
    let upstream = SharedUpstream::new(shared_config(addr, 2), Arc::new(telemetry.clone()));
    let mut subs = Vec::new();
    for stream in ["a", "b", "c", "d", "e"] {
        subs.push(upstream.subscribe(stream, 0).await.expect("subscribed"));
    }
    assert_eq!(upstream.connections().await, 3, "⌈5 / 2⌉ connections");
    for sub in &mut subs {
        let event = first_event(sub).await;
        assert!(event.seq > 0);
    }
    // Each stream's frames are its own: the payload names its route.
    for (sub, stream) in subs.iter_mut().zip(["a", "b", "c", "d", "e"]) {
        let event = first_event(sub).await;
        assert!(
            event
                .payload
                .to_text()
                .contains(&format!("\"{stream}@depth\"")),
            "{stream}: {}",
            event.payload.to_text()
        );
    }
    // Streams on one connection were subscribed in one message.
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[0][0]["params"],
        serde_json::json!(["a@depth", "b@depth"])
    );
    // Frames for a name nobody holds are counted and dropped; the gauge and
    // each stream's subscribe time are reported.
    let events = telemetry.take();
    let last_count = events.iter().rev().find_map(|e| match e {
        TelemetryEvent::UpstreamConnections {
            connections,
            streams,
            open,
        } => Some((
            *connections,
            *streams,
            open.iter().map(|c| (c.id, c.streams)).collect::<Vec<_>>(),
        )),
        _ => None,
    });
    assert_eq!(
        last_count,
        Some((3, 5, vec![(1, 2), (2, 2), (3, 1)])),
        "each connection listed with the streams on it"
    );
    let carriers: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::UpstreamSubscribed { connection, .. } => *connection,
            _ => None,
        })
        .collect();
    assert_eq!(carriers.len(), 5, "one per stream, at its first frame");
    assert_eq!(
        carriers.iter().filter(|&&c| c == 3).count(),
        1,
        "each names the connection carrying it"
    );
    assert!(events.iter().any(|e| matches!(
        e,
        TelemetryEvent::UpstreamFrameSkipped {
            reason: SkipReason::Control,
            ..
        }
    )));
    // A stream given up is unsubscribed; the others on its connection go on.
    let mut a = subs.remove(0);
    a.close().await;
    drop(a);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let requests = seen.lock().unwrap().clone();
    assert!(
        requests[0]
            .iter()
            .any(|r| r["method"] == "UNSUBSCRIBE" && r["params"] == serde_json::json!(["a@depth"])),
        "{requests:?}"
    );
    let before = first_event(&mut subs[0]).await.seq;
    let after = first_event(&mut subs[0]).await.seq;
    assert!(after > before, "b goes on after a left");
    // The freed place is taken before a new connection opens.
    let _f = upstream.subscribe("f", 0).await.expect("subscribed");
    assert_eq!(upstream.connections().await, 3);
}

#[tokio::test]
async fn a_refused_subscribe_ends_the_streams_its_request_named_and_no_other() {
    let (addr, seen) = combined_exchange().await;
    let telemetry = leasehold_telemetry::RecordingSink::new();
    let upstream = SharedUpstream::new(shared_config(addr, 10), Arc::new(telemetry));
    let mut a = upstream.subscribe("a", 0).await.expect("subscribed");
    first_event(&mut a).await;
    // Its own request (the batch window is long past), refused by id only.
    let mut refused = upstream.subscribe("refused", 0).await.expect("asked");
    let ended = timeout(Duration::from_secs(5), refused.next())
        .await
        .expect("the refusal is matched to the request in time");
    match ended {
        Err(UpstreamError::Rejected(message)) => assert!(message.contains("Invalid request")),
        other => panic!("expected the refusal, got {other:?}"),
    }
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "one connection");
    assert_eq!(
        requests[0]
            .iter()
            .map(|r| r["id"].clone())
            .collect::<Vec<_>>()
            .len(),
        2
    );
    // The stream that was subscribed before goes on.
    let before = first_event(&mut a).await.seq;
    assert!(first_event(&mut a).await.seq > before);
}

/// A live combined-stream exchange: one update id for every name and
/// connection, a frame every 2 ms for each subscribed name, every
/// connection cut once it is `cut_at` old, and every other connection
/// 40 ms behind the others (so a successor starts ahead, then behind).
/// Returns its address and how many connections it accepted.
async fn live_combined_exchange_cutting_at(
    cut_at: Duration,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, _) = tokio::sync::broadcast::channel::<u64>(4_096);
    let ticker = heads.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        for n in 1.. {
            tick.tick().await;
            let _ = ticker.send(n);
        }
    });
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let number = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let lag = Duration::from_millis(if number % 2 == 1 { 40 } else { 0 });
            let mut heads = heads.subscribe();
            tokio::spawn(async move {
                let opened = Instant::now();
                let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
                let mut names: Vec<String> = Vec::new();
                let mut due = VecDeque::new();
                loop {
                    let next_due = due.front().map(|(at, _)| *at);
                    tokio::select! {
                        message = ws.next() => {
                            let Some(Ok(Message::Text(text))) = message else { return };
                            let request: Value = serde_json::from_str(&text).unwrap();
                            let params: Vec<String> =
                                serde_json::from_value(request["params"].clone()).unwrap();
                            match request["method"].as_str() {
                                Some("SUBSCRIBE") => names.extend(params),
                                _ => names.retain(|name| !params.contains(name)),
                            }
                            let ack = serde_json::json!({"result": null, "id": request["id"]});
                            let _ = ws.send(Message::text(ack.to_string())).await;
                        }
                        n = heads.recv() => {
                            let Ok(n) = n else { return };
                            due.push_back((Instant::now() + lag, n));
                        }
                        _ = sleep_until(next_due.unwrap_or(opened)), if next_due.is_some() => {
                            while let Some((_, n)) = due.front().filter(|(at, _)| *at <= Instant::now()).copied() {
                                due.pop_front();
                                for name in &names {
                                    let frame = serde_json::json!({"stream": name, "data": {"u": n}});
                                    if ws.send(Message::text(frame.to_string())).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        _ = sleep_until(opened + cut_at) => {
                            let _ = ws.close(None).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_shared_connection_replaced_before_its_age_hands_each_stream_every_update_once() {
    // Cut at 1.5 s, replaced from 0.54 s: room for a loaded machine.
    let (addr, accepted) = live_combined_exchange_cutting_at(Duration::from_millis(1_500)).await;
    let telemetry = leasehold_telemetry::RecordingSink::new();
    let config = WebSocketUpstreamConfig {
        max_connection_age: Duration::from_millis(600),
        ..shared_config(addr, 10)
    };
    let upstream = SharedUpstream::new(config, Arc::new(telemetry));
    let mut subs = Vec::new();
    for stream in ["a", "b", "c"] {
        subs.push(upstream.subscribe(stream, 0).await.expect("subscribed"));
    }
    let until = Instant::now() + Duration::from_millis(3_000);
    let readers = subs.into_iter().map(|mut sub| {
        tokio::spawn(async move {
            let mut seqs = Vec::new();
            while Instant::now() < until {
                let event = timeout(Duration::from_secs(5), sub.next())
                    .await
                    .expect("a frame in time")
                    .expect("never cut: replaced before the server's age");
                seqs.push(event.seq);
            }
            seqs
        })
    });
    for seqs in futures_util::future::join_all(readers).await {
        let seqs = seqs.unwrap();
        let broken: Vec<_> = seqs.windows(2).filter(|w| w[1] != w[0] + 1).collect();
        assert!(broken.is_empty(), "every update once, in order: {broken:?}");
        assert!(seqs.len() > 500, "{} frames", seqs.len());
    }
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 4,
        "replaced at least three times (the server alone would have cut once)"
    );
    assert_eq!(
        upstream.connections().await,
        1,
        "one connection, replaced in place"
    );
}
