//! The broker worker against the real `redis-server`, driven like the API would
//! drive it: raw Redis commands and the key schema of docs/redis.md only. Each
//! test uses its own database index, because `pool:claims` is one shared list.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use leasehold_broker::credentials::AesGcmCipher;
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerExit};
use leasehold_pool::keys;
use leasehold_telemetry::{RecordingSink, RequestResult, TelemetryEvent};
use leasehold_testkit::{redis_url, unique_name};
use redis::AsyncCommands;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const CANARY: &str = "CANARY-b7e4-do-not-print";

struct Env {
    url: String,
    redis: redis::aio::MultiplexedConnection,
    key: String,
    cipher: AesGcmCipher,
}

async fn env(db: u8) -> Option<Env> {
    let base = redis_url()?;
    let url = format!("{}/{db}", base.trim_end_matches('/'));
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut redis).await.unwrap();
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    Some(Env {
        url,
        redis,
        key,
        cipher,
    })
}

struct Running {
    worker_id: String,
    telemetry: RecordingSink,
    broker: PaperBroker,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<WorkerExit, String>>,
}

impl Env {
    fn blob(&self, user: &str, api_key: &str) -> String {
        let plaintext = format!(r#"{{"api_key": "{api_key}", "account_id": "A1"}}"#);
        self.cipher.encrypt(user, plaintext.as_bytes()).unwrap()
    }

    /// Stores credentials for `user` (API key `api_key`), the cold-start way.
    async fn put_credentials(&mut self, user: &str, api_key: &str) {
        let blob = self.blob(user, api_key);
        let _: () = self.redis.set(keys::credentials(user), blob).await.unwrap();
    }

    async fn start(&self, user_id: Option<&str>) -> Running {
        let worker_id = unique_name("w");
        let telemetry = RecordingSink::new();
        // The ledger is the Redis the worker uses: it outlives the worker.
        let ledger = leasehold_pool::bus::redis::RedisPoolBus::connect(&self.url)
            .await
            .unwrap();
        let broker = PaperBroker::new(PaperConfig::default(), Arc::new(ledger));
        let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
            "paper".to_owned(),
            Arc::new(broker.clone()) as Arc<dyn Broker>,
        )]);
        let config = BrokerWorkerConfig::for_tests(&worker_id, user_id, Duration::from_millis(200));
        let cipher = Arc::new(AesGcmCipher::from_base64_key(&self.key).unwrap());
        let bus = Arc::new(
            leasehold_pool::bus::redis::RedisPoolBus::connect(&self.url)
                .await
                .unwrap(),
        );
        let worker = BrokerWorker::new(config, bus, cipher, brokers, Arc::new(telemetry.clone()));
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let handle =
            tokio::spawn(async move { worker.run(token).await.map_err(|err| err.to_string()) });
        Running {
            worker_id,
            telemetry,
            broker,
            shutdown,
            handle,
        }
    }

    async fn wait_key(&mut self, key: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let value: Option<String> = self.redis.get(key).await.unwrap();
            if let Some(value) = value {
                return value;
            }
            assert!(Instant::now() < deadline, "{key} never appeared");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_gone(&mut self, key: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let exists: bool = self.redis.exists(key).await.unwrap();
            if !exists {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{key} still exists after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Pushes a claim for `user`; returns its claim id.
    async fn claim(&mut self, user: &str) -> String {
        let claim_id = unique_name("c");
        let claim = serde_json::json!({
            "user_id": user,
            "encrypted_credentials": self.blob(user, CANARY),
            "claim_id": claim_id,
            "enqueued_at": leasehold_control::clock::unix_ms(std::time::SystemTime::now()),
        });
        let _: () = self
            .redis
            .lpush(keys::POOL_CLAIMS, claim.to_string())
            .await
            .unwrap();
        claim_id
    }

    async fn request(&mut self, user: &str, request_id: &str) -> Value {
        let _: () = self
            .redis
            .lpush(keys::user_requests(user), request_json(request_id, "2330"))
            .await
            .unwrap();
        serde_json::from_str(&self.wait_key(&keys::response(user, request_id)).await).unwrap()
    }

    /// The paper broker's ledger for an account: client order id → order.
    async fn ledger(&mut self, account_id: &str) -> HashMap<String, Value> {
        let orders: HashMap<String, String> = self
            .redis
            .hgetall(keys::paper_orders(account_id))
            .await
            .unwrap();
        orders
            .into_iter()
            .map(|(id, order)| (id, serde_json::from_str(&order).unwrap()))
            .collect()
    }

    /// A request's record `trading:request:{user_id}:{request_id}`.
    async fn record(&mut self, user: &str, request_id: &str) -> HashMap<String, String> {
        self.redis
            .hgetall(keys::request_record(user, request_id))
            .await
            .unwrap()
    }

    async fn wait_response(&mut self, user: &str, request_id: &str) -> Value {
        serde_json::from_str(&self.wait_key(&keys::response(user, request_id)).await).unwrap()
    }

    async fn dead(&mut self, list: &str) -> Vec<Value> {
        let entries: Vec<String> = self
            .redis
            .lrange(keys::dead_letter(list), 0, -1)
            .await
            .unwrap();
        entries
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
}

fn request_json(request_id: &str, symbol: &str) -> String {
    serde_json::json!({
        "request_id": request_id, "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": symbol, "side": "buy", "quantity": 1, "price": 600.5}
    })
    .to_string()
}

async fn stop(running: Running) -> WorkerExit {
    running.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), running.handle)
        .await
        .expect("worker stops promptly")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn claim_makes_a_pool_worker_the_users_worker_and_serves_requests() {
    let Some(mut env) = env(1).await else { return };
    let worker = env.start(None).await;
    let pool_mark = keys::pool_worker_active(&worker.worker_id);
    let idle: Value = serde_json::from_str(&env.wait_key(&pool_mark).await).unwrap();
    assert_eq!(idle["user_id"], "-1");
    let user = unique_name("u");
    let claim_id = env.claim(&user).await;
    let mark: Value =
        serde_json::from_str(&env.wait_key(&keys::worker_active(&user)).await).unwrap();
    assert_eq!(mark["worker_id"], worker.worker_id.as_str());
    // The outcome is written in the claim step itself, for the API to poll.
    let outcome: Value =
        serde_json::from_str(&env.wait_key(&keys::claim_outcome(&claim_id)).await).unwrap();
    assert_eq!(
        outcome,
        serde_json::json!({"status": "claimed", "worker_id": worker.worker_id})
    );
    let ttl: i64 = env.redis.ttl(keys::claim_outcome(&claim_id)).await.unwrap();
    assert!((1..=60).contains(&ttl), "outcome TTL {ttl}");
    let held: i64 = env
        .redis
        .llen(keys::claims_processing(&worker.worker_id))
        .await
        .unwrap();
    assert_eq!(held, 0, "the claim left the worker's processing list");
    env.wait_gone(&pool_mark, Duration::from_secs(2)).await;
    let metadata: HashMap<String, String> = env
        .redis
        .hgetall(keys::worker_metadata(&user))
        .await
        .unwrap();
    assert_eq!(metadata["task_arn"], format!("task-{}", worker.worker_id));
    assert!(metadata.contains_key("instance_id") && metadata.contains_key("launched_at"));

    let response = env.request(&user, "r1").await;
    assert_eq!(response["request_id"], "r1");
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(response["result"]["status"], "filled");
    assert_eq!(response["result"]["fill_price"], 600.5);
    let ttl: i64 = env.redis.ttl(keys::response(&user, "r1")).await.unwrap();
    assert!((1..=60).contains(&ttl), "response TTL {ttl}");

    // A repeated request id is answered again with its stored response and
    // never executed twice, even when the repeat asks for something else.
    let first: String = env.redis.get(keys::response(&user, "r1")).await.unwrap();
    let _: () = env.redis.del(keys::response(&user, "r1")).await.unwrap();
    let _: () = env
        .redis
        .lpush(keys::user_requests(&user), request_json("r1", "0050"))
        .await
        .unwrap();
    let second = env.request(&user, "r2").await;
    assert_eq!(second["status"], "ok");
    let again: Option<String> = env.redis.get(keys::response(&user, "r1")).await.unwrap();
    assert_eq!(again, Some(first), "the stored response is written again");
    let ledger = env.ledger("A1").await;
    assert_eq!(ledger.len(), 2, "r1 and r2, each once: {ledger:?}");
    assert_eq!(ledger["r1"]["symbol"], "2330");
    let events = worker.telemetry.snapshot();
    assert!(events.iter().any(|e| matches!(e, TelemetryEvent::BrokerRequest { result: RequestResult::Duplicate, request_id: Some(id), .. } if id == "r1")));
    assert!(events.iter().any(|e| matches!(
        e,
        TelemetryEvent::PoolClaim {
            result: leasehold_telemetry::ClaimResult::Claimed,
            ..
        }
    )));
    assert_eq!(
        worker.broker.faults().connects.load(Ordering::SeqCst),
        1,
        "connection reused"
    );

    assert_eq!(stop(worker).await, WorkerExit::Signal);
    env.wait_gone(&keys::worker_active(&user), Duration::from_secs(1))
        .await;
    env.wait_gone(&keys::worker_metadata(&user), Duration::from_secs(1))
        .await;
}

#[tokio::test]
async fn invalid_messages_are_dead_lettered_answered_and_never_fatal() {
    let Some(mut env) = env(2).await else { return };
    let worker = env.start(None).await;
    env.wait_key(&keys::pool_worker_active(&worker.worker_id))
        .await;
    let user = unique_name("u");
    let other_users_blob = env.blob("someone-else", CANARY);
    let wrong_key_blob = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key())
        .unwrap()
        .encrypt(&user, format!(r#"{{"api_key": "{CANARY}"}}"#).as_bytes())
        .unwrap();
    for bad in [
        "{not json".to_owned(),
        serde_json::json!({"user_id": user, "claim_id": "c1", "enqueued_at": 1}).to_string(),
        serde_json::json!({"user_id": user, "encrypted_credentials": other_users_blob, "claim_id": "c2", "enqueued_at": 1}).to_string(),
        serde_json::json!({"user_id": user, "encrypted_credentials": wrong_key_blob, "claim_id": "c3", "enqueued_at": 1}).to_string(),
        serde_json::json!({"user_id": user, "encrypted_credentials": "%%%", "claim_id": "c4", "enqueued_at": 1}).to_string(),
    ] {
        let _: () = env.redis.lpush(keys::POOL_CLAIMS, bad).await.unwrap();
    }
    // The same worker still takes a valid claim afterwards.
    env.claim(&user).await;
    env.wait_key(&keys::worker_active(&user)).await;
    let dead = env.dead(keys::POOL_CLAIMS).await;
    let reasons: Vec<&str> = dead.iter().map(|d| d["reason"].as_str().unwrap()).collect();
    assert_eq!(dead.len(), 5, "{reasons:?}");
    assert!(reasons[0].contains("not valid JSON"), "{reasons:?}");
    assert!(reasons[1].contains("encrypted_credentials"), "{reasons:?}");
    assert!(reasons[2].contains("do not decrypt") && reasons[3].contains("do not decrypt"));
    assert!(reasons[4].contains("base64"));
    assert!(
        dead.iter()
            .all(|d| d["message"].is_string() && d["at"].as_u64().unwrap() > 0)
    );
    // Each failed claim with a readable id has its outcome, with the reason.
    for (claim_id, reason) in ["c1", "c2", "c3", "c4"].iter().zip(&reasons[1..]) {
        let outcome: String = env.redis.get(keys::claim_outcome(claim_id)).await.unwrap();
        let outcome: Value = serde_json::from_str(&outcome).unwrap();
        assert_eq!(outcome["status"], "failed", "{outcome}");
        assert_eq!(outcome["error"], *reason, "{outcome}");
        assert!(!outcome.to_string().contains(CANARY));
    }

    let requests = keys::user_requests(&user);
    let bad_requests = [
        ("{nope".to_owned(), None),
        (
            r#"{"request_id": "bad1", "action": "place_order"}"#.to_owned(),
            Some("bad1"),
        ),
        (
            request_json("bad2", "2330").replace("place_order", "teleport"),
            Some("bad2"),
        ),
        (
            request_json("bad3", "2330").replace(r#""side":"buy""#, r#""side":"sideways""#),
            Some("bad3"),
        ),
    ];
    for (body, _) in &bad_requests {
        let _: () = env.redis.lpush(&requests, body).await.unwrap();
    }
    for (_, id) in &bad_requests {
        if let Some(id) = id {
            let response: Value =
                serde_json::from_str(&env.wait_key(&keys::response(&user, id)).await).unwrap();
            assert_eq!(response["status"], "error");
            assert!(
                response["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("invalid request"),
                "{response}"
            );
        }
    }
    let control = keys::worker_control(&user);
    let _: () = env
        .redis
        .lpush(&control, r#"{"type": "reboot"}"#)
        .await
        .unwrap();
    let _: () = env.redis.lpush(&control, "][").await.unwrap();
    // Still serving.
    assert_eq!(env.request(&user, "good").await["status"], "ok");
    assert_eq!(env.dead(&requests).await.len(), 4);
    let dead_control = env.dead(&control).await;
    assert_eq!(dead_control.len(), 2);

    // The canary secret appears nowhere: dead letters, telemetry, responses.
    let mut everything = String::new();
    for list in [
        keys::POOL_CLAIMS.to_owned(),
        requests.clone(),
        control.clone(),
    ] {
        let raw: Vec<String> = env
            .redis
            .lrange(keys::dead_letter(&list), 0, -1)
            .await
            .unwrap();
        everything.push_str(&raw.join("\n"));
    }
    everything.push_str(&format!("{:?}", worker.telemetry.snapshot()));
    assert!(!everything.contains(CANARY), "canary leaked");
    let invalid = worker
        .telemetry
        .snapshot()
        .iter()
        .filter(|e| {
            matches!(
                e,
                TelemetryEvent::PoolClaim {
                    result: leasehold_telemetry::ClaimResult::Invalid,
                    ..
                } | TelemetryEvent::BrokerRequest {
                    result: RequestResult::Invalid,
                    ..
                }
            )
        })
        .count();
    assert_eq!(invalid, 9);
    stop(worker).await;
}

#[tokio::test]
async fn reload_credentials_reconnects_and_shutdown_exits() {
    let Some(mut env) = env(3).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "key-one").await;
    let worker = env.start(Some(&user)).await;
    env.wait_key(&keys::worker_active(&user)).await;
    assert_eq!(
        env.request(&user, &unique_name("r")).await["result"]["connection"],
        1
    );
    assert_eq!(
        env.request(&user, &unique_name("r")).await["result"]["connection"],
        1
    );
    env.put_credentials(&user, "key-two").await;
    let _: () = env
        .redis
        .lpush(
            keys::worker_control(&user),
            r#"{"type": "reload_credentials"}"#,
        )
        .await
        .unwrap();
    assert_eq!(
        env.request(&user, &unique_name("r")).await["result"]["connection"],
        2,
        "reconnected after reload"
    );
    assert!(worker.telemetry.snapshot().iter().any(|e| matches!(e, TelemetryEvent::BrokerReconnect { reason, .. } if reason == "reload_credentials")));

    let _: () = env
        .redis
        .lpush(keys::worker_control(&user), r#"{"type": "shutdown"}"#)
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), worker.handle)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit, Ok(WorkerExit::ControlShutdown));
    env.wait_gone(&keys::worker_active(&user), Duration::from_secs(1))
        .await;
}

#[tokio::test]
async fn heartbeat_keeps_the_mark_and_a_dead_worker_expires_with_the_ttl() {
    let Some(mut env) = env(4).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "k").await;
    let worker = env.start(Some(&user)).await;
    env.wait_key(&keys::worker_active(&user)).await;
    // Three TTLs later the mark is still there, always with a TTL of at most 2 s.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(keys::worker_active(&user))
            .query_async(&mut env.redis)
            .await
            .unwrap();
        assert!((1..=2000).contains(&ttl), "mark TTL {ttl} ms");
        let meta_ttl: i64 = redis::cmd("PTTL")
            .arg(keys::worker_metadata(&user))
            .query_async(&mut env.redis)
            .await
            .unwrap();
        assert!((1..=2000).contains(&meta_ttl), "metadata TTL {meta_ttl} ms");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A worker that dies without cleaning up loses its mark after the TTL.
    worker.handle.abort();
    let died = Instant::now();
    env.wait_gone(&keys::worker_active(&user), Duration::from_secs(4))
        .await;
    assert!(
        died.elapsed() >= Duration::from_millis(500),
        "the mark outlives the worker by its TTL"
    );
}

#[tokio::test]
async fn a_user_with_a_worker_is_never_claimed_twice_and_a_displaced_worker_stops() {
    let Some(mut env) = env(5).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "k").await;
    let first = env.start(Some(&user)).await;
    let mark = env.wait_key(&keys::worker_active(&user)).await;
    let pool = env.start(None).await;
    env.wait_key(&keys::pool_worker_active(&pool.worker_id))
        .await;
    // Refused in the claim step: the outcome says so, with the reason.
    let claim_id = env.claim(&user).await;
    let outcome: Value =
        serde_json::from_str(&env.wait_key(&keys::claim_outcome(&claim_id)).await).unwrap();
    assert_eq!(outcome["status"], "failed", "{outcome}");
    assert_eq!(outcome["worker_id"], pool.worker_id.as_str(), "{outcome}");
    assert!(
        outcome["error"]
            .as_str()
            .unwrap()
            .contains("already has an active worker"),
        "{outcome}"
    );
    let held: i64 = env
        .redis
        .llen(keys::claims_processing(&pool.worker_id))
        .await
        .unwrap();
    assert_eq!(held, 0, "the refused claim left the worker's list");
    assert!(
        env.wait_key(&keys::worker_active(&user))
            .await
            .contains(&first.worker_id)
    );
    assert!(mark.contains(&first.worker_id));
    env.wait_key(&keys::pool_worker_active(&pool.worker_id))
        .await;

    // Forced onto one user (e.g. after a partition): the displaced worker stops by itself.
    let intruder = serde_json::json!({"worker_id": "intruder", "task_id": "t", "user_id": user, "heartbeat_at": 1, "started_at": 1});
    let _: () = env
        .redis
        .set_ex(keys::worker_active(&user), intruder.to_string(), 30)
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), first.handle)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit, Ok(WorkerExit::Lost));
    let still: String = env.redis.get(keys::worker_active(&user)).await.unwrap();
    assert!(
        still.contains("intruder"),
        "the displaced worker must not delete the new holder's mark"
    );
    stop(pool).await;
}

