//! The pool bus conformance suite: one set of checks, run against both buses
//! (`worker/pool/tests/it/bus_conformance.rs`). Every check uses keys of its own except
//! the two global ones (`pool:claims`, `maintenance:last_report`), each touched
//! by one check only, so the checks can run in parallel on one Redis database.
#![allow(clippy::unwrap_used)] // a test suite: a panic is its report

use std::sync::Arc;
use std::time::Duration;

use crate::{redis_url, unique_name};
use async_trait::async_trait;
use leasehold_pool::keys;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{
    Answer, AnswerMode, Answered, Begun, BusError, ClaimSettle, DEAD_LETTER_MAX, DEAD_LETTER_TTL,
    LedgerWrite, MarkWrite, MessageKind, Oversized, PoolBus, SHED_BATCH, Settled, Shed, Take,
    UserMessage, WorkerMetadata,
};
use leasehold_pool::protocol::{self, MarkValue, record};

/// A bus under test.
#[async_trait]
pub trait BusTarget: Send + Sync {
    /// The bus under test.
    fn bus(&self) -> Arc<dyn PoolBus>;
    /// Writes a hash as a foreign writer would (`HSET`, no step): for the
    /// whole-domain tests, which need records no step writes.
    async fn write_hash(&self, key: &str, fields: &[(&str, String)]);
}

/// A fresh in-memory bus as a target.
#[derive(Debug, Default)]
pub struct MemoryTarget(Arc<MemoryPoolBus>);

impl MemoryTarget {
    /// An empty bus.
    pub fn new() -> Self {
        MemoryTarget::default()
    }
}

#[async_trait]
impl BusTarget for MemoryTarget {
    fn bus(&self) -> Arc<dyn PoolBus> {
        self.0.clone()
    }
    async fn write_hash(&self, key: &str, fields: &[(&str, String)]) {
        self.0.write_hash(key, fields).expect("hset");
    }
}

/// The Redis database the suite uses on the test server (other test binaries
/// use 0-9 for their own `pool:claims`).
pub const REDIS_DATABASE: u8 = 12;

/// The Redis bus on the test server as a target.
#[derive(Debug)]
pub struct RedisTarget(Arc<RedisPoolBus>, redis::Client);

impl RedisTarget {
    /// Connects to the test Redis; `None` when no server is configured.
    pub async fn connect() -> Option<Self> {
        let base = redis_url()?;
        let url = format!("{}/{REDIS_DATABASE}", base.trim_end_matches('/'));
        Some(RedisTarget(
            Arc::new(RedisPoolBus::connect(&url).await.expect("connect")),
            redis::Client::open(url).expect("a Redis URL"),
        ))
    }
}

#[async_trait]
impl BusTarget for RedisTarget {
    fn bus(&self) -> Arc<dyn PoolBus> {
        self.0.clone()
    }
    async fn write_hash(&self, key: &str, fields: &[(&str, String)]) {
        let mut connection = self
            .1
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let () = redis::cmd("HSET")
            .arg(key)
            .arg(fields)
            .query_async(&mut connection)
            .await
            .expect("hset");
    }
}

/// How long a blocked pop may take to notice a push or an interrupt.
const PROMPT: Duration = Duration::from_secs(2);

fn metadata(worker_id: &str) -> WorkerMetadata {
    WorkerMetadata {
        task_arn: format!("task-{worker_id}"),
        instance_id: "conformance-host".into(),
        launched_at: 7,
        sidecar_url: Some("http://10.0.0.7:9464".into()),
    }
}

fn mark_value(user_id: &str, worker_id: &str, heartbeat_at: u64) -> String {
    MarkValue {
        worker_id: worker_id.to_owned(),
        task_id: format!("task-{worker_id}"),
        user_id: user_id.to_owned(),
        heartbeat_at,
        started_at: 7,
        sidecar_url: None,
        ttl_ms: None,
        heartbeat_interval_ms: None,
        seal_key: None,
    }
    .to_json()
}

/// What a worker writes for a user: its mark and metadata.
struct Writer {
    user_id: String,
    worker_id: String,
    value: String,
    metadata: WorkerMetadata,
    ttl: Duration,
}

impl Writer {
    fn new(user_id: &str, worker_id: &str) -> Self {
        Writer {
            user_id: user_id.to_owned(),
            worker_id: worker_id.to_owned(),
            value: mark_value(user_id, worker_id, 1),
            metadata: metadata(worker_id),
            ttl: Duration::from_secs(30),
        }
    }

    fn mark(&self) -> MarkWrite<'_> {
        MarkWrite {
            user_id: &self.user_id,
            worker_id: &self.worker_id,
            value: &self.value,
            ttl: self.ttl,
            metadata: &self.metadata,
        }
    }
}

async fn claim(bus: &dyn PoolBus, writer: &Writer) -> bool {
    bus.claim_user(&writer.mark()).await.expect("claim")
}

async fn refresh(bus: &dyn PoolBus, writer: &Writer) -> bool {
    bus.refresh_user_mark(&writer.mark())
        .await
        .expect("heartbeat")
}

async fn stored_mark(bus: &dyn PoolBus, user_id: &str) -> Option<String> {
    bus.get(&keys::worker_active(user_id)).await.expect("get")
}

async fn task_arn(bus: &dyn PoolBus, user_id: &str) -> Option<String> {
    bus.hash_get_all(&keys::worker_metadata(user_id))
        .await
        .expect("hgetall")
        .remove("task_arn")
}

/// Many pool workers claim one user at once: exactly one wins, its mark and
/// metadata are stored and its pool mark is gone; the losers' stay.
pub async fn claims_are_exclusive(target: &dyn BusTarget) {
    let bus = target.bus();
    for _round in 0..10 {
        let user = unique_name("u");
        let workers: Vec<String> = (0..16).map(|i| unique_name(&format!("w{i}"))).collect();
        for worker in &workers {
            bus.set_pool_mark(worker, "{}", Duration::from_secs(30))
                .await
                .expect("pool mark");
        }
        let claims = workers.iter().map(|worker| {
            let (bus, writer) = (bus.clone(), Writer::new(&user, worker));
            tokio::spawn(async move { (claim(bus.as_ref(), &writer).await, writer) })
        });
        let mut winners = Vec::new();
        for claim in claims {
            let (won, writer) = claim.await.expect("claimer");
            if won {
                winners.push(writer);
            }
        }
        assert_eq!(winners.len(), 1, "exactly one claimer wins");
        let winner = &winners[0];
        assert_eq!(
            stored_mark(bus.as_ref(), &user).await,
            Some(winner.value.clone())
        );
        let metadata = bus
            .hash_get_all(&keys::worker_metadata(&user))
            .await
            .expect("hgetall");
        assert_eq!(metadata.get("task_arn"), Some(&winner.metadata.task_arn));
        assert_eq!(
            metadata.get("instance_id").map(String::as_str),
            Some("conformance-host")
        );
        assert_eq!(metadata.get("launched_at").map(String::as_str), Some("7"));
        assert_eq!(
            metadata.get("sidecar_url").map(String::as_str),
            Some("http://10.0.0.7:9464"),
            "the metadata carries the worker's sidecar"
        );
        for worker in &workers {
            let pool_mark = bus
                .get(&keys::pool_worker_active(worker))
                .await
                .expect("get");
            assert_eq!(
                pool_mark.is_none(),
                *worker == winner.worker_id,
                "only the winner's pool mark is dropped"
            );
        }
        assert!(bus.user_is_active(&user).await.expect("exists"));
    }
}

/// A heartbeat refreshes the holder's mark; once another worker holds the
/// user it is refused and writes nothing; an absent mark is taken back.
pub async fn heartbeat_is_refused_once_displaced(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let mut first = Writer::new(&user, &unique_name("w1"));
    let second = Writer::new(&user, &unique_name("w2"));
    assert!(claim(bus.as_ref(), &first).await);
    first.value = mark_value(&user, &first.worker_id, 2);
    assert!(refresh(bus.as_ref(), &first).await, "the holder refreshes");
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(first.value.clone())
    );
    assert!(
        !claim(bus.as_ref(), &second).await,
        "a held user is not claimed"
    );
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(first.value.clone())
    );

    assert!(
        bus.release_user_mark(&user, &first.worker_id)
            .await
            .expect("release")
    );
    assert!(claim(bus.as_ref(), &second).await);
    first.value = mark_value(&user, &first.worker_id, 3);
    assert!(
        !refresh(bus.as_ref(), &first).await,
        "the displaced worker is refused"
    );
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(second.value.clone())
    );
    assert_eq!(
        task_arn(bus.as_ref(), &user).await,
        Some(second.metadata.task_arn.clone())
    );

    assert!(
        bus.release_user_mark(&user, &second.worker_id)
            .await
            .expect("release")
    );
    assert!(
        refresh(bus.as_ref(), &first).await,
        "an absent mark is taken back"
    );
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(first.value.clone())
    );
    assert_eq!(
        task_arn(bus.as_ref(), &user).await,
        Some(first.metadata.task_arn.clone())
    );
}

/// Only the holder's release deletes the mark and the metadata.
pub async fn release_is_only_by_the_owner(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let owner = Writer::new(&user, &unique_name("w-owner"));
    assert!(claim(bus.as_ref(), &owner).await);
    let other = unique_name("w-other");
    assert!(!bus.release_user_mark(&user, &other).await.expect("release"));
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(owner.value.clone())
    );
    assert!(task_arn(bus.as_ref(), &user).await.is_some());
    assert!(
        bus.release_user_mark(&user, &owner.worker_id)
            .await
            .expect("release")
    );
    assert_eq!(stored_mark(bus.as_ref(), &user).await, None);
    assert_eq!(task_arn(bus.as_ref(), &user).await, None);
    assert!(!bus.user_is_active(&user).await.expect("exists"));
    assert!(
        bus.release_user_mark(&user, &other).await.expect("release"),
        "nothing to guard: an absent mark is released by anyone"
    );
}

