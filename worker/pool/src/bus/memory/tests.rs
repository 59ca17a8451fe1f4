use super::*;
use crate::bus::Inspect;
use crate::bus::WorkerMetadata;

fn metadata() -> WorkerMetadata {
    WorkerMetadata {
        task_arn: "task".into(),
        instance_id: "host".into(),
        launched_at: 1,
        sidecar_url: None,
    }
}

fn mark<'a>(
    user_id: &'a str,
    worker_id: &'a str,
    value: &'a str,
    metadata: &'a WorkerMetadata,
) -> MarkWrite<'a> {
    MarkWrite {
        user_id,
        worker_id,
        value,
        ttl: Duration::from_secs(30),
        metadata,
    }
}

#[test]
fn glob_matches_as_redis_does() {
    let cases: &[(&str, &str, bool)] = &[
        ("worker:active:*", "worker:active:u1", true),
        ("worker:active:*", "worker:active:-1:w1", true),
        ("worker:active:-1:*", "worker:active:u1", false),
        ("worker:active:-1:*", "worker:active:-1:w1", true),
        ("worker:active:*", "worker:metadata:u1", false),
        ("*", "", true),
        ("a?c", "abc", true),
        ("a?c", "ac", false),
        ("*b", "b", true),
        ("*b*", "ab", true),
        ("a*b*c", "axxbyyc", true),
        ("a*b*c", "axxbyy", false),
        ("[a-c]x", "bx", true),
        ("[c-a]x", "bx", true),
        ("[^a-c]x", "bx", false),
        ("[^a-c]x", "dx", true),
        ("[ab]", "c", false),
        (r"a\*", "a*", true),
        (r"a\*", "ab", false),
        ("exact", "exact", true),
        ("exact", "exactly", false),
    ];
    for (pattern, text, expected) in cases {
        assert_eq!(
            glob_match(pattern.as_bytes(), text.as_bytes()),
            *expected,
            "{pattern} vs {text}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn marks_expire_exactly_at_their_ttl_on_the_paused_clock() {
    let bus = MemoryPoolBus::new();
    let metadata = metadata();
    assert!(
        bus.claim_user(&mark("u1", "w1", r#"{"worker_id":"w1"}"#, &metadata))
            .await
            .unwrap()
    );
    bus.set_pool_mark("w2", "{}", Duration::from_millis(1500))
        .await
        .unwrap();
    // Rounded to whole seconds, as Redis EX takes them.
    assert_eq!(
        bus.ttl_ms(&keys::pool_worker_active("w2")).await.unwrap(),
        Some(1000)
    );
    assert_eq!(
        bus.ttl_ms(&keys::worker_active("u1")).await.unwrap(),
        Some(30_000)
    );
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(
        bus.ttl_ms(&keys::pool_worker_active("w2")).await.unwrap(),
        Some(1)
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        bus.ttl_ms(&keys::pool_worker_active("w2")).await.unwrap(),
        None
    );
    assert!(bus.user_is_active("u1").await.unwrap());
    tokio::time::advance(Duration::from_millis(29_000)).await;
    assert!(!bus.user_is_active("u1").await.unwrap());
    assert!(
        bus.hash_get_all(&keys::worker_metadata("u1"))
            .await
            .unwrap()
            .is_empty()
    );
    // A heartbeat after expiry takes the user back, as the Lua script does.
    assert!(
        bus.refresh_user_mark(&mark("u1", "w1", r#"{"worker_id":"w1"}"#, &metadata))
            .await
            .unwrap()
    );
    assert!(bus.user_is_active("u1").await.unwrap());
    assert_eq!(
        bus.scan_keys(keys::WORKER_ACTIVE_PATTERN).await.unwrap(),
        [keys::worker_active("u1")]
    );
}

#[tokio::test(start_paused = true)]
async fn a_blocked_pop_times_out_on_the_paused_clock_and_wakes_on_push() {
    let bus = std::sync::Arc::new(MemoryPoolBus::new());
    let never = CancellationToken::new();
    let started = Instant::now();
    assert_eq!(
        bus.take_claim("w1", Duration::from_secs(30), &never)
            .await
            .unwrap(),
        crate::bus::Take::Empty
    );
    assert_eq!(started.elapsed(), Duration::from_secs(30));

    let popper = {
        let bus = bus.clone();
        tokio::spawn(async move {
            let never = CancellationToken::new();
            let popped = bus
                .pop_user_message("u1", 65_536, Duration::from_secs(30), &never)
                .await;
            (popped, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    bus.push_request("u1", "r1").await.unwrap();
    let (popped, at) = popper.await.unwrap();
    assert_eq!(popped.unwrap(), Some(UserMessage::Request("r1".into())));
    assert_eq!(
        at - started,
        Duration::from_secs(35),
        "woken by the push, not the timeout"
    );
    assert_eq!(bus.list_len(&keys::user_requests("u1")).await.unwrap(), 0);
    assert_eq!(
        bus.scan_keys("trading:*").await.unwrap(),
        [keys::user_processing("u1")],
        "an emptied list is deleted; the request waits in processing"
    );
}

#[tokio::test]
async fn operations_on_the_wrong_type_are_rejected() {
    let bus = MemoryPoolBus::new();
    bus.push_request("u1", "r1").await.unwrap();
    let requests = keys::user_requests("u1");
    assert!(matches!(
        bus.get(&requests).await,
        Err(BusError::Rejected(_))
    ));
    assert!(matches!(
        bus.hash_get_all(&requests).await,
        Err(BusError::Rejected(_))
    ));
    bus.put_credentials("u1", "blob").await.unwrap();
    assert!(matches!(
        bus.list_len(&keys::credentials("u1")).await,
        Err(BusError::Rejected(_))
    ));
}
