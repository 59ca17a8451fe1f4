//! The pool bus: every interaction of the broker pool with its shared state
//! (liveness marks, claim / request / control queues, responses, credentials,
//! the maintenance report), behind one trait.
//!
//! Two implementations pass one conformance suite: [`redis::RedisPoolBus`]
//! (production; the Redis layout in docs/redis.md is a contract for APIs in
//! other languages, so it is spelled exactly as before) and
//! [`memory::MemoryPoolBus`] (one process, no Redis: `leasehold dev` and fast
//! tests). Key names come only from `crate::keys`.
//!
//! Roles: workers and the admin tools (claim path, pool manager, sweep,
//! `credentials put`) hold a [`PoolBus`]; readers (dashboard, observer) hold a
//! [`crate::read::PoolReader`], which cannot write or name a key.
//!
//! Queue directions are part of the contract and are fixed here, not by
//! callers: producers push claims, requests and control messages at the head
//! (Redis `LPUSH`); everything is served oldest first, from the tail, and
//! *moved* rather than popped: a claim into the pool worker's own claim
//! processing list, leaving it only in the step that settles it; a request
//! into the user's processing list (`BLMOVE … RIGHT LEFT`), leaving it only
//! with its final response; a control message into the user's control
//! processing list, leaving it once handled. No claim, request or control
//! message is lost with a worker. Control messages come before requests.
//!
//! The paper broker's ledger ([`PaperLedger`]) lives on the same bus: it is
//! what a real broker keeps on its side, and both buses must agree on it too.
//!
//! Steps (the shape of mini-redis's `cmd/`): every step that is more than one
//! command has a module of its own holding its pure rule (where it has one),
//! its Lua and both buses' sides: [`begin`], [`answer`], [`assign`],
//! `claims`, `marks`, `queue`, `credentials`, `paper_ledger`. A rule is read
//! in one place, and the conformance suite runs the rules over their whole
//! input domain on both buses.

pub mod answer;
pub mod assign;
pub mod begin;
mod claims;
mod connector;
mod credentials;
mod marks;
pub mod memory;
mod paper_ledger;
mod queue;
pub mod redis;

pub use connector::BusConnector;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// Responses stay readable this long (docs/redis.md).
pub const RESPONSE_TTL: Duration = Duration::from_secs(60);

/// A claim's outcome (`pool:claim:{claim_id}`) stays readable this long.
pub const CLAIM_OUTCOME_TTL: Duration = Duration::from_secs(60);

/// A request's record is kept this long: a repeated id within it is answered
/// with the stored response instead of running again.
pub const REQUEST_RECORD_TTL: Duration = Duration::from_secs(86_400);

/// A dead-letter list keeps at most this many entries, the newest: an API
/// that floods a worker with invalid messages must not grow Redis without
/// bound. Enough to hold a bad day's evidence for an operator.
pub const DEAD_LETTER_MAX: u64 = 10_000;

/// A dead-letter list expires this long after its last push (the TTL is
/// refreshed on every push): a week gives operators a weekend and more to
/// look, and lists nobody reads do not stay forever.
pub const DEAD_LETTER_TTL: Duration = Duration::from_secs(7 * 86_400);

/// At most this many over-cap requests are read and answered per
/// [`PoolBus::excess_requests`] call, so one call never moves a huge reply.
pub const SHED_BATCH: u64 = 100;

/// Why a bus operation failed. Messages never hold the bus URL (which may
/// carry a password) nor a message body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus could not be reached or timed out; the outcome is unknown.
    #[error("pool bus unavailable: {0}")]
    Unavailable(String),
    /// The bus refused the operation (script error, wrong type at a key).
    #[error("pool bus rejected the operation: {0}")]
    Rejected(String),
    /// The bus URL or options are invalid.
    #[error("invalid pool bus configuration: {0}")]
    Config(String),
}

/// Where a claimed worker runs, stored in `worker:metadata:{user_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerMetadata {
    /// ECS task ARN, or the local task id.
    pub task_arn: String,
    /// Host (EC2 instance id or host name).
    pub instance_id: String,
    /// Process start, unix ms.
    pub launched_at: u64,
    /// The worker's sidecar (`http://IP:PORT`), stored as `sidecar_url` so the
    /// dashboard finds it; left out when `None`.
    pub sidecar_url: Option<String>,
}