/// Marks and metadata vanish after their TTL; a heartbeat extends it.
pub async fn marks_expire_with_their_ttl(target: &dyn BusTarget) {
    let bus = target.bus();
    let pool_worker = unique_name("w-pool");
    let pool_key = keys::pool_worker_active(&pool_worker);
    bus.set_pool_mark(&pool_worker, "{}", Duration::from_secs(1))
        .await
        .expect("pool mark");
    let ttl = bus.ttl_ms(&pool_key).await.expect("pttl");
    assert!(matches!(ttl, Some(1..=1000)), "pool mark TTL {ttl:?}");

    let user = unique_name("u");
    let mut writer = Writer::new(&user, &unique_name("w"));
    writer.ttl = Duration::from_secs(1);
    assert!(claim(bus.as_ref(), &writer).await);
    let metadata_ttl = bus
        .ttl_ms(&keys::worker_metadata(&user))
        .await
        .expect("pttl");
    assert!(
        matches!(metadata_ttl, Some(1..=1000)),
        "metadata TTL {metadata_ttl:?}"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(refresh(bus.as_ref(), &writer).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        bus.get(&pool_key).await.expect("get"),
        None,
        "pool mark expired"
    );
    assert_eq!(bus.ttl_ms(&pool_key).await.expect("pttl"), None);
    assert!(
        bus.user_is_active(&user).await.expect("exists"),
        "the heartbeat extended the mark"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!bus.user_is_active(&user).await.expect("exists"));
    assert_eq!(
        task_arn(bus.as_ref(), &user).await,
        None,
        "metadata expired"
    );
    assert!(
        !bus.scan_keys(keys::WORKER_ACTIVE_PATTERN)
            .await
            .expect("scan")
            .iter()
            .any(|key| *key == pool_key || *key == keys::worker_active(&user)),
        "expired marks are not scanned"
    );
}

/// The size bound the conformance pops use (the worker's default).
const MAX_BYTES: usize = 65_536;

async fn pop_user(bus: &dyn PoolBus, user: &str) -> Option<UserMessage> {
    bus.pop_user_message(
        user,
        MAX_BYTES,
        Duration::from_secs(1),
        &CancellationToken::new(),
    )
    .await
    .expect("pop")
}

/// The worker the request tests answer as.
const ANSWERING: &str = "w1";

/// Makes `worker` the user's mark holder (if no one else is).
async fn hold(bus: &dyn PoolBus, user: &str, worker: &str) -> Writer {
    let writer = Writer::new(user, worker);
    claim(bus, &writer).await;
    writer
}

fn request(body: &str) -> Option<UserMessage> {
    Some(UserMessage::Request(body.as_bytes().to_vec()))
}

fn control(body: &str) -> Option<UserMessage> {
    Some(UserMessage::Control(body.as_bytes().to_vec()))
}

/// Ends a request the way a worker does once it answered it: a final answer
/// from the mark holder that began it. `true` when stored.
async fn answer(
    bus: &dyn PoolBus,
    user: &str,
    raw: &str,
    request_id: &str,
    mode: AnswerMode,
) -> bool {
    if mode == AnswerMode::Final {
        hold(bus, user, ANSWERING).await;
        let begun = bus
            .begin_request(request_id, user, ANSWERING, 1)
            .await
            .expect("begin");
        assert!(
            matches!(
                begun,
                Begun::Started | Begun::Executing { .. } | Begun::Done { .. }
            ),
            "{begun:?}"
        );
    }
    bus.answer_request(&Answer {
        user_id: user,
        worker_id: ANSWERING,
        raw: raw.as_bytes(),
        request_id,
        response: &format!(r#"{{"request_id":"{request_id}","status":"ok"}}"#),
        mode,
        dead_letter: None,
    })
    .await
    .expect("answer")
        == Answered::Stored
}

/// Requests are served oldest first (LPUSH, then `LMOVE`/`BLMOVE … RIGHT
/// LEFT` into the processing list), each handed out again until it is
/// answered; control messages come first, oldest first.
pub async fn requests_are_served_oldest_first_through_processing(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let processing = keys::user_processing(&user);
    for body in ["r1", "r2", "r3"] {
        bus.push_request(&user, body).await.expect("push");
    }
    assert_eq!(
        bus.list_items(&keys::user_requests(&user))
            .await
            .expect("lrange"),
        ["r3", "r2", "r1"],
        "pushed at the head"
    );
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("r1"));
    assert_eq!(
        bus.list_items(&processing).await.expect("lrange"),
        ["r1"],
        "moved, not removed"
    );
    assert_eq!(
        pop_user(bus.as_ref(), &user).await,
        request("r1"),
        "an unanswered request is handed out again (a crashed worker's successor)"
    );
    assert!(
        answer(
            bus.as_ref(),
            &user,
            "r1",
            &unique_name("r"),
            AnswerMode::Final
        )
        .await
    );
    assert_eq!(bus.list_len(&processing).await.expect("llen"), 0);
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("r2"));

    bus.push_control(&user, "k1").await.expect("push");
    bus.push_control(&user, "k2").await.expect("push");
    assert_eq!(
        bus.list_len(&keys::worker_control(&user))
            .await
            .expect("llen"),
        2
    );
    assert_eq!(pop_user(bus.as_ref(), &user).await, control("k1"));
    assert_eq!(
        bus.list_items(&keys::worker_control_processing(&user))
            .await
            .expect("lrange"),
        ["k1"],
        "moved, not removed"
    );
    assert_eq!(
        pop_user(bus.as_ref(), &user).await,
        control("k1"),
        "an unfinished control message is handed out again (a crashed worker's successor)"
    );
    bus.finish_control(&user, b"k1").await.expect("finish");
    assert_eq!(pop_user(bus.as_ref(), &user).await, control("k2"));
    bus.finish_control(&user, b"k2").await.expect("finish");
    assert_eq!(
        bus.list_len(&keys::worker_control(&user))
            .await
            .expect("llen"),
        0,
    );
    assert_eq!(
        bus.list_len(&keys::worker_control_processing(&user))
            .await
            .expect("llen"),
        0,
        "finished control messages leave processing"
    );
    assert_eq!(
        pop_user(bus.as_ref(), &user).await,
        request("r2"),
        "the request in processing comes before a newer one"
    );
    assert!(
        answer(
            bus.as_ref(),
            &user,
            "r2",
            &unique_name("r"),
            AnswerMode::Final
        )
        .await
    );
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("r3"));
    assert!(
        answer(
            bus.as_ref(),
            &user,
            "r3",
            &unique_name("r"),
            AnswerMode::Final
        )
        .await
    );
    assert_eq!(pop_user(bus.as_ref(), &user).await, None);
}

/// A backlog comes out exactly in push order, however long.
pub async fn a_backlog_is_served_in_push_order(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let pushed: Vec<String> = (0..50).map(|i| format!("r{i}")).collect();
    for body in &pushed {
        bus.push_request(&user, body).await.expect("push");
    }
    let mut served = Vec::new();
    while let Some(UserMessage::Request(raw)) = pop_user(bus.as_ref(), &user).await {
        let body = String::from_utf8(raw).expect("utf-8");
        assert!(
            answer(
                bus.as_ref(),
                &user,
                &body,
                &unique_name("r"),
                AnswerMode::Final
            )
            .await
        );
        served.push(body);
    }
    assert_eq!(served, pushed);
}

/// Empties the global `pool:claims`.
async fn drain_claims(bus: &dyn PoolBus) {
    let never = CancellationToken::new();
    let drainer = unique_name("drain");
    while let Some(taken) = bus
        .take_claim(&drainer, Duration::from_millis(10), &never)
        .await
        .expect("drain")
        .claim()
    {
        bus.fail_claim(&drainer, &taken.raw, None, "drained by a test", 1)
            .await
            .expect("drop");
    }
}

/// Files `body` in `worker`'s claim processing list the way a pool worker
/// does (push, then take); the worker must hold no other claim.
async fn file_claim(bus: &dyn PoolBus, worker: &str, body: &str) {
    bus.push_claim(body).await.expect("push");
    let taken = bus
        .take_claim(worker, Duration::from_secs(1), &CancellationToken::new())
        .await
        .expect("take")
        .claim()
        .expect("queued");
    assert_eq!(taken.text(), body);
}

/// Claims are served oldest first (LPUSH, then a move from the right end); a
/// taken claim sits in the taker's processing list, not only in its memory,
/// and is handed out again until settled; a returned claim is next in line;
/// an interrupted take takes nothing. Then the claim step and the re-queue of
/// a dead worker's claims. One check, because all of it goes through the
/// global `pool:claims`.
pub async fn claims_go_through_the_takers_processing_list(target: &dyn BusTarget) {
    let bus = target.bus();
    taking_claims(bus.as_ref()).await;
    settling_claims(bus.as_ref()).await;
    requeueing_claims(bus.as_ref()).await;
    retiring_pool_workers(bus.as_ref()).await;
    assigning_users(bus.as_ref()).await;
}

/// The sealer's assign step over its whole input domain
/// ([`leasehold_pool::bus::assign::domain`]: every grant × holder record ×
/// user mark × taken claims): the bus decides as the pure rule does, writes
/// the mark, holder record and used grant only when it assigns, and changes
/// nothing when it refuses.
async fn assigning_users(bus: &dyn PoolBus) {
    use leasehold_pool::bus::assign::{
        AssignRequest, Assignment, MarkSeen, SealHolder, assign_rule, domain,
    };
    let long = Duration::from_secs(600);
    let probe = domain::names("probe");
    let (grants, holders, marks, taken) = (
        domain::grants(&probe).len(),
        domain::holders(&probe).len(),
        domain::marks(&probe).len(),
        domain::taken(&probe).len(),
    );
    let mut decisions = std::collections::BTreeMap::<&str, usize>::new();
    for g in 0..grants {
        for h in 0..holders {
            for m in 0..marks {
                for t in 0..taken {
                    let n = domain::names(&unique_name("as"));
                    let grant = domain::grants(&n).swap_remove(g);
                    let holder = domain::holders(&n).swap_remove(h);
                    let mark = domain::marks(&n).swap_remove(m);
                    let claims = domain::taken(&n).swap_remove(t);
                    let case = format!(
                        "grant {grant:?}, holder {holder:?}, mark {mark:?}, taken {claims:?}"
                    );
                    if let Some(grant) = &grant {
                        bus.grant_credentials(&n.user, grant, long).await.unwrap();
                    }
                    if let Some(holder) = &holder {
                        assert!(
                            bus.set_if_absent(&keys::seal_holder(&n.user), holder, long)
                                .await
                                .unwrap()
                        );
                    }
                    if let Some(mark) = &mark {
                        assert!(
                            bus.set_if_absent(&keys::worker_active(&n.user), mark, long)
                                .await
                                .unwrap()
                        );
                    }
                    for claim in &claims {
                        file_claim(bus, &n.worker, claim).await;
                    }
                    let asker = n.asker();
                    let expected = assign_rule(
                        &asker,
                        grant.as_deref(),
                        holder.as_deref(),
                        &MarkSeen::of(mark.as_deref()),
                        &claims,
                    );
                    let new_mark = format!(
                        r#"{{"worker_id":"{}","user_id":"{}","seal":"new"}}"#,
                        n.worker, n.user
                    );
                    let decided = bus
                        .assign_user(&AssignRequest {
                            asker,
                            mark: &new_mark,
                            mark_ttl: Duration::from_secs(30),
                            login_hash: "H",
                        })
                        .await
                        .unwrap();
                    assert_eq!(decided, expected, "{case}");
                    *decisions.entry(decided.word()).or_default() += 1;
                    let stored_grant = bus.get(&keys::credentials_grant(&n.user)).await.unwrap();
                    let stored_holder = bus.get(&keys::seal_holder(&n.user)).await.unwrap();
                    let stored_mark = bus.get(&keys::worker_active(&n.user)).await.unwrap();
                    let used_by = stored_grant.as_deref().and_then(|grant| {
                        serde_json::from_str::<serde_json::Value>(grant)
                            .ok()
                            .and_then(|grant| {
                                grant
                                    .get("used_by")
                                    .and_then(|w| w.as_str())
                                    .map(str::to_owned)
                            })
                    });
                    match &decided {
                        Assignment::Assigned { bound_to } => {
                            assert_eq!(used_by.as_deref(), Some(n.worker.as_str()), "{case}");
                            assert_eq!(stored_mark.as_deref(), Some(new_mark.as_str()), "{case}");
                            let written: SealHolder =
                                serde_json::from_str(&stored_holder.unwrap()).unwrap();
                            assert_eq!(
                                written,
                                domain::written_holder(&n, bound_to, "H"),
                                "{case}"
                            );
                            let ttl = bus
                                .ttl_ms(&keys::worker_active(&n.user))
                                .await
                                .unwrap()
                                .unwrap();
                            assert!((1..=30_000).contains(&ttl), "{case}: mark ttl {ttl}");
                            let ttl = bus
                                .ttl_ms(&keys::credentials_grant(&n.user))
                                .await
                                .unwrap()
                                .unwrap();
                            assert!(ttl > 30_000, "{case}: the used grant keeps its ttl: {ttl}");
                        }
                        Assignment::Renewed { .. } => {
                            assert_eq!(used_by.as_deref(), Some(n.worker.as_str()), "{case}");
                            assert_eq!(stored_mark, mark, "{case}");
                            assert_eq!(stored_holder, holder, "{case}");
                        }
                        _ => {
                            assert_eq!(stored_grant, grant, "{case}");
                            assert_eq!(stored_mark, mark, "{case}");
                            assert_eq!(stored_holder, holder, "{case}");
                        }
                    }
                    if !claims.is_empty() {
                        drain_taken(bus, &n.worker).await;
                    }
                }
            }
        }
    }
    // Every decision is reached somewhere in the domain.
    for word in [
        "assigned",
        "renewed",
        "no_grant",
        "grant_used",
        "not_bound",
        "held",
    ] {
        assert!(
            decisions.contains_key(word),
            "{word} never decided: {decisions:?}"
        );
    }
}

