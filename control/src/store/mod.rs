//! The lease store: one trait, one error enum, two backends with one behaviour.
//!
//! Every operation is a single conditional write (or read) whose condition is
//! evaluated by the store, never by the caller: ownership changes only here.
//! Callers pass their wall-clock time in; the store compares, so the in-memory and
//! DynamoDB backends decide identically and tests can choose any instant.
//! [`intercept`] wraps either one to fail, hold or count its calls.

pub mod dynamodb;
pub mod intercept;
pub mod memory;

use async_trait::async_trait;

use crate::lease::Lease;
use crate::schema::{self, AttrValue, MalformedItem, RawItem};

/// Ask to become (or stay) the holder of a stream.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Stream to acquire; created if absent.
    pub stream_id: String,
    /// Who asks.
    pub owner_id: String,
    /// Caller's wall-clock time, unix ms.
    pub now_ms: i64,
    /// Lease duration; the record expires at `now_ms + lease_ms`.
    pub lease_ms: i64,
    /// Takeover only when `lease_expires_at < now_ms - skew_margin_ms`, so a taker
    /// whose clock runs ahead cannot take a lease its holder still believes valid.
    pub skew_margin_ms: i64,
    /// Stored as `sidecar_url` when given (a worker announcing its presence);
    /// when `None` the acquire leaves any stored value as it is.
    pub sidecar_url: Option<String>,
    /// Stored as `handoff_addr` when given, like `sidecar_url`.
    pub handoff_addr: Option<String>,
    /// Stored as `max_streams` when given, like `sidecar_url`.
    pub max_streams: Option<u64>,
    /// Session mode: the token of the caller's session record. The stream is
    /// then taken only if nobody holds it (or the caller does, or a per-stream
    /// holder's lease lapsed), never from another session: that is
    /// [`LeaseStore::take_over`]'s transaction. `None`: a per-stream acquire.
    pub session_token: Option<u64>,
}

/// Session mode: take a stream from a session that ended (see
/// [`LeaseStore::take_over`]).
#[derive(Debug, Clone)]
pub struct TakeoverRequest {
    /// The taker's acquire; its `session_token` is the taker's session.
    pub acquire: AcquireRequest,
    /// The holder the taker's read saw (`owner_id`), whose session record is
    /// `leasehold#session#{from_owner}`.
    pub from_owner: String,
    /// The stream's `session_token` as read.
    pub from_session_token: u64,
    /// The stream's `fence_token` as read: the stream must not have moved since.
    pub from_fence_token: u64,
    /// When the holder's session expired, as the taker read its session
    /// record (`None`: the record was gone or had started again, so when it
    /// ended is unknown). Stored as the stream's `previous_expires_at`: the
    /// stream record's own expiry is written once at acquire and never
    /// renewed in session mode, so it would make every takeover gap as long
    /// as the session lived.
    pub from_expires_at: Option<i64>,
}

/// Extend a held lease, optionally carrying a checkpoint on the same write.
#[derive(Debug, Clone)]
pub struct RenewRequest {
    /// Stream held.
    pub stream_id: String,
    /// The holder.
    pub owner_id: String,
    /// Token received on acquire.
    pub fence_token: u64,
    /// Caller's wall-clock time, unix ms.
    pub now_ms: i64,
    /// New expiry is `now_ms + lease_ms`.
    pub lease_ms: i64,
    /// A sink-confirmed checkpoint to store on the same write (saves a write per
    /// renew interval); it must not be behind the stored one.
    pub checkpoint: Option<u64>,
}

/// Record a sink-confirmed checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointRequest {
    /// Stream held.
    pub stream_id: String,
    /// The holder.
    pub owner_id: String,
    /// Token received on acquire.
    pub fence_token: u64,
    /// Last sequence the sink confirmed.
    pub checkpoint: u64,
    /// Caller's wall-clock time, unix ms.
    pub now_ms: i64,
}

/// Give a held lease back (drain): keeps `fence_token` and `checkpoint`.
#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    /// Stream held.
    pub stream_id: String,
    /// The holder.
    pub owner_id: String,
    /// Token received on acquire.
    pub fence_token: u64,
    /// Caller's wall-clock time, unix ms.
    pub now_ms: i64,
    /// Progress to record in the same write (a drain's last confirmed
    /// sequence), so a hand-off costs one round trip, not two. Refused with
    /// [`LeaseError::CheckpointBehind`] (nothing written) when the stored
    /// checkpoint is further.
    pub checkpoint: Option<u64>,
    /// The worker this release hands the stream to (a graceful hand-off),
    /// recorded as `handed_to`; `None` removes any earlier one.
    pub successor: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct LeasePage {
    /// Records of this page; a malformed record is an entry of its own so the rest
    /// of the listing is still usable.
    pub leases: Vec<Result<Lease, MalformedItem>>,
    /// Pass back as `start_after` for the next page; `None` at the end.
    pub next: Option<String>,
}