/// A worker writing a user's liveness mark (claim and heartbeat).
#[derive(Debug, Clone, Copy)]
pub struct MarkWrite<'a> {
    /// The user (`worker:active:{user_id}`).
    pub user_id: &'a str,
    /// The writing worker: owner of the mark, and of the pool mark a claim drops.
    pub worker_id: &'a str,
    /// The mark's stored value (a `MarkValue` as JSON whose `worker_id` is `worker_id`).
    pub value: &'a str,
    /// TTL of the mark and the metadata, in whole seconds (at least 1).
    pub ttl: Duration,
    /// Written to `worker:metadata:{user_id}` with the same TTL.
    pub metadata: &'a WorkerMetadata,
}

/// A message handed to a claimed worker, as bytes: Redis holds whatever the
/// API pushed, UTF-8 or not, and a body that is not must still be dead-lettered
/// rather than lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserMessage {
    /// The oldest entry of `worker:control:{user_id}:processing` (moved
    /// there from `worker:control:{user_id}:messages`), which stays there
    /// until [`PoolBus::finish_control`]: a worker that dies right after
    /// taking it leaves it for its successor.
    Control(Vec<u8>),
    /// The oldest entry of `trading:user:{user_id}:processing`, which stays
    /// there until [`PoolBus::answer_request`] or [`PoolBus::drop_request`].
    Request(Vec<u8>),
    /// A message longer than the bound the pop was given: only its head was
    /// read (a request stays in processing until
    /// [`PoolBus::drop_oversized`]; a control message is gone from its list).
    Oversized {
        /// Which list.
        kind: MessageKind,
        /// Its first bytes, at most [`crate::protocol::DEAD_LETTER_HEAD_BYTES`].
        head: Vec<u8>,
        /// Its full length.
        length: u64,
    },
}

/// A claim a pool worker took: moved into its own processing list
/// (`pool:claims:processing:{worker_id}`), where it stays until settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenClaim {
    /// The entry exactly as stored (Redis holds whatever was pushed).
    pub raw: Vec<u8>,
}

impl TakenClaim {
    /// The body as text (not UTF-8: replaced, and then it fails to parse).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

/// What [`PoolBus::take_claim`] handed a pool worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A claim, in the worker's processing list until settled.
    Claim(TakenClaim),
    /// Nothing within the timeout, or interrupted.
    Empty,
    /// The pool manager retired this worker ([`PoolBus::retire_idle`]): it
    /// takes no claim, and any claim it had moved after the retirement is
    /// back at the serving end of `pool:claims`, in the same step. The worker
    /// exits.
    Retired,
}

impl Take {
    /// The claim, if one was taken.
    pub fn claim(self) -> Option<TakenClaim> {
        match self {
            Take::Claim(claim) => Some(claim),
            Take::Empty | Take::Retired => None,
        }
    }
}

/// An idle pool worker as `pool:idle` lists it (entries whose pool mark is
/// gone are dropped by the read that finds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleEntry {
    /// The pool worker.
    pub worker_id: String,
    /// Its last heartbeat, unix ms by the pool bus's clock (Redis `TIME`).
    pub heartbeat_ms: u64,
    /// Its pool mark's value (`worker:active:-1:{worker_id}`).
    pub mark: String,
}

/// The claim step for a taken claim: the mark, and the outcome either way.
#[derive(Debug, Clone, Copy)]
pub struct ClaimSettle<'a> {
    /// The entry in the worker's claim processing list; removed in the step.
    pub raw: &'a [u8],
    /// Where the outcome goes (`pool:claim:{claim_id}`).
    pub claim_id: &'a str,
    /// Outcome JSON written when the user is marked.
    pub claimed: &'a str,
    /// Outcome JSON written when another worker holds the user.
    pub refused: &'a str,
}

/// How [`PoolBus::settle_claim`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The user is marked for this worker; outcome `claimed` written.
    Claimed,
    /// Another worker holds the user; outcome `failed` written.
    Refused,
    /// The entry is no longer in this worker's processing list: the step ran
    /// already (a lost reply) or the claim was re-queued. Nothing written; the
    /// caller reads the user's mark to know which.
    NotHeld,
}

