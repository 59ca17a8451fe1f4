//! The credential sealer in one process on the in-memory bus, over real HTTP:
//! a pool worker that decrypts nothing gets its claimed user's credentials
//! sealed to its own key and serves her; nothing else anyone asks is sealed —
//! a second seal on a used grant, a reload by a key the sealer did not seal
//! to, a user without a grant, a grant bound to a claim the asker did not
//! take — and a claim pushed without a grant is dead-lettered with the
//! sealer's reason.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_broker::credentials::{AesGcmCipher, CipherError};
use leasehold_broker::launcher::{LaunchError, RunningTask, TaskLauncher};
use leasehold_broker::manager::{self, ClaimPath};
use leasehold_broker::paper::{Broker, PaperBroker, PaperConfig};
use leasehold_broker::sealer::{self, CredentialSealer, SealerClient};
use leasehold_broker::worker::{BrokerWorker, BrokerWorkerConfig, WorkerError, WorkerExit};
use leasehold_pool::bus::PoolBus;
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::keys;
use leasehold_pool::protocol::{GrantReason, MarkValue};
use leasehold_telemetry::RecordingSink;
use tokio_util::sync::CancellationToken;

const ALICE_SECRET: &str = "CANARY-alice-sealed";
const BOB_SECRET: &str = "CANARY-bob-sealed";

/// A launcher that never starts anything: every claim here goes to the pool.
struct NoLauncher;

#[async_trait::async_trait]
impl TaskLauncher for NoLauncher {
    async fn start(&self, _user_id: Option<&str>) -> Result<String, LaunchError> {
        Err(LaunchError::Start("this test starts workers itself".into()))
    }
    async fn stop(&self, _task_id: &str, _reason: &str) -> Result<(), LaunchError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
        Ok(Vec::new())
    }
}

async fn wait_for(bus: &dyn PoolBus, key: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        if let Some(value) = bus.get(key).await.unwrap() {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never appeared");
}

/// The sealer on a loopback port; its base URL.
async fn start_sealer(bus: Arc<dyn PoolBus>, key: &str, stop: CancellationToken) -> String {
    let cipher = Arc::new(AesGcmCipher::from_base64_key(key).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sealer = Arc::new(CredentialSealer::new(bus, cipher));
    tokio::spawn(sealer::serve(
        listener,
        sealer,
        sealer::CLAIM_USER_SWEEP,
        None,
        None,
        stop,
    ));
    url
}

/// A pool worker that has no key of its own: only the sealer's answers.
async fn sealed_pool_worker(
    bus: &Arc<dyn PoolBus>,
    worker_id: &str,
    sealer_url: &str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Result<WorkerExit, WorkerError>> {
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(PaperBroker::new(PaperConfig::default(), bus.clone())) as Arc<dyn Broker>,
    )]);
    // A cipher with a key no blob was made with: a worker that fell back to
    // decrypting would fail every claim.
    let unrelated = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let worker = BrokerWorker::new(
        BrokerWorkerConfig::for_tests(worker_id, None, Duration::from_millis(100)),
        bus.clone(),
        Arc::new(unrelated),
        brokers,
        Arc::new(RecordingSink::new()),
    )
    .with_sealer(SealerClient::new(sealer_url, Duration::from_secs(5)));
    let running = tokio::spawn(worker.run(stop));
    wait_for(bus.as_ref(), &keys::pool_worker_active(worker_id)).await;
    running
}