/// Drops the claims `worker` has taken (so the case leaves nothing behind).
async fn drain_taken(bus: &dyn PoolBus, worker: &str) {
    for raw in bus
        .list_items(&keys::claims_processing(worker))
        .await
        .unwrap()
    {
        bus.fail_claim(worker, raw.as_bytes(), None, "assign case done", 1)
            .await
            .unwrap();
    }
}

/// This test's entries of the global `pool:idle`, as (worker, mark), by worker.
async fn idle_among(bus: &dyn PoolBus, workers: &[&str]) -> Vec<(String, String)> {
    let mut idle: Vec<(String, String)> = bus
        .idle_workers()
        .await
        .expect("idle workers")
        .into_iter()
        .filter(|entry| workers.contains(&entry.worker_id.as_str()))
        .map(|entry| (entry.worker_id, entry.mark))
        .collect();
    idle.sort();
    idle
}

/// The pool manager's retirement and a worker's take race on one atomic
/// check: a worker with a claim in its processing list (between take and
/// claim step) cannot be retired, and a retired worker serves no claim, even
/// one its blocked move took after the retirement: that claim is back first
/// in line in the same step.
async fn retiring_pool_workers(bus: &dyn PoolBus) {
    drain_claims(bus).await;
    let never = CancellationToken::new();
    let (busy, blocked) = (unique_name("w-busy"), unique_name("w-blocked"));
    let ttl = Duration::from_secs(30);
    for worker in [&busy, &blocked] {
        assert!(bus.set_pool_mark(worker, worker, ttl).await.expect("mark"));
    }
    let ours = [busy.as_str(), blocked.as_str()];
    assert_eq!(idle_among(bus, &ours).await.len(), 2);

    // Between take and claim step: busy, neither idle nor retirable.
    let first = unique_name("claim");
    file_claim(bus, &busy, &first).await;
    assert!(!bus.retire_idle(&busy).await.expect("retire"), "mid-claim");
    assert_eq!(
        idle_among(bus, &ours).await,
        [(blocked.clone(), blocked.clone())],
        "a worker holding a claim is not idle"
    );
    assert!(
        bus.fail_claim(&busy, first.as_bytes(), None, "test", 1)
            .await
            .expect("fail")
    );
    assert!(bus.retire_idle(&busy).await.expect("retire"), "idle now");
    assert!(!bus.retire_idle(&busy).await.expect("retire"), "once");
    assert!(
        !bus.set_pool_mark(&busy, &busy, ttl).await.expect("mark"),
        "a heartbeat does not undo the retirement"
    );
    assert_eq!(idle_among(bus, &ours).await.len(), 1, "retired: not idle");
    let second = unique_name("claim");
    bus.push_claim(&second).await.expect("push");
    assert_eq!(
        bus.take_claim(&busy, Duration::from_secs(1), &never)
            .await
            .expect("take"),
        Take::Retired
    );
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        std::slice::from_ref(&second)
    );

    // Retired while blocked in the move: the claim the move takes goes back.
    drain_claims(bus).await;
    let take = bus.take_claim(&blocked, Duration::from_secs(30), &never);
    let retire_then_push = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(bus.retire_idle(&blocked).await.expect("retire"));
        bus.push_claim(&second).await.expect("push");
    };
    let (taken, ()) = tokio::time::timeout(PROMPT + Duration::from_millis(200), async {
        tokio::join!(take, retire_then_push)
    })
    .await
    .expect("the push wakes the take");
    assert_eq!(taken, Ok(Take::Retired));
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        std::slice::from_ref(&second),
        "handed back, first in line"
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&blocked))
            .await
            .expect("llen"),
        0
    );
    drain_claims(bus).await;

    // An entry without its mark is a dead worker's: dropped by the read that
    // finds it, retirement included (a later worker of that id starts idle),
    // and a claim it had taken goes back in line.
    let dead = unique_name("w-dead");
    assert!(bus.set_pool_mark(&dead, &dead, ttl).await.expect("mark"));
    let orphaned = unique_name("claim");
    file_claim(bus, &dead, &orphaned).await;
    bus.delete_keys(&[
        keys::pool_worker_active(&busy),
        keys::pool_worker_active(&dead),
    ])
    .await
    .expect("del");
    assert_eq!(idle_among(bus, &[busy.as_str(), dead.as_str()]).await, []);
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        std::slice::from_ref(&orphaned),
        "the dead worker's claim is back in line"
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&dead))
            .await
            .expect("llen"),
        0
    );
    drain_claims(bus).await;
    assert!(bus.set_pool_mark(&busy, "again", ttl).await.expect("mark"));
    assert_eq!(
        idle_among(bus, &ours).await,
        [(busy.clone(), "again".to_owned())]
    );
    for worker in [&busy, &blocked] {
        bus.delete_pool_mark(worker).await.expect("delete");
    }
    assert_eq!(idle_among(bus, &ours).await, []);
    assert!(!bus.retire_idle(&busy).await.expect("retire"), "gone");
}

/// The sweep's compare-and-delete: a mark goes (with the keys named with it)
/// only while it holds the value the snapshot saw; the bus reports its own
/// clock. The idle pool lists workers by the bus's clock.
pub async fn marks_are_deleted_only_if_unchanged(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let mut writer = Writer::new(&user, &unique_name("w"));
    assert!(claim(bus.as_ref(), &writer).await);
    let (key, metadata) = (keys::worker_active(&user), keys::worker_metadata(&user));
    let seen = writer.value.clone();
    let also = [metadata.clone()];
    assert!(
        !bus.delete_mark_if(&key, "another value", &also)
            .await
            .expect("cad")
    );
    // A heartbeat after the snapshot: the snapshot's value is stale.
    writer.value = mark_value(&user, &writer.worker_id, 2);
    assert!(refresh(bus.as_ref(), &writer).await);
    assert!(!bus.delete_mark_if(&key, &seen, &also).await.expect("cad"));
    assert_eq!(
        stored_mark(bus.as_ref(), &user).await,
        Some(writer.value.clone())
    );
    assert!(
        task_arn(bus.as_ref(), &user).await.is_some(),
        "metadata kept"
    );
    assert!(
        bus.delete_mark_if(&key, &writer.value, &also)
            .await
            .expect("cad")
    );
    assert_eq!(stored_mark(bus.as_ref(), &user).await, None);
    assert_eq!(task_arn(bus.as_ref(), &user).await, None, "deleted with it");
    assert!(
        !bus.delete_mark_if(&key, &writer.value, &also)
            .await
            .expect("cad"),
        "absent"
    );

    let host =
        leasehold_platform::clock::Clock::now_ms_u64(&leasehold_platform::clock::SystemClock);
    let server = bus.server_time_ms().await.expect("time");
    assert!(server.abs_diff(host) < 5_000, "server {server} host {host}");
    let worker = unique_name("w-idle");
    assert!(
        bus.set_pool_mark(&worker, "m", Duration::from_secs(30))
            .await
            .expect("mark")
    );
    let entry = bus
        .idle_workers()
        .await
        .expect("idle")
        .into_iter()
        .find(|entry| entry.worker_id == worker)
        .expect("listed");
    assert!(
        entry.heartbeat_ms.abs_diff(server) < 5_000,
        "scored with the bus clock: {} vs {server}",
        entry.heartbeat_ms
    );
    bus.delete_pool_mark(&worker).await.expect("delete");
}