/// What a request's record said when a worker began it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Begun {
    /// No record: it now says `executing` for this user and worker. Run it.
    Started,
    /// Already `executing`: a worker began it and its outcome is unknown (it
    /// died, or a Redis reply was lost). Resolve it at the broker, never rerun
    /// it blindly. When it was another worker's and this user's, this worker
    /// has taken it over (`worker_id` becomes this one, `deliveries` + 1).
    Executing {
        /// The user whose worker began it.
        user_id: String,
        /// The worker that began it (before any take-over).
        worker_id: String,
        /// How many workers have taken it, this one included.
        deliveries: u32,
    },
    /// Already `done`: answer with the stored response, if it is this user's.
    Done {
        /// The user whose request it was (empty in records older than this field).
        user_id: String,
        /// The stored response JSON.
        response: String,
    },
    /// This worker does not hold the user's mark: nothing was read or written.
    NotHolder,
}

/// How [`PoolBus::answer_request`] treats the request's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerMode {
    /// The worker began this request: record it `done` with the response.
    Final,
    /// Answer and record only if no record exists (an invalid message with a
    /// readable id must not overwrite the real request's response).
    FirstOnly,
    /// The record is `done` already: write its response again, record untouched.
    Replay,
}

/// How [`PoolBus::answer_request`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// The response is stored (now, or before: a lost reply) and the request
    /// left processing.
    Stored,
    /// [`AnswerMode::FirstOnly`] found a record: nothing answered (a dead
    /// letter asked for is written, the entry left processing).
    Kept,
    /// [`AnswerMode::Final`] from a worker that does not hold the user or the
    /// request ([`answer::final_answer_rule`]): nothing written,
    /// the entry stays for the holder.
    Fenced,
}

/// The final step of one request, atomic on the bus.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// Whose processing list holds the request.
    pub user_id: &'a str,
    /// The answering worker: a final answer is stored only while it holds the
    /// user's mark and the request's record.
    pub worker_id: &'a str,
    /// The processing-list entry exactly as handed out; removed.
    pub raw: &'a [u8],
    /// The request answered.
    pub request_id: &'a str,
    /// The response JSON.
    pub response: &'a str,
    /// What happens to the record.
    pub mode: AnswerMode,
    /// Also dead-letter the entry to `trading:user:{user_id}:requests:dead`
    /// with this reason and time (unix ms).
    pub dead_letter: Option<(&'a str, u64)>,
}

/// A message over the size bound, as [`PoolBus::drop_oversized`] ends it.
#[derive(Debug, Clone, Copy)]
pub struct Oversized<'a> {
    /// Whose list held it.
    pub user_id: &'a str,
    /// Its first bytes, as [`UserMessage::Oversized`] handed them out.
    pub head: &'a [u8],
    /// Its full length in bytes.
    pub length: u64,
    /// A request (in processing) or a control message (already popped).
    pub kind: MessageKind,
    /// For a request with a readable id: the id and the response JSON.
    pub answer: Option<(&'a str, &'a str)>,
    /// When (unix ms), for the dead letter.
    pub at_unix_ms: u64,
}

/// Which list a user message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// `trading:user:{user_id}:requests` (through processing).
    Request,
    /// `worker:control:{user_id}:messages`.
    Control,
}

impl MessageKind {
    /// `user_id`'s list of this kind, with its processing list: both buses
    /// read the same pair, so it is named in one place.
    pub fn queue(self, user_id: &str) -> UserQueue {
        match self {
            MessageKind::Request => UserQueue {
                list: crate::keys::user_requests(user_id),
                processing: crate::keys::user_processing(user_id),
            },
            MessageKind::Control => UserQueue {
                list: crate::keys::worker_control(user_id),
                processing: crate::keys::worker_control_processing(user_id),
            },
        }
    }
}

/// A user's list of one [`MessageKind`] and the processing list its oldest
/// message is moved to, and stays in until handled (so a successor finds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserQueue {
    /// Where messages wait.
    pub list: String,
    /// Where the message being handled is.
    pub processing: String,
}