fn refusal_status(err: CipherError) -> u16 {
    match err {
        CipherError::SealerRefused { status, .. } => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_only_its_claimed_users_credentials_sealed_to_its_own_key() {
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    for (user, secret) in [("alice", ALICE_SECRET), ("bob", BOB_SECRET)] {
        let plaintext = format!(r#"{{"api_key": "{secret}", "account_id": "A1"}}"#);
        let blob = cipher.encrypt(user, plaintext.as_bytes()).unwrap();
        bus.put_credentials(user, &blob).await.unwrap();
    }
    let stop = CancellationToken::new();
    let url = start_sealer(bus.clone(), &key, stop.clone()).await;
    let w1 = sealed_pool_worker(&bus, "w1", &url, stop.clone()).await;
    let pool_mark =
        MarkValue::parse(&wait_for(bus.as_ref(), &keys::pool_worker_active("w1")).await)
            .expect("a pool mark");
    let w1_key = pool_mark
        .seal_key
        .clone()
        .expect("the pool mark publishes the seal key");

    // The claim path grants, the worker asks, the sealer seals to w1's key.
    let path = manager::claim_user(bus.as_ref(), &NoLauncher, "alice")
        .await
        .unwrap();
    assert!(matches!(path, ClaimPath::PoolClaim { .. }), "{path}");
    let mark = MarkValue::parse(&wait_for(bus.as_ref(), &keys::worker_active("alice")).await)
        .expect("alice's mark");
    assert_eq!(mark.worker_id, "w1");
    assert_eq!(mark.seal_key.as_deref(), Some(w1_key.as_str()));
    let request = serde_json::json!({
        "request_id": "r-alice", "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    });
    bus.push_request("alice", &request.to_string())
        .await
        .unwrap();
    let response = wait_for(bus.as_ref(), &keys::response("alice", "r-alice")).await;
    assert!(response.contains(r#""status":"ok""#), "{response}");

    // Someone with another key who claims to be w1 (the sidecar next to it,
    // or any process that can reach the sealer).
    let stranger = SealerClient::new(&url, Duration::from_secs(5));
    let ask = |user_id| sealer::SealAsk {
        user_id,
        worker_id: "w1",
        task_id: "task-w1",
        binding: "",
        mark_ttl: Duration::from_secs(2),
    };
    // Alice's grant was used by w1's seal: one seal per grant.
    let err = stranger.fetch(&ask("alice")).await.unwrap_err();
    assert_eq!(refusal_status(err), 409);
    // A reload grant is for the holder the sealer recorded, with its key.
    let reload = sealer::new_grant(GrantReason::Reload);
    sealer::grant_credentials(bus.as_ref(), "alice", &reload)
        .await
        .unwrap();
    assert_eq!(
        refusal_status(stranger.fetch(&ask("alice")).await.unwrap_err()),
        403
    );
    // Bob has no grant.
    let err = stranger.fetch(&ask("bob")).await.unwrap_err();
    assert!(err.to_string().contains("no credentials grant"), "{err}");
    // With a grant, bob is still no one's: w1 took no claim of his.
    let grant = sealer::new_grant(GrantReason::Claim).for_claim("c-bob");
    sealer::grant_credentials(bus.as_ref(), "bob", &grant)
        .await
        .unwrap();
    let err = stranger.fetch(&ask("bob")).await.unwrap_err();
    assert!(
        err.to_string().contains("is not the worker of user bob"),
        "{err}"
    );
    assert!(!err.to_string().contains(BOB_SECRET));
    assert!(
        bus.get(&keys::worker_active("bob"))
            .await
            .unwrap()
            .is_none()
    );

    // A claim an API pushed without a grant: the worker that takes it gets
    // nothing and dead-letters it with the sealer's reason.
    let w2 = sealed_pool_worker(&bus, "w2", &url, stop.clone()).await;
    let blob = cipher
        .encrypt("carol", br#"{"api_key": "k", "account_id": "A1"}"#)
        .unwrap();
    bus.put_credentials("carol", &blob).await.unwrap();
    let claim = serde_json::json!({
        "user_id": "carol", "encrypted_credentials": blob, "claim_id": "c-carol", "enqueued_at": 1,
    });
    bus.push_claim(&claim.to_string()).await.unwrap();
    let outcome = wait_for(bus.as_ref(), &keys::claim_outcome("c-carol")).await;
    assert!(outcome.contains(r#""status":"failed""#), "{outcome}");
    assert!(outcome.contains("no credentials grant"), "{outcome}");
    let dead = bus
        .list_items(&keys::dead_letter(keys::POOL_CLAIMS))
        .await
        .unwrap();
    assert!(
        dead.iter()
            .any(|entry| entry.contains("c-carol") && entry.contains("no credentials grant")),
        "{dead:?}"
    );
    assert!(
        bus.get(&keys::worker_active("carol"))
            .await
            .unwrap()
            .is_none()
    );

    stop.cancel();
    for worker in [w1, w2] {
        worker.await.unwrap().unwrap();
    }
}

/// A reload is sealed with a grant of its own, never with a spent one:
/// `manager::reload_credentials` grants, then sends, and the worker serves
/// with the new blob; a reload pushed without a new grant meets the spent
/// grant (409) and is dead-lettered while the worker keeps what works. With
/// no worker, nothing is granted or sent (a pending claim's grant stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_sealed_with_a_grant_of_its_own_never_with_a_spent_one() {
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = AesGcmCipher::from_base64_key(&key).unwrap();
    let put = |account: &str| {
        cipher
            .encrypt(
                "alice",
                format!(r#"{{"api_key": "{ALICE_SECRET}", "account_id": "{account}"}}"#).as_bytes(),
            )
            .unwrap()
    };
    bus.put_credentials("alice", &put("A1")).await.unwrap();
    let grant_key = keys::credentials_grant("alice");
    let (control, processing) = (
        keys::worker_control("alice"),
        keys::worker_control_processing("alice"),
    );
    let dead = keys::dead_letter(&control);

    // No worker: no grant, no message.
    assert!(
        !manager::reload_credentials(bus.as_ref(), "alice")
            .await
            .unwrap()
    );
    assert!(bus.get(&grant_key).await.unwrap().is_none());
    assert_eq!(bus.list_len(&control).await.unwrap(), 0);

    let stop = CancellationToken::new();
    let url = start_sealer(bus.clone(), &key, stop.clone()).await;
    let w1 = sealed_pool_worker(&bus, "w1", &url, stop.clone()).await;
    let path = manager::claim_user(bus.as_ref(), &NoLauncher, "alice")
        .await
        .unwrap();
    assert!(matches!(path, ClaimPath::PoolClaim { .. }), "{path}");
    wait_for(bus.as_ref(), &keys::worker_active("alice")).await;
    let handled = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while bus.list_len(&control).await.unwrap() + bus.list_len(&processing).await.unwrap() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "never handled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let order = |request_id: &str| {
        let request = serde_json::json!({
            "request_id": request_id, "action": "place_order",
            "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A2"},
            "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
        });
        let bus = bus.clone();
        async move {
            bus.push_request("alice", &request.to_string())
                .await
                .unwrap();
        }
    };

    // New credentials (account A2); the claim's grant is spent.
    bus.put_credentials("alice", &put("A2")).await.unwrap();
    assert!(
        manager::reload_credentials(bus.as_ref(), "alice")
            .await
            .unwrap()
    );
    handled().await;
    assert_eq!(bus.list_items(&dead).await.unwrap(), Vec::<String>::new());
    let grant: serde_json::Value =
        serde_json::from_str(&bus.get(&grant_key).await.unwrap().unwrap()).unwrap();
    assert_eq!(grant["reason"], "reload", "{grant}");
    assert_eq!(grant["used_by"], "w1", "{grant}");
    order("r-a2").await;
    let response = wait_for(bus.as_ref(), &keys::response("alice", "r-a2")).await;
    assert!(response.contains(r#""status":"ok""#), "{response}");

    // The same message without a new grant: the spent one is refused.
    bus.push_control("alice", manager::RELOAD_CREDENTIALS)
        .await
        .unwrap();
    handled().await;
    let refused = bus.list_items(&dead).await.unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("(409)"), "{refused:?}");
    assert!(!refused[0].contains(ALICE_SECRET));
    // Still alice's worker, with the credentials that work.
    let mark = MarkValue::parse(&wait_for(bus.as_ref(), &keys::worker_active("alice")).await)
        .expect("alice's mark");
    assert_eq!(mark.worker_id, "w1");
    order("r-a2-again").await;
    let response = wait_for(bus.as_ref(), &keys::response("alice", "r-a2-again")).await;
    assert!(response.contains(r#""status":"ok""#), "{response}");

    stop.cancel();
    w1.await.unwrap().unwrap();
}

/// Over HTTPS, a worker reaches the sealer only through a certificate its
/// `CREDENTIALS_SEALER_CA` vouches for: a client that trusts no CA (or
/// another one) gets no answer at all, and plain HTTP gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_only_a_client_that_trusts_the_sealers_ca_is_answered() {
    use leasehold_testkit::sealer_tls;
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = Arc::new(AesGcmCipher::from_base64_key(&key).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let tls = sealer::tls::server_config(sealer_tls::CERT.as_bytes(), sealer_tls::KEY.as_bytes())
        .unwrap();
    tokio::spawn(sealer::serve(
        listener,
        Arc::new(CredentialSealer::new(bus, cipher)),
        sealer::CLAIM_USER_SWEEP,
        None,
        Some(Arc::new(tls)),
        stop.clone(),
    ));
    let ask = sealer::SealAsk {
        user_id: "alice",
        worker_id: "w1",
        task_id: "",
        binding: "",
        mark_ttl: Duration::from_secs(2),
    };
    let url = format!("https://localhost:{port}");
    // Trusted: the sealer answers (here: no grant for alice).
    let trusted = SealerClient::new(&url, Duration::from_secs(5))
        .trusting(sealer_tls::CA.as_bytes())
        .unwrap();
    let err = trusted.fetch(&ask).await.unwrap_err();
    assert!(err.to_string().contains("no credentials grant"), "{err}");
    // Not trusted: the handshake fails, no answer is read.
    let untrusting = SealerClient::new(&url, Duration::from_secs(5));
    let err = untrusting.fetch(&ask).await.unwrap_err();
    assert!(matches!(err, CipherError::SealerUnavailable(_)), "{err:?}");
    assert!(!err.to_string().contains("no credentials grant"), "{err}");
    // Plain HTTP to the HTTPS port.
    let plain = SealerClient::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5));
    assert!(matches!(
        plain.fetch(&ask).await.unwrap_err(),
        CipherError::SealerUnavailable(_)
    ));
    stop.cancel();
}