async fn taking_claims(bus: &dyn PoolBus) {
    let never = CancellationToken::new();
    drain_claims(bus).await;
    let worker = unique_name("w");
    for claim in ["c1", "c2", "c3"] {
        bus.push_claim(claim).await.expect("push");
    }
    let take = || async {
        bus.take_claim(&worker, Duration::from_secs(1), &never)
            .await
            .expect("take")
            .claim()
            .map(|taken| taken.text())
    };
    assert_eq!(take().await.as_deref(), Some("c1"));
    assert_eq!(
        bus.list_items(&keys::claims_processing(&worker))
            .await
            .expect("lrange"),
        ["c1"],
        "the taken claim is in the taker's list"
    );
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        ["c3", "c2"]
    );
    // Not settled: the same claim again, nothing new taken.
    assert_eq!(take().await.as_deref(), Some("c1"));
    assert_eq!(bus.list_len(keys::POOL_CLAIMS).await.expect("llen"), 2);
    // Given back: first in line.
    assert!(bus.return_claim(&worker, b"c1").await.expect("return"));
    assert!(!bus.return_claim(&worker, b"c1").await.expect("return"));
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        ["c3", "c2", "c1"]
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&worker))
            .await
            .expect("llen"),
        0
    );
    for expected in ["c1", "c2", "c3"] {
        assert_eq!(take().await.as_deref(), Some(expected));
        assert!(
            bus.fail_claim(&worker, expected.as_bytes(), None, "test", 1)
                .await
                .expect("fail")
        );
    }
    assert!(
        bus.list_len(&keys::dead_letter(keys::POOL_CLAIMS))
            .await
            .expect("llen")
            >= 3
    );
    let interrupt = CancellationToken::new();
    let blocked = bus.take_claim(&worker, Duration::from_secs(30), &interrupt);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        interrupt.cancel();
        Instant::now()
    };
    let (taken, interrupted) = tokio::time::timeout(PROMPT + Duration::from_millis(200), async {
        tokio::join!(blocked, cancel)
    })
    .await
    .expect("the interrupt ends the take");
    assert_eq!(taken, Ok(Take::Empty));
    assert!(interrupted.elapsed() < PROMPT);
    // A blocked take wakes on a push and files the claim in the taker's list.
    let blocked = bus.take_claim(&worker, Duration::from_secs(30), &never);
    let push = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bus.push_claim("c5").await.expect("push");
    };
    let (taken, ()) = tokio::time::timeout(PROMPT + Duration::from_millis(200), async {
        tokio::join!(blocked, push)
    })
    .await
    .expect("the push wakes the take");
    assert_eq!(
        taken.expect("take").claim().map(|t| t.raw),
        Some(b"c5".to_vec())
    );
    assert_eq!(
        bus.list_items(&keys::claims_processing(&worker))
            .await
            .expect("lrange"),
        ["c5"]
    );
    bus.delete_keys(&[keys::claims_processing(&worker)])
        .await
        .expect("del");
}

/// The claim step marks the user, drops the claimer's pool mark, removes the
/// claim from the claimer's list and writes the outcome, all at once; a
/// repeat (after a lost reply) writes nothing; a held user is refused with a
/// `failed` outcome; an unusable claim is dead-lettered with its outcome.
async fn settling_claims(bus: &dyn PoolBus) {
    let user = unique_name("u");
    let (winner, loser) = (Writer::new(&user, &unique_name("w")), {
        let mut w = Writer::new(&user, &unique_name("w"));
        w.value = mark_value(&user, &w.worker_id, 2);
        w
    });
    let claim_id = unique_name("c");
    for writer in [&winner, &loser] {
        bus.set_pool_mark(&writer.worker_id, "{}", Duration::from_secs(30))
            .await
            .expect("pool mark");
        file_claim(bus, &writer.worker_id, "body").await;
    }
    let claimed = leasehold_pool::protocol::ClaimOutcome::claimed(&winner.worker_id).to_json();
    let refused =
        leasehold_pool::protocol::ClaimOutcome::failed(&winner.worker_id, "user already served")
            .to_json();
    let settle = ClaimSettle {
        raw: b"body",
        claim_id: &claim_id,
        claimed: &claimed,
        refused: &refused,
    };
    assert_eq!(
        bus.settle_claim(&winner.mark(), &settle)
            .await
            .expect("settle"),
        Settled::Claimed
    );
    assert_eq!(stored_mark(bus, &user).await, Some(winner.value.clone()));
    assert_eq!(
        task_arn(bus, &user).await,
        Some(winner.metadata.task_arn.clone())
    );
    assert_eq!(
        bus.get(&keys::pool_worker_active(&winner.worker_id))
            .await
            .expect("get"),
        None
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&winner.worker_id))
            .await
            .expect("llen"),
        0
    );
    let outcome_key = keys::claim_outcome(&claim_id);
    assert_eq!(
        bus.get(&outcome_key).await.expect("get"),
        Some(claimed.clone())
    );
    let ttl = bus
        .ttl_ms(&outcome_key)
        .await
        .expect("ttl")
        .expect("exists");
    assert!((55_000..=60_000).contains(&ttl), "outcome ttl {ttl}");
    // The repeat of a step whose reply was lost changes nothing.
    assert_eq!(
        bus.settle_claim(&winner.mark(), &settle)
            .await
            .expect("settle"),
        Settled::NotHeld
    );
    assert_eq!(
        bus.get(&outcome_key).await.expect("get"),
        Some(claimed.clone())
    );
    // Another worker with the same claim (re-queued after a failover lost the
    // first step's removal): refused, its pool mark kept, and the claim keeps
    // the `claimed` of the worker that serves the user.
    let refused_by_loser =
        leasehold_pool::protocol::ClaimOutcome::failed(&loser.worker_id, "user already served")
            .to_json();
    let settle = ClaimSettle {
        refused: &refused_by_loser,
        ..settle
    };
    assert_eq!(
        bus.settle_claim(&loser.mark(), &settle)
            .await
            .expect("settle"),
        Settled::Refused
    );
    assert_eq!(stored_mark(bus, &user).await, Some(winner.value.clone()));
    assert!(
        bus.get(&keys::pool_worker_active(&loser.worker_id))
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(
        bus.get(&outcome_key).await.expect("get"),
        Some(claimed.clone()),
        "a second settle of one claim never turns `claimed` into `failed`"
    );
    // A new claim for the served user: refused, outcome failed.
    file_claim(bus, &loser.worker_id, "body-2").await;
    let second_id = unique_name("c");
    let second = ClaimSettle {
        raw: b"body-2",
        claim_id: &second_id,
        ..settle
    };
    assert_eq!(
        bus.settle_claim(&loser.mark(), &second)
            .await
            .expect("settle"),
        Settled::Refused
    );
    assert_eq!(
        bus.get(&keys::claim_outcome(&second_id))
            .await
            .expect("get"),
        Some(refused_by_loser)
    );
    // An unusable claim: dead-lettered and answered `failed` in one step.
    file_claim(bus, &loser.worker_id, "junk").await;
    let failed_id = unique_name("c");
    let failed =
        leasehold_pool::protocol::ClaimOutcome::failed(&loser.worker_id, "invalid").to_json();
    assert!(
        bus.fail_claim(
            &loser.worker_id,
            b"junk",
            Some((&failed_id, &failed)),
            "invalid",
            5
        )
        .await
        .expect("fail")
    );
    assert!(
        !bus.fail_claim(
            &loser.worker_id,
            b"junk",
            Some((&failed_id, &failed)),
            "invalid",
            5
        )
        .await
        .expect("fail")
    );
    assert_eq!(
        bus.get(&keys::claim_outcome(&failed_id))
            .await
            .expect("get"),
        Some(failed)
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&loser.worker_id))
            .await
            .expect("llen"),
        0
    );
}

/// A worker's taken claims go back to `pool:claims`, first in line, only
/// once its pool mark is gone; the supervisor's lock is `SET NX`.
async fn requeueing_claims(bus: &dyn PoolBus) {
    drain_claims(bus).await;
    let worker = unique_name("w");
    bus.set_pool_mark(&worker, "{}", Duration::from_secs(30))
        .await
        .expect("pool mark");
    let (taken, queued) = (unique_name("taken"), unique_name("queued"));
    file_claim(bus, &worker, &taken).await;
    bus.push_claim(&queued).await.expect("push");
    assert_eq!(
        bus.requeue_claims(&worker).await.expect("requeue"),
        0,
        "alive"
    );
    assert_eq!(
        bus.list_len(&keys::claims_processing(&worker))
            .await
            .expect("llen"),
        1
    );
    bus.delete_pool_mark(&worker).await.expect("delete");
    assert_eq!(bus.requeue_claims(&worker).await.expect("requeue"), 1);
    assert_eq!(bus.requeue_claims(&worker).await.expect("requeue"), 0);
    assert_eq!(
        bus.list_len(&keys::claims_processing(&worker))
            .await
            .expect("llen"),
        0
    );
    assert_eq!(
        bus.list_items(keys::POOL_CLAIMS).await.expect("lrange"),
        [queued.clone(), taken.clone()],
        "the re-queued claim is first in line"
    );
    let successor = unique_name("w");
    for expected in [&taken, &queued] {
        let got = bus
            .take_claim(
                &successor,
                Duration::from_secs(1),
                &CancellationToken::new(),
            )
            .await
            .expect("take")
            .claim()
            .expect("queued");
        assert_eq!(&got.text(), expected);
        bus.fail_claim(&successor, &got.raw, None, "test", 1)
            .await
            .expect("fail");
    }
    let lock = keys::reserve_lock(&unique_name("u"));
    assert!(
        bus.set_if_absent(&lock, "a", Duration::from_secs(30))
            .await
            .expect("set")
    );
    assert!(
        !bus.set_if_absent(&lock, "b", Duration::from_secs(30))
            .await
            .expect("set")
    );
    assert_eq!(bus.get(&lock).await.expect("get").as_deref(), Some("a"));
}

/// A pop on empty lists returns `None` after its timeout, not before.
pub async fn blocking_pop_times_out(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let started = Instant::now();
    let popped = bus
        .pop_user_message(
            &user,
            MAX_BYTES,
            Duration::from_millis(300),
            &CancellationToken::new(),
        )
        .await
        .expect("pop");
    let waited = started.elapsed();
    assert_eq!(popped, None);
    assert!(
        waited >= Duration::from_millis(250),
        "returned after {waited:?}"
    );
    assert!(waited < PROMPT, "returned after {waited:?}");
}