/// Why a store operation did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    /// The condition did not hold: somebody else holds the stream, or the caller's
    /// token or ownership is stale. Carries the record as it is now.
    #[error("stream {stream_id:?} is held by {} with fence token {} (expires at {})",
        .current.owner_id.as_deref().unwrap_or("nobody"), .current.fence_token, .current.lease_expires_at)]
    Conflict {
        /// Stream asked for.
        stream_id: String,
        /// The record that made the condition fail.
        current: Box<Lease>,
    },
    /// The checkpoint asked for is behind the stored one; checkpoints never move backwards.
    #[error(
        "checkpoint {requested} for stream {stream_id:?} is behind the stored checkpoint {stored}"
    )]
    CheckpointBehind {
        /// Stream asked for.
        stream_id: String,
        /// What the caller tried to write.
        requested: u64,
        /// What the record holds.
        stored: u64,
    },
    /// A renew would have shortened the stored expiry (the holder's clock is
    /// behind the one that wrote it). Stores turn this into a renew that keeps
    /// the later expiry; it never reaches callers of [`LeaseStore::renew`].
    #[error("stream {stream_id:?} already runs until {expires_at} ms")]
    ExpiryAhead {
        /// Stream asked for.
        stream_id: String,
        /// The record, still held by the caller, with its later expiry.
        current: Box<Lease>,
        /// The stored expiry.
        expires_at: i64,
    },
    /// No record for this stream.
    #[error("stream {stream_id:?} is not in the lease table")]
    NotFound {
        /// Stream asked for.
        stream_id: String,
    },
    /// The lease table itself does not exist.
    #[error(
        "lease table {table:?} does not exist; create it with `leasehold table create` (LEASE_TABLE={table})"
    )]
    TableMissing {
        /// Configured table name.
        table: String,
    },
    /// The store asked us to slow down; retry with backoff.
    #[error("lease store throttled the request: {message}")]
    Throttled {
        /// The store's error code and message.
        message: String,
    },
    /// A network, timeout or server-side failure; the outcome is unknown, retry with backoff.
    #[error("lease store unavailable: {message}")]
    Transient {
        /// What failed.
        message: String,
    },
    /// The record exists but cannot be read as a lease.
    #[error(transparent)]
    Malformed(#[from] MalformedItem),
    /// Any other failure the store reported (validation, permissions).
    #[error("lease store rejected the request: {message}")]
    Rejected {
        /// The store's error code and message.
        message: String,
    },
}

impl LeaseError {
    /// Whether retrying the same request may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LeaseError::Throttled { .. } | LeaseError::Transient { .. }
        )
    }

    /// Whether the store definitively refused because ownership is not the caller's.
    pub fn is_ownership_lost(&self) -> bool {
        matches!(
            self,
            LeaseError::Conflict { .. } | LeaseError::NotFound { .. }
        )
    }
}

/// How fresh a read must be.
///
/// DynamoDB charges an eventually consistent read half the read units of a
/// strongly consistent one, and may answer it from a replica that has not seen
/// the last second or so of writes. Whoever acts on ownership (the keeper, a
/// worker's discovery and doorbell) reads [`Consistency::Strong`]; readers that
/// only show or count (the dashboard, the observer's scan and its look before
/// contending) read [`Consistency::Eventual`]. Neither decides anything: the
/// conditional write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Reflects every write acknowledged before the read.
    Strong,
    /// May miss the most recent writes; half the read units on DynamoDB.
    Eventual,
}

impl Consistency {
    /// Whether DynamoDB's `ConsistentRead` is set.
    pub fn is_strong(self) -> bool {
        self == Consistency::Strong
    }
}