#[tokio::test]
async fn sigterm_interrupts_the_blocking_pop_and_deletes_the_pool_mark() {
    let Some(mut env) = env(6).await else { return };
    let worker = env.start(None).await;
    let mark = keys::pool_worker_active(&worker.worker_id);
    env.wait_key(&mark).await;
    let started = Instant::now();
    assert_eq!(stop(worker).await, WorkerExit::Signal);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the blocking wait (30 s) was not interrupted"
    );
    env.wait_gone(&mark, Duration::from_millis(100)).await;
    // A claim pushed afterwards is still there for the next pool worker.
    env.claim("later").await;
    let queued: i64 = env.redis.llen(keys::POOL_CLAIMS).await.unwrap();
    assert_eq!(queued, 1);
}

fn requests_of(events: &[TelemetryEvent], id: &str) -> Vec<RequestResult> {
    events
        .iter()
        .filter_map(|e| match e {
            TelemetryEvent::BrokerRequest {
                request_id: Some(request_id),
                result,
                ..
            } if request_id == id => Some(*result),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_worker_that_dies_mid_order_is_settled_by_its_successor_from_the_ledger() {
    let Some(mut env) = env(10).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "k").await;
    let first = env.start(Some(&user)).await;
    env.wait_key(&keys::worker_active(&user)).await;
    // The order reaches the broker, and the answer never comes back.
    first
        .broker
        .faults()
        .hanging_orders
        .store(1, Ordering::SeqCst);
    let body = request_json("r1", "2330");
    let _: () = env
        .redis
        .lpush(keys::user_requests(&user), &body)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env.ledger("A1").await.contains_key("r1") {
        assert!(
            Instant::now() < deadline,
            "the order never reached the ledger"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The worker dies between the broker call and the response.
    first.handle.abort();
    assert_eq!(env.record(&user, "r1").await["state"], "executing");
    let processing: Vec<String> = env
        .redis
        .lrange(keys::user_processing(&user), 0, -1)
        .await
        .unwrap();
    assert_eq!(processing, [body], "the request waits for a successor");
    let answered: bool = env.redis.exists(keys::response(&user, "r1")).await.unwrap();
    assert!(!answered);
    env.wait_gone(&keys::worker_active(&user), Duration::from_secs(5))
        .await;

    let successor = env.start(Some(&user)).await;
    let response = env.wait_response(&user, "r1").await;
    assert_eq!(response["status"], "ok", "{response}");
    assert_eq!(response["result"]["broker_order_id"], 1, "{response}");
    assert_eq!(response["result"]["client_order_id"], "r1");
    let ledger = env.ledger("A1").await;
    assert_eq!(ledger.len(), 1, "executed once: {ledger:?}");
    let record = env.record(&user, "r1").await;
    assert_eq!(record["state"], "done");
    assert_eq!(
        serde_json::from_str::<Value>(&record["response"]).unwrap(),
        response
    );
    let processing: i64 = env.redis.llen(keys::user_processing(&user)).await.unwrap();
    assert_eq!(processing, 0);
    // The successor goes on with the queue.
    assert_eq!(
        env.request(&user, "r2").await["result"]["broker_order_id"],
        2
    );
    assert_eq!(
        requests_of(&successor.telemetry.snapshot(), "r1"),
        [RequestResult::Ok],
        "answered exactly once"
    );
    assert!(requests_of(&first.telemetry.snapshot(), "r1").is_empty());
    stop(successor).await;
}

#[tokio::test]
async fn a_backlog_of_fifty_executes_in_push_order() {
    let Some(mut env) = env(11).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "k").await;
    let ids: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
    for id in &ids {
        let _: () = env
            .redis
            .lpush(keys::user_requests(&user), request_json(id, "2330"))
            .await
            .unwrap();
    }
    let worker = env.start(Some(&user)).await;
    for id in &ids {
        assert_eq!(env.wait_response(&user, id).await["status"], "ok");
    }
    let ledger = env.ledger("A1").await;
    assert_eq!(ledger.len(), 50);
    for (position, id) in ids.iter().enumerate() {
        assert_eq!(
            ledger[id]["broker_order_id"],
            position as u64 + 1,
            "{id} ran out of push order"
        );
    }
    stop(worker).await;
}

#[tokio::test]
async fn expired_repeated_reused_and_unreadable_requests_each_get_their_one_answer() {
    let Some(mut env) = env(13).await else { return };
    let user = unique_name("u");
    env.put_credentials(&user, "k").await;
    let worker = env.start(Some(&user)).await;
    env.wait_key(&keys::worker_active(&user)).await;
    let requests = keys::user_requests(&user);

    // Expired: not executed, answered `expired`.
    let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
    let mut expired: Value = serde_json::from_str(&request_json("x1", "2330")).unwrap();
    expired["expires_at"] = serde_json::json!(now - 1_000);
    let _: () = env
        .redis
        .lpush(&requests, expired.to_string())
        .await
        .unwrap();
    let response = env.wait_response(&user, "x1").await;
    assert_eq!(response["status"], "error");
    assert_eq!(response["error_code"], "expired", "{response}");
    assert!(
        !env.ledger("A1").await.contains_key("x1"),
        "an expired request ran"
    );

    // A later deadline is honoured as a deadline, not an error.
    let mut timely: Value = serde_json::from_str(&request_json("x2", "2330")).unwrap();
    timely["expires_at"] = serde_json::json!(now + 60_000);
    let _: () = env
        .redis
        .lpush(&requests, timely.to_string())
        .await
        .unwrap();
    let original = env.wait_response(&user, "x2").await;
    assert_eq!(original["status"], "ok");

    // A duplicate id: the stored response again, no second execution.
    let _: () = env.redis.del(keys::response(&user, "x2")).await.unwrap();
    let _: () = env
        .redis
        .lpush(&requests, request_json("x2", "0050"))
        .await
        .unwrap();
    assert_eq!(env.wait_response(&user, "x2").await, original);

    // An invalid message reusing the id: dead-lettered, the real answer kept.
    let _: () = env
        .redis
        .lpush(&requests, r#"{"request_id": "x2", "action": "teleport"}"#)
        .await
        .unwrap();
    // Not UTF-8: dead-lettered with its exact bytes.
    let _: () = env
        .redis
        .lpush(&requests, b"\xff\xfe{\"request_id\"".as_slice())
        .await
        .unwrap();
    assert_eq!(
        env.request(&user, "x3").await["status"],
        "ok",
        "still serving"
    );
    let kept: String = env.redis.get(keys::response(&user, "x2")).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&kept).unwrap(), original);
    assert_eq!(
        serde_json::from_str::<Value>(&env.record(&user, "x2").await["response"]).unwrap(),
        original
    );
    let ledger = env.ledger("A1").await;
    assert_eq!(ledger.len(), 2, "x2 and x3 once each: {ledger:?}");
    assert_eq!(ledger["x2"]["symbol"], "2330");
    let dead = env.dead(&requests).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead[0]["reason"]
            .as_str()
            .unwrap()
            .contains("unknown action")
    );
    assert_eq!(dead[1]["reason"], "invalid request: not UTF-8");
    assert_eq!(dead[1]["message_base64"], "//57InJlcXVlc3RfaWQi");
    let processing: i64 = env.redis.llen(keys::user_processing(&user)).await.unwrap();
    assert_eq!(processing, 0);
    let events = worker.telemetry.snapshot();
    assert_eq!(requests_of(&events, "x1"), [RequestResult::Expired]);
    assert_eq!(
        requests_of(&events, "x2"),
        [
            RequestResult::Ok,
            RequestResult::Duplicate,
            RequestResult::Invalid
        ]
    );
    stop(worker).await;
}

#[tokio::test]
async fn a_claim_taken_by_a_worker_that_died_before_marking_is_requeued_and_served() {
    let Some(mut env) = env(14).await else { return };
    let user = unique_name("u");
    // The victim is a real pool worker, dropped mid-run (its heartbeat stops
    // with it); the claim is then moved into its list as its last act.
    let victim = env.start(None).await;
    env.wait_key(&keys::pool_worker_active(&victim.worker_id))
        .await;
    victim.handle.abort();
    let _ = victim.handle.await;
    let claim_id = env.claim(&user).await;
    let moved: Option<String> = redis::cmd("LMOVE")
        .arg(keys::POOL_CLAIMS)
        .arg(keys::claims_processing(&victim.worker_id))
        .arg("RIGHT")
        .arg("LEFT")
        .query_async(&mut env.redis)
        .await
        .unwrap();
    if moved.is_none() {
        // The victim's blocking move, sent before the abort, is still parked
        // in Redis and may take the claim first, into the same list: the
        // state this test builds either way.
        let held: i64 = env
            .redis
            .llen(keys::claims_processing(&victim.worker_id))
            .await
            .unwrap();
        assert_eq!(held, 1, "the claim is in the dead worker's list");
    }
    // Its mark expires (here: at once).
    let _: () = env
        .redis
        .del(keys::pool_worker_active(&victim.worker_id))
        .await
        .unwrap();
    let successor = env.start(None).await;
    let outcome: Value =
        serde_json::from_str(&env.wait_key(&keys::claim_outcome(&claim_id)).await).unwrap();
    assert_eq!(
        outcome,
        serde_json::json!({"status": "claimed", "worker_id": successor.worker_id}),
        "the successor served the re-queued claim"
    );
    let held: i64 = env
        .redis
        .llen(keys::claims_processing(&victim.worker_id))
        .await
        .unwrap();
    assert_eq!(held, 0);
    assert_eq!(env.request(&user, "after-requeue").await["status"], "ok");
    stop(successor).await;
}