/// A blocked pop returns as soon as a message is pushed.
pub async fn blocking_pop_wakes_on_push(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let pop = {
        let (bus, user) = (bus.clone(), user.clone());
        tokio::spawn(async move {
            let popped = bus
                .pop_user_message(
                    &user,
                    MAX_BYTES,
                    Duration::from_secs(20),
                    &CancellationToken::new(),
                )
                .await;
            (popped, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pushed = Instant::now();
    bus.push_request(&user, "r1").await.expect("push");
    let (popped, at) = tokio::time::timeout(PROMPT, pop)
        .await
        .expect("the push wakes the pop")
        .expect("pop task");
    assert_eq!(popped, Ok(request("r1")));
    assert!(at.duration_since(pushed) < PROMPT);
    assert_eq!(
        bus.list_len(&keys::user_requests(&user))
            .await
            .expect("llen"),
        0
    );
    assert_eq!(
        bus.list_items(&keys::user_processing(&user))
            .await
            .expect("lrange"),
        ["r1"]
    );

    // A control message wakes a blocked pop as promptly, and comes first.
    let pop = {
        let (bus, user) = (bus.clone(), user.clone());
        tokio::spawn(async move {
            assert!(
                answer(
                    bus.as_ref(),
                    &user,
                    "r1",
                    &unique_name("r"),
                    AnswerMode::Final
                )
                .await
            );
            bus.pop_user_message(
                &user,
                MAX_BYTES,
                Duration::from_secs(20),
                &CancellationToken::new(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    bus.push_control(&user, "k1").await.expect("push");
    let popped = tokio::time::timeout(PROMPT, pop)
        .await
        .expect("the control push wakes the pop")
        .expect("pop task");
    assert_eq!(popped, Ok(control("k1")));
    assert_eq!(
        bus.list_items(&keys::worker_control_processing(&user))
            .await
            .expect("lrange"),
        ["k1"],
        "the blocking wait moves it too"
    );
    assert_eq!(
        bus.list_len(&keys::user_processing(&user))
            .await
            .expect("llen"),
        0,
        "the request wait took nothing"
    );
}

/// An interrupt ends a blocked pop at once and takes nothing; an interrupt
/// that is already set still returns a queued message but never waits.
pub async fn interrupt_ends_a_blocked_pop(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let interrupt = CancellationToken::new();
    let pop = {
        let (bus, user, interrupt) = (bus.clone(), user.clone(), interrupt.clone());
        tokio::spawn(async move {
            bus.pop_user_message(&user, MAX_BYTES, Duration::from_secs(30), &interrupt)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    interrupt.cancel();
    let popped = tokio::time::timeout(PROMPT, pop)
        .await
        .expect("the interrupt ends the pop")
        .expect("pop task");
    assert_eq!(popped, Ok(None));
    bus.push_request(&user, "r1").await.expect("push");
    assert_eq!(
        bus.list_len(&keys::user_requests(&user))
            .await
            .expect("llen"),
        1,
        "the interrupted pop took nothing"
    );

    let started = Instant::now();
    assert_eq!(
        bus.pop_user_message(&user, MAX_BYTES, Duration::from_secs(30), &interrupt)
            .await
            .expect("pop"),
        request("r1"),
        "a queued message is still handed out"
    );
    assert!(
        answer(
            bus.as_ref(),
            &user,
            "r1",
            &unique_name("r"),
            AnswerMode::Final
        )
        .await
    );
    assert_eq!(
        bus.pop_user_message(&user, MAX_BYTES, Duration::from_secs(30), &interrupt)
            .await
            .expect("pop"),
        None
    );
    assert!(started.elapsed() < PROMPT, "an interrupted pop never waits");
}

/// A request's record: `executing` once begun (whoever asks next is told so,
/// nothing changes), `done` with the response once answered (24 h); the
/// response key is written with it (60 s) and the processing entry removed
/// in the same step; a replay rewrites the stored response; a first-only
/// answer never overwrites an existing record.
pub async fn request_records_keep_one_final_response(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let id = unique_name("r");
    let record_key = keys::request_record(&user, &id);
    hold(bus.as_ref(), &user, "w1").await;
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 5).await.expect("begin"),
        Begun::Started
    );
    let stored = bus.hash_get_all(&record_key).await.expect("hgetall");
    assert_eq!(
        stored.get(record::STATE).map(String::as_str),
        Some(record::EXECUTING)
    );
    assert_eq!(stored.get(record::USER_ID), Some(&user));
    assert_eq!(
        stored.get(record::WORKER_ID).map(String::as_str),
        Some("w1")
    );
    assert_eq!(
        stored.get(record::STARTED_AT).map(String::as_str),
        Some("5")
    );
    assert_eq!(
        stored.get(record::DELIVERIES).map(String::as_str),
        Some("1")
    );
    let ttl = bus.ttl_ms(&record_key).await.expect("pttl");
    assert!(
        matches!(ttl, Some(86_300_000..=86_400_000)),
        "record TTL {ttl:?}"
    );
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 6).await.expect("begin"),
        Begun::Executing {
            user_id: user.clone(),
            worker_id: "w1".into(),
            deliveries: 1,
        },
        "the same worker beginning again changes nothing"
    );

    bus.push_request(&user, "body-1").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("body-1"));
    let response = format!(r#"{{"request_id":"{id}","status":"ok"}}"#);
    assert!(answer(bus.as_ref(), &user, "body-1", &id, AnswerMode::Final).await);
    assert_eq!(
        bus.get(&keys::response(&user, &id)).await.expect("get"),
        Some(response.clone())
    );
    let ttl = bus.ttl_ms(&keys::response(&user, &id)).await.expect("pttl");
    assert!(matches!(ttl, Some(59_000..=60_000)), "response TTL {ttl:?}");
    let stored = bus.hash_get_all(&record_key).await.expect("hgetall");
    assert_eq!(
        stored.get(record::STATE).map(String::as_str),
        Some(record::DONE)
    );
    assert_eq!(stored.get(record::RESPONSE), Some(&response));
    assert_eq!(
        bus.list_len(&keys::user_processing(&user))
            .await
            .expect("llen"),
        0
    );
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 7).await.expect("begin"),
        Begun::Done {
            user_id: user.clone(),
            response: response.clone()
        }
    );
    assert!(
        answer(bus.as_ref(), &user, "body-1", &id, AnswerMode::Final).await,
        "a final answer repeated after a lost reply is already stored"
    );

    // A repeated id: its stored response is written again.
    bus.delete_keys(&[keys::response(&user, &id)])
        .await
        .expect("del");
    bus.push_request(&user, "body-1").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("body-1"));
    assert!(answer(bus.as_ref(), &user, "body-1", &id, AnswerMode::Replay).await);
    assert_eq!(
        bus.get(&keys::response(&user, &id)).await.expect("get"),
        Some(response.clone())
    );

    // An invalid message reusing the id is dead-lettered, never answered.
    bus.push_request(&user, "bad-1").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("bad-1"));
    let answered = bus
        .answer_request(&Answer {
            user_id: &user,
            worker_id: "w1",
            raw: b"bad-1",
            request_id: &id,
            response: r#"{"status":"error"}"#,
            mode: AnswerMode::FirstOnly,
            dead_letter: Some(("invalid request: boom", 9)),
        })
        .await
        .expect("first only");
    assert_eq!(answered, Answered::Kept);
    assert_eq!(
        bus.get(&keys::response(&user, &id)).await.expect("get"),
        Some(response.clone())
    );
    assert_eq!(
        bus.hash_get_all(&record_key)
            .await
            .expect("hgetall")
            .get(record::RESPONSE),
        Some(&response)
    );
    let dead = bus
        .list_items(&keys::dead_letter(&keys::user_requests(&user)))
        .await
        .expect("lrange");
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].contains("boom") && dead[0].contains("bad-1"),
        "{dead:?}"
    );
    assert_eq!(
        pop_user(bus.as_ref(), &user).await,
        None,
        "processing is empty"
    );

    // First-only on a fresh id answers and records it, as this user's.
    let fresh = unique_name("r");
    bus.push_request(&user, "bad-2").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("bad-2"));
    assert!(answer(bus.as_ref(), &user, "bad-2", &fresh, AnswerMode::FirstOnly).await);
    assert_eq!(
        bus.begin_request(&fresh, &user, "w1", 8)
            .await
            .expect("begin"),
        Begun::Done {
            user_id: user.clone(),
            response: format!(r#"{{"request_id":"{fresh}","status":"ok"}}"#),
        }
    );
}

/// Only the worker holding the user's mark begins a request; a successor
/// takes an `executing` record over and counts a delivery; another user's
/// request under the same id is a record of its own.
pub async fn only_the_mark_holder_begins_a_request(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let id = unique_name("r");
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 1).await.expect("begin"),
        Begun::NotHolder,
        "no mark: no one holds the user"
    );
    assert!(
        bus.hash_get_all(&keys::request_record(&user, &id))
            .await
            .expect("hgetall")
            .is_empty(),
        "nothing written"
    );
    hold(bus.as_ref(), &user, "w1").await;
    assert_eq!(
        bus.begin_request(&id, &user, "w2", 1).await.expect("begin"),
        Begun::NotHolder
    );
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 1).await.expect("begin"),
        Begun::Started
    );
    // w1 is displaced; w2 holds the user now.
    bus.release_user_mark(&user, "w1").await.expect("release");
    hold(bus.as_ref(), &user, "w2").await;
    assert_eq!(
        bus.begin_request(&id, &user, "w2", 2).await.expect("begin"),
        Begun::Executing {
            user_id: user.clone(),
            worker_id: "w1".into(),
            deliveries: 2,
        }
    );
    let stored = bus
        .hash_get_all(&keys::request_record(&user, &id))
        .await
        .expect("hgetall");
    assert_eq!(
        stored.get(record::WORKER_ID).map(String::as_str),
        Some("w2")
    );
    assert_eq!(
        stored.get(record::DELIVERIES).map(String::as_str),
        Some("2")
    );
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 3).await.expect("begin"),
        Begun::NotHolder,
        "the displaced worker cannot take it back"
    );

    // Another user's request under the same id is another record (records
    // are keyed by user): it starts afresh and changes nothing of the first.
    let other = unique_name("u");
    hold(bus.as_ref(), &other, "w9").await;
    assert_eq!(
        bus.begin_request(&id, &other, "w9", 4)
            .await
            .expect("begin"),
        Begun::Started
    );
    let unchanged = bus
        .hash_get_all(&keys::request_record(&user, &id))
        .await
        .expect("hgetall");
    assert_eq!(unchanged, stored);
}

/// The claim's mark rule ([`take_mark`](leasehold_pool::bus::assign::take_mark))
/// over its whole domain on the bus: for a user with no mark, a mark naming
/// the claimer, another worker's mark and a value that is not a mark, the
/// exclusive claim succeeds exactly when the rule lets it, writes the
/// claimer's mark only where there was none, and leaves every other mark as
/// it was.
pub async fn user_marks_are_taken_as_take_mark_says(target: &dyn BusTarget) {
    use leasehold_pool::bus::assign::{MarkSeen, MarkTake, take_mark};
    let bus = target.bus();
    let long = Duration::from_secs(600);
    let mut outcomes = std::collections::BTreeSet::new();
    for stored in [None, Some("w1"), Some("w2"), Some("not a mark")] {
        let user = unique_name("u");
        let writer = Writer::new(&user, "w1");
        let value = stored.map(|holder| match holder {
            "not a mark" => holder.to_owned(),
            worker => mark_value(&user, worker, 1),
        });
        if let Some(value) = &value {
            assert!(
                bus.set_if_absent(&keys::worker_active(&user), value, long)
                    .await
                    .unwrap()
            );
        }
        let rule = take_mark(&MarkSeen::of(value.as_deref()), "w1");
        let claimed = claim(bus.as_ref(), &writer).await;
        let after = stored_mark(bus.as_ref(), &user).await;
        let what = format!("stored {stored:?}");
        match rule {
            MarkTake::Set => {
                assert!(claimed, "{what}");
                assert_eq!(after.as_deref(), Some(writer.value.as_str()), "{what}");
            }
            MarkTake::AlreadyMine => {
                assert!(claimed, "{what}");
                assert_eq!(after, value, "{what}: a sealer's mark is left as it is");
            }
            MarkTake::Refuse => {
                assert!(!claimed, "{what}");
                assert_eq!(after, value, "{what}");
            }
        }
        outcomes.insert(format!("{rule:?}"));
    }
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
}