/// A queued request answered without running it: the user's queue is over
/// its cap ([`PoolBus::shed_request`]).
#[derive(Debug, Clone, Copy)]
pub struct Shed<'a> {
    /// Whose request list holds it.
    pub user_id: &'a str,
    /// The entry exactly as queued; the newest equal entry is removed.
    pub raw: &'a [u8],
    /// Its request id.
    pub request_id: &'a str,
    /// The response JSON.
    pub response: &'a str,
}

/// What [`PaperLedger::record_paper_order`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerWrite {
    /// Stored: the order JSON, `broker_order_id` first.
    Recorded(String),
    /// The client order id was used before: nothing was written; the order
    /// stored under it.
    Exists(String),
}

/// One liveness mark as read by the pool manager and the sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMark {
    /// The key (`worker:active:…`).
    pub key: String,
    /// The stored value as text.
    pub value: String,
    /// Remaining TTL in ms; `None` when the key has no expiry.
    pub ttl_ms: Option<u64>,
}

/// The broker pool's shared state: every step a role takes, as one trait
/// object. Each method is one atomic step on the bus unless it says otherwise.
/// The claim queue, the user's queues, records and responses, and the
/// maintenance report are its own steps; liveness marks ([`MarkBus`]),
/// credentials ([`CredentialBus`]), reads ([`Inspect`]) and the paper ledger
/// ([`PaperLedger`]) are traits of their own because functions that touch
/// only those take only them.
#[async_trait]
pub trait PoolBus: Inspect + PaperLedger + MarkBus + CredentialBus {
    // The claim queue: push, take, settle, fail, return and re-queue claims.

    /// Queues a claim for an idle pool worker (`LPUSH pool:claims`).
    async fn push_claim(&self, body: &str) -> Result<(), BusError>;