/// The read side of a lease store: what the dashboard, the observer and the
/// operator's `leases list / show` hold, so none of them can write through it.
#[async_trait]
pub trait LeaseReader: Send + Sync + 'static {
    /// Reads one record.
    async fn get_with(
        &self,
        stream_id: &str,
        consistency: Consistency,
    ) -> Result<Lease, LeaseError>;

    /// One page of records. Pages may be shorter than `limit` before the end; only
    /// `next == None` means the listing is complete.
    async fn list_with(
        &self,
        start_after: Option<&str>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<LeasePage, LeaseError>;

    /// The streams assigned to `assignee` (assigned discovery), from the
    /// assignee index, sorted. Eventually consistent on DynamoDB (a global
    /// secondary index has no strong reads): a caller about to act on an
    /// entry re-reads the record first.
    async fn assigned(&self, assignee: &str) -> Result<Vec<String>, LeaseError>;

    /// Reads one record, strongly consistent.
    async fn get(&self, stream_id: &str) -> Result<Lease, LeaseError> {
        self.get_with(stream_id, Consistency::Strong).await
    }

    /// One page of records, strongly consistent (see [`LeaseReader::list_with`]).
    async fn list(&self, start_after: Option<&str>, limit: usize) -> Result<LeasePage, LeaseError> {
        self.list_with(start_after, limit, Consistency::Strong)
            .await
    }
}

/// Where leases live: every conditional write. Both backends pass the same
/// conformance suite.
#[async_trait]
pub trait LeaseStore: LeaseReader {
    /// Conditional acquire: succeeds when the stream has no owner, its lease expired
    /// more than the skew margin ago, or the caller already owns it. Increments the
    /// fence token and returns the new record.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Lease, LeaseError>;

    /// Extends the caller's lease; fails unless owner and token match and the lease
    /// has not expired.
    async fn renew(&self, request: &RenewRequest) -> Result<Lease, LeaseError>;

    /// Stores a checkpoint; fails unless owner and token match, and never moves it backwards.
    async fn checkpoint(&self, request: &CheckpointRequest) -> Result<Lease, LeaseError>;

    /// Releases the caller's lease: removes the owner and sets the expiry to 0,
    /// keeping fence token and checkpoint so the next holder continues from both.
    async fn release(&self, request: &ReleaseRequest) -> Result<Lease, LeaseError>;

    /// Operator release whatever the holder: same effect as [`LeaseStore::release`].
    /// The holder notices on its next renew; the next acquire's higher token fences
    /// anything it still writes.
    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError>;

    /// Registers a stream so discovery finds it. Returns `false` if it already existed
    /// (the record is left untouched).
    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError>;

    /// Increments the counter (`fence_token`) of a reserved `leasehold#…` record,
    /// creating it if needed, and returns the new value. Used as a doorbell
    /// ("something was released: look now"); refuses stream records, whose
    /// tokens only acquire may move.
    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError>;

    /// Assigned discovery: writes (`Some`) or removes (`None`) the stream's
    /// `assignee`, the elected assigner's advice. Never creates a record
    /// ([`LeaseError::NotFound`]) and refuses reserved ones; touches nothing
    /// else, so it never moves ownership, the token or the checkpoint.
    async fn assign(&self, stream_id: &str, assignee: Option<&str>) -> Result<(), LeaseError>;

    /// Session mode's takeover, one transaction (`TransactWriteItems`, two
    /// write units: takeovers only, never renewals): a condition that the
    /// holder's session record ended ([`crate::protocol::session_ended`]) and
    /// the acquire of the stream, conditional on it still being held by that
    /// session with that token. Refused as [`LeaseError::Conflict`] (the
    /// stream as it is now) when either condition fails.
    async fn take_over(&self, request: &TakeoverRequest) -> Result<Lease, LeaseError>;

    /// Declares the table's lease mode (`per-stream` or `session`) in the
    /// reserved mode record unless one is declared already, and returns the
    /// declared one: the first worker decides, the others compare.
    async fn declare_mode(&self, mode: &str, now_ms: i64) -> Result<String, LeaseError>;

    /// Fence-regression recovery: the caller holds the stream with
    /// `request.fence_token`, yet a sink has accepted a higher token (the record
    /// was re-created by a restore, a TTL or an operator). Lifts the stored token
    /// to `request.to` in one conditional write (owner, token, and `to` higher),
    /// so the next acquire starts above the sink's fence instead of climbing
    /// back one takeover at a time. The caller's lease is void afterwards.
    async fn lift_token(&self, request: &LiftRequest) -> Result<Lease, LeaseError>;
}

/// Lift a held stream's fence token past a sink's (see [`LeaseStore::lift_token`]).
#[derive(Debug, Clone)]
pub struct LiftRequest {
    /// Stream held.
    pub stream_id: String,
    /// The holder.
    pub owner_id: String,
    /// The holder's token.
    pub fence_token: u64,
    /// The token to store (above the sink's fence).
    pub to: u64,
    /// A new epoch's checkpoint (the upstream's sequence started over, so
    /// it goes back), stored with the token; `None` keeps the checkpoint.
    pub checkpoint: Option<u64>,
    /// Caller's wall-clock time, unix ms.
    pub now_ms: i64,
}