/// The begin and answer steps over their whole input domain
/// ([`leasehold_pool::bus::begin::domain`]: every record state × whose record
/// × which worker began it × the user's mark × the asking worker): the bus
/// reports what [`begin_rule`](leasehold_pool::bus::begin::begin_rule)
/// decides and writes exactly what it says (created, taken over, or
/// untouched); a final answer is stored exactly when
/// [`final_answer_rule`](leasehold_pool::bus::answer::final_answer_rule)
/// says so, and a fenced one writes nothing and leaves its entry in
/// processing.
pub async fn requests_begin_and_answer_as_their_rules_say(target: &dyn BusTarget) {
    use leasehold_pool::bus::answer::{FinalVerdict, final_answer_rule};
    use leasehold_pool::bus::begin::{BeginWrite, RecordView, begin_rule, domain};
    use leasehold_pool::bus::{Answer, AnswerMode, Answered};
    let bus = target.bus();
    let long = Duration::from_secs(600);
    let cases = domain::records("u", "o").len() * domain::marks("u").len();
    let mut begins = std::collections::BTreeMap::<String, usize>::new();
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    for case in 0..cases {
        for asker in domain::WORKERS {
            for step in ["begin", "answer"] {
                let user = unique_name("u");
                let other = unique_name("o");
                let id = unique_name("r");
                let records = domain::records(&user, &other);
                let marks = domain::marks(&user);
                let stored = records[case / marks.len()].clone();
                let mark = marks[case % marks.len()].clone();
                let key = keys::request_record(&user, &id);
                if let Some(fields) = &stored {
                    target.write_hash(&key, fields).await;
                }
                if let Some(mark) = &mark {
                    assert!(
                        bus.set_if_absent(&keys::worker_active(&user), mark, long)
                            .await
                            .unwrap()
                    );
                }
                let field = |name: &str| {
                    stored.as_ref().and_then(|fields| {
                        fields
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, v)| v.clone())
                    })
                };
                let (state, owner, began, deliveries) = (
                    field(record::STATE),
                    field(record::USER_ID).unwrap_or_default(),
                    field(record::WORKER_ID).unwrap_or_default(),
                    field(record::DELIVERIES).map_or(1, |d| d.parse().unwrap()),
                );
                let view = state.as_deref().map(|state| RecordView {
                    state,
                    user_id: &owner,
                    worker_id: &began,
                    deliveries,
                });
                let holder = mark.as_deref().and_then(|mark| {
                    serde_json::from_str::<serde_json::Value>(mark)
                        .ok()
                        .and_then(|m| {
                            m.get("worker_id")
                                .and_then(|w| w.as_str())
                                .map(str::to_owned)
                        })
                });
                let what = format!("{step} by {asker}: record {stored:?}, mark {mark:?}");
                let before = bus.hash_get_all(&key).await.unwrap();
                if step == "begin" {
                    let (expected, write) = begin_rule(view, holder.as_deref(), &user, asker);
                    let begun = bus.begin_request(&id, &user, asker, 7).await.unwrap();
                    let expected = match expected {
                        Begun::Done { user_id, .. } => Begun::Done {
                            user_id,
                            response: field(record::RESPONSE).unwrap_or_default(),
                        },
                        other => other,
                    };
                    assert_eq!(begun, expected, "{what}");
                    *begins.entry(format!("{write:?}")).or_default() += 1;
                    let after = bus.hash_get_all(&key).await.unwrap();
                    let get = |name: &str| after.get(name).map(String::as_str);
                    match write {
                        BeginWrite::Nothing => assert_eq!(after, before, "{what}"),
                        BeginWrite::Create => {
                            assert_eq!(get(record::STATE), Some(record::EXECUTING), "{what}");
                            assert_eq!(get(record::USER_ID), Some(user.as_str()), "{what}");
                            assert_eq!(get(record::WORKER_ID), Some(asker), "{what}");
                            assert_eq!(get(record::DELIVERIES), Some("1"), "{what}");
                            assert_eq!(get(record::STARTED_AT), Some("7"), "{what}");
                        }
                        BeginWrite::TakeOver => {
                            let mut expected = before.clone();
                            expected.insert(record::WORKER_ID.into(), asker.into());
                            expected
                                .insert(record::DELIVERIES.into(), (deliveries + 1).to_string());
                            assert_eq!(after, expected, "{what}");
                        }
                    }
                } else {
                    let verdict = final_answer_rule(view, holder.as_deref(), asker);
                    bus.push_request(&user, "order").await.unwrap();
                    let Some(UserMessage::Request(raw)) = pop_user(bus.as_ref(), &user).await
                    else {
                        panic!("{what}: no request to answer");
                    };
                    let answered = bus
                        .answer_request(&Answer {
                            request_id: &id,
                            user_id: &user,
                            worker_id: asker,
                            raw: &raw,
                            response: "final",
                            mode: AnswerMode::Final,
                            dead_letter: None,
                        })
                        .await
                        .unwrap();
                    *answers.entry(format!("{verdict:?}")).or_default() += 1;
                    let after = bus.hash_get_all(&key).await.unwrap();
                    let response = bus.get(&keys::response(&user, &id)).await.unwrap();
                    let processing = bus.list_len(&keys::user_processing(&user)).await.unwrap();
                    match verdict {
                        FinalVerdict::Store => {
                            assert_eq!(answered, Answered::Stored, "{what}");
                            let mut expected = before.clone();
                            expected.insert(record::STATE.into(), record::DONE.into());
                            expected.insert(record::RESPONSE.into(), "final".into());
                            assert_eq!(after, expected, "{what}");
                            assert_eq!(response.as_deref(), Some("final"), "{what}");
                            assert_eq!(processing, 0, "{what}");
                        }
                        FinalVerdict::AlreadyStored => {
                            // A retry whose first reply was lost: that first
                            // step stored and removed; this one does nothing
                            // at all (an entry left is replayed from the record).
                            assert_eq!(answered, Answered::Stored, "{what}");
                            assert_eq!(after, before, "{what}");
                            assert_eq!(response, None, "{what}");
                            assert_eq!(processing, 1, "{what}");
                        }
                        FinalVerdict::Fenced => {
                            assert_eq!(answered, Answered::Fenced, "{what}");
                            assert_eq!(after, before, "{what}");
                            assert_eq!(response, None, "{what}");
                            assert_eq!(processing, 1, "{what}: the entry stays for the holder");
                        }
                    }
                }
            }
        }
    }
    // The domain reaches every outcome of both rules.
    assert_eq!(begins.len(), 3, "{begins:?}");
    assert_eq!(answers.len(), 3, "{answers:?}");
}

/// A final answer is stored only by the worker that holds the user's mark
/// and began (or took over) the request: a displaced worker's late answer
/// writes nothing and leaves the entry in processing.
pub async fn a_displaced_workers_final_answer_is_fenced(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let id = unique_name("r");
    hold(bus.as_ref(), &user, "w1").await;
    bus.push_request(&user, "order").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("order"));
    assert_eq!(
        bus.begin_request(&id, &user, "w1", 1).await.expect("begin"),
        Begun::Started
    );
    let final_answer = |worker: &'static str, body: &'static str| Answer {
        user_id: &user,
        worker_id: worker,
        raw: b"order",
        request_id: &id,
        response: body,
        mode: AnswerMode::Final,
        dead_letter: None,
    };
    // w1 is cut off; its mark expires and w2 serves the user.
    bus.release_user_mark(&user, "w1").await.expect("release");
    assert_eq!(
        bus.answer_request(&final_answer("w1", "late"))
            .await
            .expect("answer"),
        Answered::Fenced,
        "no mark: the answer is refused"
    );
    hold(bus.as_ref(), &user, "w2").await;
    assert!(matches!(
        bus.begin_request(&id, &user, "w2", 2).await.expect("begin"),
        Begun::Executing { .. }
    ));
    assert_eq!(
        bus.answer_request(&final_answer("w1", "late"))
            .await
            .expect("answer"),
        Answered::Fenced,
        "another worker's mark: refused"
    );
    assert_eq!(
        bus.list_items(&keys::user_processing(&user))
            .await
            .expect("lrange"),
        ["order"],
        "a fenced answer leaves the entry for the holder"
    );
    assert_eq!(
        bus.answer_request(&final_answer("w2", "successor"))
            .await
            .expect("answer"),
        Answered::Stored
    );
    // w2 exits; w1 comes back and takes the absent mark again.
    bus.release_user_mark(&user, "w2").await.expect("release");
    hold(bus.as_ref(), &user, "w1").await;
    assert_eq!(
        bus.answer_request(&final_answer("w1", "late"))
            .await
            .expect("answer"),
        Answered::Fenced,
        "the record is the successor's: refused even to the holder"
    );
    assert_eq!(
        bus.get(&keys::response(&user, &id))
            .await
            .expect("get")
            .as_deref(),
        Some("successor")
    );
    assert_eq!(
        bus.hash_get_all(&keys::request_record(&user, &id))
            .await
            .expect("hgetall")
            .get(record::RESPONSE)
            .map(String::as_str),
        Some("successor")
    );
    assert_eq!(
        bus.list_len(&keys::user_processing(&user))
            .await
            .expect("llen"),
        0
    );
}