    /// Waits up to `timeout` for a claim for pool worker `worker_id`: the
    /// oldest already in its processing list (one it took and has not
    /// settled), else the oldest of `pool:claims`, moved into its processing
    /// list in the same step (`LMOVE`/`BLMOVE pool:claims
    /// pool:claims:processing:{worker_id} RIGHT LEFT`). A claim is never only
    /// in the worker's memory. `interrupt` ends the wait early with
    /// [`Take::Empty`]; a claim moved when interrupted is still returned. A
    /// retired worker gets [`Take::Retired`] and no claim.
    async fn take_claim(
        &self,
        worker_id: &str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Take, BusError>;

    /// The claim step, atomic: only while `claim.raw` is still in the
    /// worker's processing list (removed here), sets the user's mark if no
    /// one holds it (dropping the worker's pool mark, rewriting the metadata)
    /// and writes the outcome, `claimed` or `failed`, for
    /// [`CLAIM_OUTCOME_TTL`]. Safe to repeat after an unknown outcome: the
    /// repeat says [`Settled::NotHeld`].
    async fn settle_claim(
        &self,
        mark: &MarkWrite<'_>,
        claim: &ClaimSettle<'_>,
    ) -> Result<Settled, BusError>;

    /// Ends a claim that cannot be served (does not parse, credentials do not
    /// decrypt) in one step: only while it is in the worker's processing list
    /// (removed), dead-letters it to `pool:claims:dead` and, when its claim
    /// id is readable, writes `outcome` (`failed`) under it. `false`: it was
    /// not in the list; nothing written.
    async fn fail_claim(
        &self,
        worker_id: &str,
        raw: &[u8],
        outcome: Option<(&str, &str)>,
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<bool, BusError>;

    /// Gives back a claim a stopping worker took but will not serve: moved
    /// from its processing list to the serving end of `pool:claims` (first in
    /// line) in one step. `false`: it was not in the list.
    async fn return_claim(&self, worker_id: &str, raw: &[u8]) -> Result<bool, BusError>;

    /// Re-queues every claim in pool worker `worker_id`'s processing list,
    /// first in line and oldest first, if and only if its pool mark is gone
    /// (it died between taking and settling them). Returns how many.
    async fn requeue_claims(&self, worker_id: &str) -> Result<u64, BusError>;

    /// Sets `key` to `value` for `ttl` (whole seconds, at least 1) only if it
    /// does not exist (`SET NX EX`): the supervisor's one-pending-re-serve lock.
    async fn set_if_absent(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, BusError>;

    // A user's request and control queues, the request record and the response.

    /// Queues a request for a user's worker (`LPUSH`, as the API does).
    async fn push_request(&self, user_id: &str, body: &str) -> Result<(), BusError>;

    /// Queues a control message for a user's worker (`LPUSH`, as the API does).
    async fn push_control(&self, user_id: &str, body: &str) -> Result<(), BusError>;

    /// Waits up to `timeout` for what the user's worker does next, in this
    /// order: the oldest control message (one already in control processing,
    /// else the oldest queued, moved there: `LMOVE … RIGHT LEFT`); the oldest request already
    /// in the processing list (a predecessor's, or one not yet answered);
    /// the oldest queued request, moved into the processing list in the same
    /// step (`LMOVE`/`BLMOVE requests processing RIGHT LEFT`). A message longer
    /// than `max_bytes` is handed out as [`UserMessage::Oversized`], its head
    /// only (read whole only when it arrives during a blocking wait, so a
    /// message that stopped one worker never reaches the next). While waiting,
    /// a control message still wins within milliseconds. `interrupt` behaves
    /// as in [`PoolBus::take_claim`]; a request moved when interrupted stays in
    /// the processing list, never lost.
    async fn pop_user_message(
        &self,
        user_id: &str,
        max_bytes: usize,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<Option<UserMessage>, BusError>;

    /// Removes a handled control message from
    /// `worker:control:{user_id}:processing` (the oldest equal entry).
    async fn finish_control(&self, user_id: &str, raw: &[u8]) -> Result<(), BusError>;

    /// Appends an invalid message to `{list_key}:dead` with the reason and the
    /// time (`RPUSH`, so the dead list reads oldest first). Every push to a
    /// dead list, here and in the request steps, keeps the newest
    /// [`DEAD_LETTER_MAX`] entries and sets its TTL to [`DEAD_LETTER_TTL`].
    async fn dead_letter(
        &self,
        list_key: &str,
        reason: &str,
        body: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError>;

    /// Begins a request, by [`begin::begin_rule`]: only while
    /// `worker_id` holds the user's mark; with no record, records `executing`
    /// for this user and worker ([`REQUEST_RECORD_TTL`], one delivery) and
    /// says [`Begun::Started`]; an `executing` record of this user and another
    /// worker is taken over (worker, deliveries + 1); otherwise nothing
    /// changes. Says what the record held.
    async fn begin_request(
        &self,
        request_id: &str,
        user_id: &str,
        worker_id: &str,
        at_unix_ms: u64,
    ) -> Result<Begun, BusError>;

    /// Ends a request in one step: per [`AnswerMode`], records it `done` with
    /// the response (and the user) and stores the response for
    /// [`RESPONSE_TTL`]; dead-letters it if asked; removes its entry from the
    /// processing list. A final answer follows
    /// [`answer::final_answer_rule`]: fenced, nothing is written.
    async fn answer_request(&self, answer: &Answer<'_>) -> Result<Answered, BusError>;

    /// Ends a message longer than the bound without reading it whole, in one
    /// step, only while it is still there (the tail of the user's processing
    /// list for a request): dead-letters its head with its length, and for a
    /// request with a readable id and no record, records it `done` with
    /// `answer` and stores that response. `false`: it was not there.
    async fn drop_oversized(&self, oversized: &Oversized<'_>) -> Result<bool, BusError>;

    /// Ends a request that cannot be answered (no readable id, not UTF-8, or
    /// an id that belongs to another user's request) in one step: dead-letters
    /// it with the reason and removes it from the processing list.
    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        at_unix_ms: u64,
    ) -> Result<(), BusError>;

    /// The newest queued requests beyond the first `max` (oldest) ones, newest
    /// first, at most [`SHED_BATCH`]: what a worker answers `overloaded`.
    /// Empty when the queue holds `max` or fewer.
    async fn excess_requests(&self, user_id: &str, max: u64) -> Result<Vec<Vec<u8>>, BusError>;

    /// Answers a queued request without running it, in one step: removes the
    /// newest equal entry from `trading:user:{user_id}:requests`, records the
    /// request `done` with the response and stores the response for
    /// [`RESPONSE_TTL`]. Changes nothing and says `false` when the id already
    /// has a record (a repeat is answered from it in turn, never shed) or the
    /// entry is no longer queued.
    async fn shed_request(&self, shed: &Shed<'_>) -> Result<bool, BusError>;

    /// Stores the answer to a request for [`RESPONSE_TTL`] (no record).
    async fn put_response(
        &self,
        user_id: &str,
        request_id: &str,
        body: &str,
    ) -> Result<(), BusError>;

    // The maintenance sweep's report and its deletions.

    /// The last maintenance sweep report (JSON).
    async fn maintenance_report(&self) -> Result<Option<String>, BusError>;

    /// Replaces the maintenance sweep report.
    async fn put_maintenance_report(&self, report: &str) -> Result<(), BusError>;

    /// Deletes keys (the sweep's stale and orphan marks); returns how many existed.
    async fn delete_keys(&self, keys: &[String]) -> Result<u64, BusError>;
}

/// Liveness marks: a user's mark (exclusive claim, heartbeat, release) and the idle pool's marks.
#[async_trait]
pub trait MarkBus: Send + Sync {
    /// The exclusive claim: sets the user's mark only if no one holds it, and
    /// in the same step drops the claimer's pool mark and rewrites the
    /// metadata. `true` when this worker now holds the user.
    async fn claim_user(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError>;

    /// Refreshes the user's mark and metadata while the mark is absent or this
    /// worker's (an expired mark is taken back). `false`: another worker holds
    /// the user; nothing was written.
    async fn refresh_user_mark(&self, mark: &MarkWrite<'_>) -> Result<bool, BusError>;

    /// Deletes the user's mark and metadata unless another worker holds the
    /// user (then `false` and nothing is deleted).
    async fn release_user_mark(&self, user_id: &str, worker_id: &str) -> Result<bool, BusError>;

    /// Whether the user has a worker (its mark exists).
    async fn user_is_active(&self, user_id: &str) -> Result<bool, BusError>;

    /// Writes an idle pool worker's mark `worker:active:-1:{worker_id}` with a
    /// TTL in whole seconds (at least 1) and, in the same step, its entry in
    /// `pool:idle` scored with the bus's clock (Redis `TIME`). `false`: the
    /// worker was retired ([`PoolBus::retire_idle`]); the mark is refreshed,
    /// the entry stays retired.
    async fn set_pool_mark(
        &self,
        worker_id: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, BusError>;

    /// Deletes an idle pool worker's mark and its `pool:idle` entry.
    async fn delete_pool_mark(&self, worker_id: &str) -> Result<(), BusError>;

    /// The idle pool workers, from `pool:idle` (no SCAN of the keyspace):
    /// entries not retired whose pool mark exists and whose claim processing
    /// list is empty (a worker between take and claim step is busy). An entry
    /// whose pool mark is gone is a dead worker's: in the same step its taken
    /// claims go back to the serving end of `pool:claims` (as
    /// [`PoolBus::requeue_claims`] does) and the entry is removed.
    async fn idle_workers(&self) -> Result<Vec<IdleEntry>, BusError>;

    /// Retires an idle pool worker before it is stopped, in one step, only if
    /// it is provably idle: in `pool:idle` and not retired, its pool mark
    /// present, its claim processing list empty. From then on
    /// [`PoolBus::take_claim`] gives it [`Take::Retired`] (handing back any
    /// claim it moves meanwhile) and [`PoolBus::idle_workers`] leaves it out.
    /// `false`: not provably idle; it must not be stopped.
    async fn retire_idle(&self, worker_id: &str) -> Result<bool, BusError>;

    /// Compare-and-delete, one step: deletes the liveness mark `key` (and
    /// `also`, e.g. its metadata) only if it still holds `expected`, the value
    /// a snapshot saw. `false`: it changed or is gone; nothing deleted.
    async fn delete_mark_if(
        &self,
        key: &str,
        expected: &str,
        also: &[String],
    ) -> Result<bool, BusError>;
}

/// Users' encrypted credentials and the grants that let the sealer hand them out.
#[async_trait]
pub trait CredentialBus: Send + Sync {
    /// A user's encrypted credentials blob.
    async fn credentials(&self, user_id: &str) -> Result<Option<String>, BusError>;

    /// Stores a user's encrypted credentials blob (no TTL).
    async fn put_credentials(&self, user_id: &str, blob: &str) -> Result<(), BusError>;

    /// Replaces a user's blob with `blob` only if it is still `expected`, in
    /// one step (`credentials rotate`: a `put` meanwhile wins). `false`: it
    /// changed or is gone, nothing written.
    async fn replace_credentials(
        &self,
        user_id: &str,
        expected: &str,
        blob: &str,
    ) -> Result<bool, BusError>;

    /// Writes (or renews) `pool:grant:{user_id}`, which lets the credential
    /// sealer hand this user's credentials out for `ttl` (whole seconds).
    async fn grant_credentials(
        &self,
        user_id: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<(), BusError>;

    /// The credential sealer's assign step ([`assign`]), one atomic step:
    /// consumes the user's grant if it is bound to the asker and no other
    /// worker holds the user, and then sets the user's mark for the asker
    /// and records it in `pool:holder:{user_id}`.
    async fn assign_user(
        &self,
        request: &assign::AssignRequest<'_>,
    ) -> Result<assign::Assignment, BusError>;
}

/// The paper broker's order book (`paper:orders:{account_id}`), kept next to
/// the pool so it survives workers, as a real broker's does.
#[async_trait]
pub trait PaperLedger: Send + Sync {
    /// Stores `order` (a JSON object without `broker_order_id`) under its
    /// client order id with the account's next `broker_order_id`, unless the
    /// id is there already: like a real broker, a repeated client order id is
    /// refused, never executed twice.
    async fn record_paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
        order: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LedgerWrite, BusError>;

    /// The order stored under a client order id.
    async fn paper_order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> Result<Option<String>, BusError>;
}

/// The stored form of a ledger order is `prefix`, the `broker_order_id`, then
/// `suffix` (the fields of `order`): the id is only known inside the atomic
/// step, and both buses build the text the same way.
pub(crate) fn ledger_entry_parts(
    order: &serde_json::Map<String, serde_json::Value>,
) -> (String, String) {
    let rest = serde_json::Value::Object(order.clone()).to_string();
    let prefix = r#"{"broker_order_id":"#.to_owned();
    let suffix = if order.is_empty() {
        "}".to_owned()
    } else {
        format!(",{}", &rest[1..])
    };
    (prefix, suffix)
}

/// Reads of any key in the pool's keyspace: what the pool's own read model
/// ([`crate::read`]) and the conformance suite are built on. Components that
/// only read hold a [`crate::read::PoolReader`] instead, which names no keys and
/// cannot reach `credentials:*`.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Every mark whose key matches `pattern` (SCAN semantics), with its value
    /// and TTL. Not atomic across keys; keys that vanish meanwhile are left out.
    async fn marks(&self, pattern: &str) -> Result<Vec<StoredMark>, BusError>;

    // --- generic reads (dashboard, observer, tests) ---

    /// Keys matching a glob pattern (`*`, `?`, `[…]`, `\` escapes), by SCAN
    /// (never KEYS), sorted and without duplicates.
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, BusError>;

    /// A string key's value.
    async fn get(&self, key: &str) -> Result<Option<String>, BusError>;

    /// A key's remaining TTL in ms: `None` when the key does not exist,
    /// `Some(-1)` when it has no expiry.
    async fn ttl_ms(&self, key: &str) -> Result<Option<i64>, BusError>;

    /// Length of a list (0 when absent).
    async fn list_len(&self, key: &str) -> Result<u64, BusError>;

    /// A list's entries from head to tail (empty when absent).
    async fn list_items(&self, key: &str) -> Result<Vec<String>, BusError>;

    /// A hash's fields (empty when absent), e.g. `worker:metadata:{user_id}`.
    async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, BusError>;

    /// The pool bus's own clock, unix ms (Redis `TIME`): what the sweep judges
    /// ages by, so no host's clock is compared with another's.
    async fn server_time_ms(&self) -> Result<u64, BusError>;
}

/// A TTL as the whole seconds Redis `EX` takes (at least 1, as the worker always
/// wrote it); both buses round the same way.
pub(crate) fn whole_seconds(ttl: Duration) -> u64 {
    ttl.as_secs().max(1)
}