/// What a conditional write claimed about the caller, used to explain a refusal
/// the same way whichever backend evaluated the condition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    owner_id: Option<&'a str>,
    fence_token: u64,
    checkpoint: Option<u64>,
    /// The expiry a renew asks for.
    renew_to: Option<i64>,
}

impl<'a> Holder<'a> {
    /// A caller that claims to hold the lease with this token.
    pub(crate) fn new(owner_id: &'a str, fence_token: u64, checkpoint: Option<u64>) -> Self {
        Holder {
            owner_id: Some(owner_id),
            fence_token,
            checkpoint,
            renew_to: None,
        }
    }

    /// The same caller, renewing to `expires_at`.
    pub(crate) fn renewing_to(self, expires_at: i64) -> Self {
        Holder {
            renew_to: Some(expires_at),
            ..self
        }
    }

    /// A caller that claims nothing (acquire).
    pub(crate) fn none() -> Self {
        Holder {
            owner_id: None,
            fence_token: 0,
            checkpoint: None,
            renew_to: None,
        }
    }

    /// Owner and token match the record.
    pub(crate) fn holds(&self, lease: &Lease) -> bool {
        self.owner_id.is_some()
            && lease.owner_id.as_deref() == self.owner_id
            && lease.fence_token == self.fence_token
    }

    /// The checkpoint to write is behind the stored one.
    pub(crate) fn is_behind(&self, lease: &Lease) -> bool {
        matches!((self.checkpoint, lease.checkpoint), (Some(new), Some(stored)) if new < stored)
    }
}

/// The error for a failed condition, given the record as it is now.
pub(crate) fn refusal(current: Lease, holder: Holder<'_>) -> LeaseError {
    if holder.holds(&current)
        && !holder.is_behind(&current)
        && holder
            .renew_to
            .is_some_and(|asked| current.lease_expires_at > asked)
    {
        return LeaseError::ExpiryAhead {
            stream_id: current.stream_id.clone(),
            expires_at: current.lease_expires_at,
            current: Box::new(current),
        };
    }
    if holder.holds(&current) && holder.is_behind(&current) {
        return LeaseError::CheckpointBehind {
            stream_id: current.stream_id.clone(),
            requested: holder.checkpoint.unwrap_or_default(),
            stored: current.checkpoint.unwrap_or_default(),
        };
    }
    LeaseError::Conflict {
        stream_id: current.stream_id.clone(),
        current: Box::new(current),
    }
}

/// The record `register` writes: the original attributes with nothing held yet.
pub(crate) fn registration_item(stream_id: &str, now_ms: i64) -> RawItem {
    RawItem::from([
        (schema::STREAM_ID.to_owned(), AttrValue::s(stream_id)),
        (schema::LEASE_EXPIRES_AT.to_owned(), AttrValue::n(0)),
        (schema::FENCE_TOKEN.to_owned(), AttrValue::n(0)),
        (schema::CHECKPOINT.to_owned(), AttrValue::n(0)),
        (schema::UPDATED_AT.to_owned(), AttrValue::n(now_ms)),
    ])
}

/// Refuses `bump` on anything but a reserved record.
pub(crate) fn check_reserved(record_id: &str) -> Result<(), LeaseError> {
    if record_id.starts_with(schema::RESERVED_PREFIX) {
        Ok(())
    } else {
        Err(LeaseError::Rejected {
            message: format!(
                "only reserved {}… records can be bumped, not {record_id:?}",
                schema::RESERVED_PREFIX
            ),
        })
    }
}

/// Refuses a reserved `leasehold#…` record where only streams may go.
pub(crate) fn check_stream(stream_id: &str) -> Result<(), LeaseError> {
    if stream_id.starts_with(schema::RESERVED_PREFIX) {
        Err(LeaseError::Rejected {
            message: format!("{stream_id:?} is a reserved record, not a stream"),
        })
    } else {
        Ok(())
    }
}

/// Reads every page of a listing.
pub async fn list_all(
    store: &dyn LeaseReader,
    page_size: usize,
    consistency: Consistency,
) -> Result<Vec<Result<Lease, MalformedItem>>, LeaseError> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_with(cursor.as_deref(), page_size, consistency)
            .await?;
        all.extend(page.leases);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
}