/// A message over the size bound is handed out as its head and length only,
/// and ends by [`PoolBus::drop_oversized`]: out of processing only while it
/// is still the tail, dead-lettered truncated with its length, a request
/// with an id answered once (and recorded as its user's).
pub async fn oversized_messages_are_ended_from_their_head(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let id = unique_name("r");
    let big = format!(
        r#"{{"request_id": "{id}", "padding": "{}"}}"#,
        "x".repeat(protocol::DEAD_LETTER_HEAD_BYTES * 2)
    );
    bus.push_request(&user, &big).await.expect("push");
    let popped = bus
        .pop_user_message(
            &user,
            1_000,
            Duration::from_secs(1),
            &CancellationToken::new(),
        )
        .await
        .expect("pop");
    let Some(UserMessage::Oversized {
        kind: MessageKind::Request,
        head,
        length,
    }) = popped
    else {
        panic!("not handed out as oversized: {popped:?}");
    };
    assert_eq!(head.len(), protocol::DEAD_LETTER_HEAD_BYTES);
    assert_eq!(length, big.len() as u64);
    assert!(big.as_bytes().starts_with(&head));
    let response = format!(r#"{{"request_id":"{id}","status":"error"}}"#);
    let mut oversized = Oversized {
        user_id: &user,
        head: &head,
        length,
        kind: MessageKind::Request,
        answer: Some((&id, &response)),
        at_unix_ms: 9,
    };
    let wrong_length = Oversized {
        length: length + 1,
        ..oversized
    };
    assert!(
        !bus.drop_oversized(&wrong_length).await.expect("drop"),
        "not the tail it names: nothing written"
    );
    assert!(bus.drop_oversized(&oversized).await.expect("drop"));
    assert_eq!(
        bus.list_len(&keys::user_processing(&user))
            .await
            .expect("llen"),
        0
    );
    assert_eq!(
        bus.get(&keys::response(&user, &id)).await.expect("get"),
        Some(response.clone())
    );
    assert_eq!(
        bus.hash_get_all(&keys::request_record(&user, &id))
            .await
            .expect("hgetall")
            .get(record::USER_ID),
        Some(&user)
    );
    let dead = bus
        .list_items(&keys::dead_letter(&keys::user_requests(&user)))
        .await
        .expect("lrange");
    assert_eq!(dead.len(), 1);
    let letter: serde_json::Value = serde_json::from_str(&dead[0]).expect("json");
    assert_eq!(letter["reason"], "too_large");
    assert_eq!(letter["length"], big.len() as u64);
    assert_eq!(letter["truncated"], true);
    assert!(
        dead[0].len() < protocol::DEAD_LETTER_HEAD_BYTES * 2,
        "kept truncated"
    );
    assert!(
        !bus.drop_oversized(&oversized).await.expect("drop"),
        "a second drop finds nothing"
    );

    // A control message over the bound: its head dead-lettered, out of processing.
    bus.push_control(&user, &big).await.expect("push");
    let Some(UserMessage::Oversized {
        kind: MessageKind::Control,
        head,
        length,
    }) = bus
        .pop_user_message(
            &user,
            1_000,
            Duration::from_secs(1),
            &CancellationToken::new(),
        )
        .await
        .expect("pop")
    else {
        panic!("control not handed out as oversized");
    };
    oversized = Oversized {
        head: &head,
        length,
        kind: MessageKind::Control,
        answer: None,
        ..oversized
    };
    assert!(bus.drop_oversized(&oversized).await.expect("drop"));
    assert_eq!(
        bus.list_len(&keys::dead_letter(&keys::worker_control(&user)))
            .await
            .expect("llen"),
        1
    );
    assert_eq!(
        bus.list_len(&keys::worker_control_processing(&user))
            .await
            .expect("llen"),
        0,
        "out of control processing"
    );
    // Within the bound, the same pop hands the body out whole.
    bus.push_request(&user, "small").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("small"));
}

/// A request that cannot be answered is dead-lettered and leaves processing
/// in one step; only the matching entry (the oldest equal one) is removed.
pub async fn dropped_requests_are_dead_lettered(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    bus.push_request(&user, "{nope").await.expect("push");
    bus.push_request(&user, "later").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("{nope"));
    bus.drop_request(&user, b"{nope", "invalid request: not valid JSON", 3)
        .await
        .expect("drop");
    let dead: Vec<serde_json::Value> = bus
        .list_items(&keys::dead_letter(&keys::user_requests(&user)))
        .await
        .expect("lrange")
        .iter()
        .map(|entry| serde_json::from_str(entry).expect("JSON"))
        .collect();
    assert_eq!(
        dead,
        [
            serde_json::json!({"reason": "invalid request: not valid JSON", "message": "{nope", "at": 3})
        ]
    );
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("later"));
}

/// The paper ledger: increasing broker order ids per account, a repeated
/// client order id refused with the stored order, lookups by client order id.
pub async fn paper_ledger_refuses_repeated_client_order_ids(target: &dyn BusTarget) {
    let bus = target.bus();
    let (account, other) = (unique_name("A"), unique_name("A"));
    let order = |symbol: &str| {
        serde_json::json!({"client_order_id": "x", "symbol": symbol, "quantity": 1.5})
            .as_object()
            .cloned()
            .expect("object")
    };
    let first = bus
        .record_paper_order(&account, "c1", &order("2330"))
        .await
        .expect("record");
    let expected = r#"{"broker_order_id":1,"client_order_id":"x","quantity":1.5,"symbol":"2330"}"#;
    assert_eq!(first, LedgerWrite::Recorded(expected.to_owned()));
    assert_eq!(
        bus.record_paper_order(&account, "c1", &order("0050"))
            .await
            .expect("record"),
        LedgerWrite::Exists(expected.to_owned()),
        "a repeated client order id is refused and nothing changes"
    );
    let LedgerWrite::Recorded(second) = bus
        .record_paper_order(&account, "c2", &order("0050"))
        .await
        .expect("record")
    else {
        panic!("c2 is new");
    };
    assert!(second.starts_with(r#"{"broker_order_id":2,"#), "{second}");
    let LedgerWrite::Recorded(elsewhere) = bus
        .record_paper_order(&other, "c1", &order("2330"))
        .await
        .expect("record")
    else {
        panic!("another account has its own ids");
    };
    assert!(
        elsewhere.starts_with(r#"{"broker_order_id":1,"#),
        "{elsewhere}"
    );
    assert_eq!(
        bus.paper_order(&account, "c1").await.expect("lookup"),
        Some(expected.to_owned())
    );
    assert_eq!(bus.paper_order(&account, "c3").await.expect("lookup"), None);
    let ledger = bus
        .hash_get_all(&keys::paper_orders(&account))
        .await
        .expect("hgetall");
    assert_eq!(ledger.len(), 2);
    assert_eq!(
        bus.get(&keys::paper_order_ids(&account))
            .await
            .expect("get")
            .as_deref(),
        Some("2")
    );
}

/// Responses are readable for 60 s; a new one replaces the old.
pub async fn responses_expire_after_a_minute(target: &dyn BusTarget) {
    let bus = target.bus();
    let request = unique_name("r");
    let user = unique_name("u");
    let key = keys::response(&user, &request);
    bus.put_response(&user, &request, r#"{"status":"error"}"#)
        .await
        .expect("set");
    bus.put_response(&user, &request, r#"{"status":"ok"}"#)
        .await
        .expect("set");
    assert_eq!(
        bus.get(&key).await.expect("get").as_deref(),
        Some(r#"{"status":"ok"}"#)
    );
    let ttl = bus.ttl_ms(&key).await.expect("pttl");
    assert!(matches!(ttl, Some(59_000..=60_000)), "response TTL {ttl:?}");
}

/// Dead letters keep the reason, the original text and the time, oldest first.
pub async fn dead_letters_keep_the_reason(target: &dyn BusTarget) {
    let bus = target.bus();
    let list = keys::user_requests(&unique_name("u"));
    bus.dead_letter(&list, "invalid request: not valid JSON", "{nope", 11)
        .await
        .expect("dead letter");
    bus.dead_letter(&list, "second", "][", 12)
        .await
        .expect("dead letter");
    let dead: Vec<serde_json::Value> = bus
        .list_items(&keys::dead_letter(&list))
        .await
        .expect("lrange")
        .iter()
        .map(|entry| serde_json::from_str(entry).expect("dead letters are JSON"))
        .collect();
    assert_eq!(
        dead,
        [
            serde_json::json!({"reason": "invalid request: not valid JSON", "message": "{nope", "at": 11}),
            serde_json::json!({"reason": "second", "message": "][", "at": 12}),
        ]
    );
    assert_eq!(
        bus.list_len(&list).await.expect("llen"),
        0,
        "only the dead list is written"
    );
}

/// Every push to a dead-letter list keeps the newest `DEAD_LETTER_MAX`
/// entries and refreshes its 7-day TTL: the plain push, and the request
/// steps that dead-letter (answer, drop).
pub async fn dead_letter_lists_are_capped_and_expire(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let list = keys::worker_control(&user);
    let dead = keys::dead_letter(&list);
    let pushes = DEAD_LETTER_MAX + 3;
    for at in 0..pushes {
        bus.dead_letter(&list, "invalid control message", "{", at)
            .await
            .expect("dead letter");
    }
    assert_eq!(bus.list_len(&dead).await.expect("llen"), DEAD_LETTER_MAX);
    let kept = bus.list_items(&dead).await.expect("lrange");
    let at =
        |entry: &str| serde_json::from_str::<serde_json::Value>(entry).expect("JSON")["at"].clone();
    assert_eq!(at(&kept[0]), 3, "the oldest entries are trimmed");
    assert_eq!(at(&kept[kept.len() - 1]), pushes - 1, "the newest is kept");
    let week_ms = i64::try_from(DEAD_LETTER_TTL.as_millis()).expect("ms");
    let ttl = bus.ttl_ms(&dead).await.expect("pttl").expect("exists");
    assert!(
        (week_ms - 5_000..=week_ms).contains(&ttl),
        "dead list TTL {ttl}"
    );

    // The request steps' dead letters get the same TTL.
    let requests_dead = keys::dead_letter(&keys::user_requests(&user));
    bus.push_request(&user, "{nope").await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request("{nope"));
    bus.drop_request(&user, b"{nope", "invalid request: not valid JSON", 1)
        .await
        .expect("drop");
    let ttl = bus
        .ttl_ms(&requests_dead)
        .await
        .expect("pttl")
        .expect("exists");
    assert!((week_ms - 5_000..=week_ms).contains(&ttl), "drop TTL {ttl}");
    bus.delete_keys(std::slice::from_ref(&requests_dead))
        .await
        .expect("del");
    let raw = r#"{"request_id": "bad"}"#;
    bus.push_request(&user, raw).await.expect("push");
    assert_eq!(pop_user(bus.as_ref(), &user).await, request(raw));
    let request_id = unique_name("r");
    bus.answer_request(&Answer {
        user_id: &user,
        worker_id: ANSWERING,
        raw: raw.as_bytes(),
        request_id: &request_id,
        response: "{}",
        mode: AnswerMode::FirstOnly,
        dead_letter: Some(("invalid request", 2)),
    })
    .await
    .expect("answer");
    assert_eq!(bus.list_len(&requests_dead).await.expect("llen"), 1);
    let ttl = bus
        .ttl_ms(&requests_dead)
        .await
        .expect("pttl")
        .expect("exists");
    assert!(
        (week_ms - 5_000..=week_ms).contains(&ttl),
        "answer TTL {ttl}"
    );
}

/// Over the cap, the newest queued requests are read newest first and each
/// answered in one step that takes it out of the queue; a request whose id
/// has a record is left for the worker, which answers repeats from it.
pub async fn over_cap_requests_are_shed_newest_first(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let requests = keys::user_requests(&user);
    let ids: Vec<String> = (1..=5).map(|i| unique_name(&format!("r{i}"))).collect();
    for id in &ids {
        bus.push_request(&user, id).await.expect("push");
    }
    assert!(
        bus.excess_requests(&user, 5)
            .await
            .expect("excess")
            .is_empty()
    );
    let excess = bus.excess_requests(&user, 3).await.expect("excess");
    assert_eq!(
        excess,
        [ids[4].as_bytes().to_vec(), ids[3].as_bytes().to_vec()],
        "newest first, only those beyond the oldest three"
    );
    fn shed<'a>(user: &'a str, id: &'a str) -> Shed<'a> {
        Shed {
            user_id: user,
            raw: id.as_bytes(),
            request_id: id,
            response: r#"{"status":"error","error_code":"overloaded"}"#,
        }
    }
    assert!(bus.shed_request(&shed(&user, &ids[4])).await.expect("shed"));
    assert_eq!(
        bus.get(&keys::response(&user, &ids[4]))
            .await
            .expect("get")
            .as_deref(),
        Some(r#"{"status":"error","error_code":"overloaded"}"#)
    );
    let record = bus
        .hash_get_all(&keys::request_record(&user, &ids[4]))
        .await
        .expect("hgetall");
    assert_eq!(
        record.get(record::STATE).map(String::as_str),
        Some(record::DONE)
    );
    assert!(
        !bus.shed_request(&shed(&user, &ids[4])).await.expect("shed"),
        "no longer queued"
    );
    // An id with a record is answered from it by the worker, never shed.
    hold(bus.as_ref(), &user, "w").await;
    assert!(matches!(
        bus.begin_request(&ids[3], &user, "w", 1)
            .await
            .expect("begin"),
        Begun::Started
    ));
    assert!(!bus.shed_request(&shed(&user, &ids[3])).await.expect("shed"));
    assert_eq!(
        bus.list_items(&requests).await.expect("lrange"),
        [&ids[3], &ids[2], &ids[1], &ids[0]].map(String::clone),
        "only the shed request left the queue"
    );
    assert_eq!(
        bus.excess_requests(&unique_name("u"), 0)
            .await
            .expect("excess"),
        Vec::<Vec<u8>>::new()
    );
    let many = unique_name("u");
    for i in 0..(SHED_BATCH + 20) {
        bus.push_request(&many, &format!("m{i}"))
            .await
            .expect("push");
    }
    let batch = bus.excess_requests(&many, 1).await.expect("excess");
    assert_eq!(
        batch.len() as u64,
        SHED_BATCH,
        "one call reads a bounded batch"
    );
    assert_eq!(batch[0], format!("m{}", SHED_BATCH + 19).into_bytes());
}

/// SCAN-style matching: every matching key (across many SCAN pages), no other.
pub async fn scan_matches_patterns(target: &dyn BusTarget) {
    let bus = target.bus();
    let prefix = unique_name("scan");
    for i in 0..600 {
        bus.put_credentials(&format!("{prefix}-{i}"), "blob")
            .await
            .expect("set");
    }
    let all = bus
        .scan_keys(&keys::credentials(&format!("{prefix}-*")))
        .await
        .expect("scan");
    let mut expected: Vec<String> = (0..600)
        .map(|i| keys::credentials(&format!("{prefix}-{i}")))
        .collect();
    expected.sort();
    assert_eq!(all, expected);
    let teens = bus
        .scan_keys(&keys::credentials(&format!("{prefix}-1?")))
        .await
        .expect("scan");
    assert_eq!(teens.len(), 10, "{teens:?}");

    let pool_worker = unique_name("w-scan");
    let pool_key = keys::pool_worker_active(&pool_worker);
    bus.set_pool_mark(&pool_worker, "pool-mark", Duration::from_secs(30))
        .await
        .expect("pool mark");
    let writer = Writer::new(&unique_name("u-scan"), &unique_name("w"));
    assert!(claim(bus.as_ref(), &writer).await);
    let user_key = keys::worker_active(&writer.user_id);
    let pool = bus
        .scan_keys(keys::POOL_WORKER_ACTIVE_PATTERN)
        .await
        .expect("scan");
    assert!(pool.contains(&pool_key) && !pool.contains(&user_key));
    let every = bus
        .scan_keys(keys::WORKER_ACTIVE_PATTERN)
        .await
        .expect("scan");
    assert!(every.contains(&pool_key) && every.contains(&user_key));
    assert!(
        every
            .iter()
            .all(|key| key.starts_with(keys::WORKER_ACTIVE_PREFIX))
    );

    let marks = bus.marks(keys::WORKER_ACTIVE_PATTERN).await.expect("marks");
    let pool_mark = marks
        .iter()
        .find(|mark| mark.key == pool_key)
        .expect("pool mark listed");
    assert_eq!(pool_mark.value, "pool-mark");
    assert!(matches!(pool_mark.ttl_ms, Some(1..=30_000)));
    let user_mark = marks
        .iter()
        .find(|mark| mark.key == user_key)
        .expect("user mark listed");
    assert_eq!(user_mark.value, writer.value);
    assert!(
        marks
            .iter()
            .all(|mark| mark.key.starts_with(keys::WORKER_ACTIVE_PREFIX)),
        "metadata hashes are not marks"
    );
}

/// LLEN counts queued messages; an absent list is empty; another type is refused.
pub async fn list_len_counts_queued_messages(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let requests = keys::user_requests(&user);
    assert_eq!(bus.list_len(&requests).await.expect("llen"), 0);
    for request in ["r1", "r2", "r3"] {
        bus.push_request(&user, request).await.expect("push");
    }
    assert_eq!(bus.list_len(&requests).await.expect("llen"), 3);
    pop_user(bus.as_ref(), &user).await;
    assert_eq!(bus.list_len(&requests).await.expect("llen"), 2);
    bus.put_credentials(&user, "blob").await.expect("set");
    assert!(matches!(
        bus.list_len(&keys::credentials(&user)).await,
        Err(BusError::Rejected(_))
    ));
    assert!(matches!(
        bus.get(&requests).await,
        Err(BusError::Rejected(_))
    ));
}

/// Credentials and the maintenance report are stored without TTL and replaced;
/// credentials also by compare-and-set.
pub async fn credentials_and_report_round_trip(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    assert_eq!(bus.credentials(&user).await.expect("get"), None);
    bus.put_credentials(&user, "blob-1").await.expect("set");
    bus.put_credentials(&user, "blob-2").await.expect("set");
    assert_eq!(
        bus.credentials(&user).await.expect("get").as_deref(),
        Some("blob-2")
    );
    assert_eq!(
        bus.ttl_ms(&keys::credentials(&user)).await.expect("pttl"),
        Some(-1)
    );
    // Compare-and-set: a stale expectation writes nothing.
    assert!(
        !bus.replace_credentials(&user, "blob-1", "blob-3")
            .await
            .expect("cas")
    );
    assert!(
        bus.replace_credentials(&user, "blob-2", "blob-3")
            .await
            .expect("cas")
    );
    assert_eq!(
        bus.credentials(&user).await.expect("get").as_deref(),
        Some("blob-3")
    );
    let gone = unique_name("u");
    assert!(
        !bus.replace_credentials(&gone, "blob-1", "x")
            .await
            .expect("cas")
    );
    assert_eq!(bus.credentials(&gone).await.expect("get"), None);
    let report = format!(r#"{{"at": 1, "run": "{user}"}}"#);
    bus.put_maintenance_report(&report).await.expect("set");
    assert_eq!(
        bus.maintenance_report().await.expect("get"),
        Some(report.clone())
    );
    assert_eq!(
        bus.get(keys::MAINTENANCE_LAST_REPORT).await.expect("get"),
        Some(report)
    );
}

/// A grant is written with its TTL, renewed by a second grant, and read back
/// as it was written (the credential sealer reads it with `GET`).
pub async fn credentials_grants_carry_a_ttl(target: &dyn BusTarget) {
    let bus = target.bus();
    let user = unique_name("u");
    let key = keys::credentials_grant(&user);
    assert_eq!(bus.get(&key).await.expect("get"), None);
    bus.grant_credentials(&user, r#"{"reason":"claim"}"#, Duration::from_secs(5))
        .await
        .expect("grant");
    let ttl = bus.ttl_ms(&key).await.expect("pttl").expect("a TTL");
    assert!((1..=5_000).contains(&ttl), "{ttl}");
    bus.grant_credentials(&user, r#"{"reason":"reload"}"#, Duration::from_secs(60))
        .await
        .expect("grant again");
    let ttl = bus.ttl_ms(&key).await.expect("pttl").expect("a TTL");
    assert!(ttl > 5_000, "the second grant renews the TTL: {ttl}");
    assert_eq!(
        bus.get(&key).await.expect("get").as_deref(),
        Some(r#"{"reason":"reload"}"#)
    );
}

/// Deletes count the keys that existed.
pub async fn delete_keys_counts_existing_keys(target: &dyn BusTarget) {
    let bus = target.bus();
    let (a, b) = (unique_name("u-a"), unique_name("u-b"));
    bus.put_credentials(&a, "x").await.expect("set");
    bus.push_request(&b, "r").await.expect("push");
    let deleted = bus
        .delete_keys(&[
            keys::credentials(&a),
            keys::user_requests(&b),
            keys::credentials(&unique_name("absent")),
        ])
        .await
        .expect("del");
    assert_eq!(deleted, 2);
    assert_eq!(bus.credentials(&a).await.expect("get"), None);
    assert_eq!(
        bus.list_len(&keys::user_requests(&b)).await.expect("llen"),
        0
    );
    assert_eq!(bus.delete_keys(&[]).await.expect("del"), 0);
    let worker = unique_name("w");
    bus.set_pool_mark(&worker, "{}", Duration::from_secs(30))
        .await
        .expect("pool mark");
    bus.delete_pool_mark(&worker).await.expect("delete");
    assert_eq!(
        bus.get(&keys::pool_worker_active(&worker))
            .await
            .expect("get"),
        None
    );
}

/// Generates one `#[tokio::test]` per pool bus check for a target.
#[macro_export]
macro_rules! pool_bus_conformance_suite {
    ($make:expr) => {
        $crate::pool_bus_conformance_suite!(@cases $make;
            claims_are_exclusive,
            heartbeat_is_refused_once_displaced,
            release_is_only_by_the_owner,
            marks_expire_with_their_ttl,
            requests_are_served_oldest_first_through_processing,
            a_backlog_is_served_in_push_order,
            claims_go_through_the_takers_processing_list,
            blocking_pop_times_out,
            blocking_pop_wakes_on_push,
            interrupt_ends_a_blocked_pop,
            request_records_keep_one_final_response,
            only_the_mark_holder_begins_a_request,
            a_displaced_workers_final_answer_is_fenced,
            requests_begin_and_answer_as_their_rules_say,
            user_marks_are_taken_as_take_mark_says,
            oversized_messages_are_ended_from_their_head,
            dropped_requests_are_dead_lettered,
            paper_ledger_refuses_repeated_client_order_ids,
            responses_expire_after_a_minute,
            dead_letters_keep_the_reason,
            dead_letter_lists_are_capped_and_expire,
            over_cap_requests_are_shed_newest_first,
            scan_matches_patterns,
            list_len_counts_queued_messages,
            credentials_and_report_round_trip,
            credentials_grants_carry_a_ttl,
            delete_keys_counts_existing_keys,
            marks_are_deleted_only_if_unchanged,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            // Several worker threads, so concurrent claims really race.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(target) = $make.await {
                    $crate::pool_bus::$case(&target).await;
                }
            }
        )*
    };
}
