//! The protocol's decisions, free of I/O and of any clock: who may take a
//! lease, until when a holder may act, what a renew stores and what its
//! outcome does to the holder's deadline, what a sink accepts, where a new
//! owner resumes, and how far a regressed token is lifted. The keeper, the in-memory store, the lease
//! read model ([`crate::read`]), the runner and the in-memory sink call these; the DynamoDB expressions and the Redis scripts
//! state the same rules (one conformance suite per seam keeps them equal); and
//! the model checker (`control/tests/it/protocol_model.rs`) explores them under
//! crashes, pauses, clock skew and delayed writes.

use std::ops::Add;
use std::time::Duration;

/// The holder's own deadline: when its last renew (or the acquire) was *sent*,
/// plus the lease, minus the safety margin. A taker waits for the stored expiry
/// plus the skew margin, so this always falls first.
pub fn holder_deadline<T: Add<Duration, Output = T>>(
    sent: T,
    lease: Duration,
    margin: Duration,
) -> T {
    sent + lease.saturating_sub(margin)
}

/// A holder may produce side effects only before its own deadline.
pub fn holder_may_act<T: PartialOrd>(now: T, deadline: T) -> bool {
    now < deadline
}

/// The store's acquire condition: no owner, an expiry older than the taker's
/// clock minus the skew margin, or the caller already owns it. `expires_at` is
/// `None` when the record has no expiry yet.
pub fn acquirable(
    owner: Option<&str>,
    expires_at: Option<i64>,
    caller: &str,
    now_ms: i64,
    skew_margin_ms: i64,
) -> bool {
    let expired = expires_at.is_some_and(|at| at < now_ms - skew_margin_ms);
    match owner {
        None => true,
        Some(owner) => expired || owner == caller,
    }
}

/// Session mode's plain acquire condition: no owner, the caller already owns
/// it (a restarted process with the same id), or a per-stream holder's lease
/// lapsed past the skew margin (a table switched from per-stream mode). A
/// stream held under another session is never taken by this write, whatever
/// its own expiry says: only [`session_ended`] on the session record, checked
/// in the same transaction, lets a taker in.
pub fn session_acquirable(
    owner: Option<&str>,
    session_token: Option<u64>,
    expires_at: Option<i64>,
    caller: &str,
    now_ms: i64,
    skew_margin_ms: i64,
) -> bool {
    match (owner, session_token) {
        (None, _) => true,
        (Some(owner), _) if owner == caller => true,
        (Some(_), Some(_)) => false,
        (Some(_), None) => expires_at.is_some_and(|at| at < now_ms - skew_margin_ms),
    }
}

/// The takeover transaction's condition on the holder's session record
/// (`owner`, `token` and `expires_at` as stored; `None` when absent): the
/// session that held the stream with `session_token` is over — the record is
/// gone or released, was acquired again since (a new token), or expired more
/// than the skew margin ago. The holder's deadline for all its streams came
/// before any of these could be true.
pub fn session_ended(
    owner: Option<&str>,
    token: Option<u64>,
    expires_at: Option<i64>,
    session_token: u64,
    now_ms: i64,
    skew_margin_ms: i64,
) -> bool {
    owner.is_none()
        || token != Some(session_token)
        || expires_at.is_some_and(|at| at < now_ms - skew_margin_ms)
}

/// The first instant (unix ms) at which a record expiring at `expires_at` is
/// [`acquirable`] by anyone: one millisecond past its expiry plus the skew
/// margin (when an expiry probe or a waiting contender should look again).
pub fn takeable_at(expires_at: i64, skew_margin_ms: i64) -> i64 {
    expires_at.saturating_add(skew_margin_ms).saturating_add(1)
}

/// The expiry a renew stores: never shorter than the stored one.
pub fn renewed_expiry(stored: i64, requested: i64) -> i64 {
    stored.max(requested)
}

/// What a holder learned from one renew request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The store applied it.
    Confirmed,
    /// The store refused it: the caller no longer holds the lease.
    Refused,
    /// No confirmation (a timeout, throttling, any other error): the store may
    /// or may not have applied it.
    Unconfirmed,
}

/// The holder's deadline after a renew sent at `sent`: a confirmed renew moves
/// it to the [`holder_deadline`] of its send time; an unconfirmed one keeps the
/// `current` deadline (the store may have extended nothing, so the holder
/// retries and still stops at the deadline it had); a refusal ends the lease
/// (`None`).
pub fn deadline_after_renew<T: Add<Duration, Output = T>>(
    current: T,
    sent: T,
    outcome: RenewOutcome,
    lease: Duration,
    margin: Duration,
) -> Option<T> {
    match outcome {
        RenewOutcome::Confirmed => Some(holder_deadline(sent, lease, margin)),
        RenewOutcome::Refused => None,
        RenewOutcome::Unconfirmed => Some(current),
    }
}

/// What a renew the store answered with a record proves. A stored expiry
/// later than the one asked for is a refused shortening (`ExpiryAhead`: the
/// holder's clock is behind the one that wrote it), which says nothing about
/// how long the record runs by this holder's clock: unconfirmed, not a
/// success, so the holder's deadline does not move on it.
pub fn renew_outcome(stored_expiry_ms: i64, asked_expiry_ms: i64) -> RenewOutcome {
    if stored_expiry_ms > asked_expiry_ms {
        RenewOutcome::Unconfirmed
    } else {
        RenewOutcome::Confirmed
    }
}

/// How far a holder's wall clock fell behind its monotonic clock since the
/// acquire (a backward step, or a slew): the expiries it writes read that much
/// early to every other host, so its deadline must come that much earlier.
/// Zero when the wall clock kept pace or ran ahead (ahead only makes takers
/// wait longer).
pub fn wall_clock_behind(monotonic_elapsed: Duration, wall_elapsed_ms: i64) -> Duration {
    let monotonic_ms = i64::try_from(monotonic_elapsed.as_millis()).unwrap_or(i64::MAX);
    Duration::from_millis(u64::try_from(monotonic_ms.saturating_sub(wall_elapsed_ms)).unwrap_or(0))
}

/// Fence-regression recovery. A holder whose sink open was fenced (the sink
/// accepted `sink_fence`, above its `held_token`) reads the record: if it
/// still says `caller` holds the stream with that very token, no newer owner
/// exists (the record was re-created below the sink's fence), and the token
/// to lift the record to is returned: just past the fence, so the next acquire
/// starts above it. `None` for a real zombie (someone else, or a newer token,
/// in the record) and when the sink's fence is not above the held token.
pub fn lifted_token(
    record_owner: Option<&str>,
    record_token: u64,
    caller: &str,
    held_token: u64,
    sink_fence: u64,
) -> Option<u64> {
    let holds = record_owner == Some(caller) && record_token == held_token;
    if holds && fenced(sink_fence, held_token) {
        sink_fence.checked_add(1)
    } else {
        None
    }
}

/// A sink refuses a write or an open whose token is below its fence.
pub fn fenced(fence: u64, token: u64) -> bool {
    token < fence
}

/// An event the sink already holds: its sequence is at or below the last appended.
pub fn already_appended(last_seq: Option<u64>, seq: u64) -> bool {
    last_seq.is_some_and(|last| seq <= last)
}

/// A sink entry's id in layout v2, `<fence token>-<seq>`, ordered as Redis
/// orders stream ids (token first). The stream's last id is the fence and the
/// high-water mark at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EntryId {
    /// The token of the write (or open) that set it.
    pub token: u64,
    /// The sequence (a marker: `gap_to`; an opened, empty stream: 0).
    pub seq: u64,
}

/// The store appends an entry only above the stream's last id.
pub fn admits(last: Option<EntryId>, entry: EntryId) -> bool {
    last.is_none_or(|last| entry > last)
}

/// A refused entry is fenced when the last id carries a newer token, and a
/// duplicate (a replayed sequence) otherwise.
pub fn refused_as_fenced(last: EntryId, token: u64) -> bool {
    fenced(last.token, token)
}

/// Opening a stream under `token`: `Err(fence)` when the last id carries a
/// newer token; else the raised last id `<token>-<last seq>` (created as
/// `<token>-0` for a stream that does not exist, so no zombie can create it
/// under its lower token).
pub fn opened_id(last: Option<EntryId>, token: u64) -> Result<EntryId, u64> {
    match last {
        Some(last) if fenced(last.token, token) => Err(last.token),
        Some(last) => Ok(EntryId {
            token,
            seq: last.seq,
        }),
        None => Ok(EntryId { token, seq: 0 }),
    }
}

/// What opening a new epoch under `token` does to a stream whose last id is
/// `last` (a sequence reset: the reset entry goes at `position`, below the
/// old sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochOpen {
    /// A newer token's id is there: nothing changes (the caller is a zombie).
    Fenced(u64),
    /// The last id carries `token` already: this epoch was opened (a retry).
    Done,
    /// Append the reset entry at this id: above every older token's id.
    Append(EntryId),
}

/// Opening a new epoch under `token` with its reset entry at `position`.
pub fn epoch_open(last: Option<EntryId>, token: u64, position: u64) -> EpochOpen {
    match last {
        Some(last) if fenced(last.token, token) => EpochOpen::Fenced(last.token),
        Some(last) if last.token == token => EpochOpen::Done,
        _ => EpochOpen::Append(EntryId {
            token,
            seq: position,
        }),
    }
}

/// The last sequence an id stands for (`None` for an opened, empty stream).
pub fn last_seq_of(last: Option<EntryId>) -> Option<u64> {
    last.map(|id| id.seq).filter(|seq| *seq > 0)
}

/// After a lost connection the sink holds less than was confirmed (an
/// asynchronous replica was promoted without the tail): `Some(lost range)`.
pub fn lost_tail(confirmed: u64, sink_last: Option<u64>) -> Option<std::ops::RangeInclusive<u64>> {
    let kept = sink_last.unwrap_or(0);
    (kept < confirmed).then(|| kept + 1..=confirmed)
}

/// Where a new owner resumes in sink layout v2: after the sink's end when
/// the stream exists (past the checkpoint: the previous owner wrote more than
/// it checkpointed; below it: a failover lost a tail the checkpoint had
/// already covered, since the checkpoint only moves after the sink confirmed,
/// and the upstream refills it), else after the checkpoint (a stream deleted
/// or moved aside by an operator: nothing to refill into).
pub fn resume_point(checkpoint: Option<u64>, last_seq: Option<u64>) -> u64 {
    last_seq.unwrap_or_else(|| checkpoint.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_epoch_appends_above_older_tokens_once_and_never_under_a_newer_one() {
        let id = |token, seq| EntryId { token, seq };
        assert_eq!(
            epoch_open(Some(id(4, 60_108)), 5, 0),
            EpochOpen::Append(id(5, 0))
        );
        assert_eq!(epoch_open(None, 5, 2), EpochOpen::Append(id(5, 2)));
        assert_eq!(epoch_open(Some(id(5, 0)), 5, 0), EpochOpen::Done);
        assert_eq!(epoch_open(Some(id(6, 3)), 5, 0), EpochOpen::Fenced(6));
    }

    #[test]
    fn a_record_becomes_takeable_one_ms_past_expiry_plus_skew() {
        let at = takeable_at(10_000, 1_000);
        assert_eq!(at, 11_001);
        assert!(!acquirable(
            Some("other"),
            Some(10_000),
            "me",
            at - 1,
            1_000
        ));
        assert!(acquirable(Some("other"), Some(10_000), "me", at, 1_000));
        assert_eq!(takeable_at(i64::MAX, 1_000), i64::MAX, "saturates");
    }

    #[test]
    fn entry_ids_order_by_token_then_sequence() {
        let id = |token, seq| EntryId { token, seq };
        assert!(admits(None, id(1, 1)));
        assert!(admits(Some(id(2, 5)), id(2, 6)));
        assert!(!admits(Some(id(2, 5)), id(2, 5)), "a replayed sequence");
        assert!(!admits(Some(id(2, 5)), id(1, 9)), "a zombie's lower token");
        assert!(refused_as_fenced(id(2, 5), 1));
        assert!(!refused_as_fenced(id(2, 5), 2));
        assert_eq!(opened_id(None, 3), Ok(id(3, 0)));
        assert_eq!(opened_id(Some(id(2, 7)), 3), Ok(id(3, 7)));
        assert_eq!(opened_id(Some(id(4, 7)), 3), Err(4));
        assert_eq!(last_seq_of(Some(id(3, 0))), None);
        assert_eq!(last_seq_of(Some(id(3, 7))), Some(7));
    }

    #[test]
    fn a_sink_behind_what_was_confirmed_lost_its_tail() {
        assert_eq!(lost_tail(10, Some(6)), Some(7..=10));
        assert_eq!(lost_tail(10, None), Some(1..=10));
        assert_eq!(lost_tail(10, Some(10)), None);
        assert_eq!(lost_tail(10, Some(12)), None);
        assert_eq!(
            resume_point(Some(10), Some(6)),
            6,
            "refilled from the sink's end"
        );
        assert_eq!(resume_point(Some(10), Some(40)), 40);
        assert_eq!(resume_point(Some(10), None), 10, "a deleted stream");
    }

    #[test]
    fn a_taker_waits_for_expiry_plus_skew_and_an_owner_may_always_reacquire() {
        assert!(acquirable(None, None, "b", 0, 1_000));
        assert!(!acquirable(Some("a"), Some(10_000), "b", 10_500, 1_000));
        assert!(!acquirable(Some("a"), Some(10_000), "b", 11_000, 1_000));
        assert!(acquirable(Some("a"), Some(10_000), "b", 11_001, 1_000));
        assert!(acquirable(Some("a"), Some(10_000), "a", 0, 1_000));
        assert!(!acquirable(Some("a"), None, "b", 99_999, 1_000));
    }

    #[test]
    fn the_sink_rules() {
        assert!(fenced(5, 4) && !fenced(5, 5) && !fenced(5, 6));
        assert!(already_appended(Some(7), 7) && !already_appended(Some(7), 8));
        assert!(!already_appended(None, 1));
        assert_eq!(renewed_expiry(100, 90), 100);
        let deadline = holder_deadline(
            std::time::Instant::now(),
            Duration::from_secs(30),
            Duration::from_secs(3),
        );
        assert!(holder_may_act(std::time::Instant::now(), deadline));
    }

    #[test]
    fn only_a_confirmed_renew_moves_the_deadline() {
        let (lease, margin) = (Duration::from_secs(30), Duration::from_secs(3));
        let at = Duration::from_secs;
        let after = |outcome| deadline_after_renew(at(50), at(100), outcome, lease, margin);
        assert_eq!(after(RenewOutcome::Confirmed), Some(at(127)));
        assert_eq!(after(RenewOutcome::Unconfirmed), Some(at(50)));
        assert_eq!(after(RenewOutcome::Refused), None);
    }

    #[test]
    fn a_regressed_token_is_lifted_past_the_fence_by_its_holder_only() {
        assert_eq!(lifted_token(Some("a"), 1, "a", 1, 50), Some(51));
        assert_eq!(
            lifted_token(Some("b"), 1, "a", 1, 50),
            None,
            "someone else holds it"
        );
        assert_eq!(
            lifted_token(Some("a"), 2, "a", 1, 50),
            None,
            "a newer token exists"
        );
        assert_eq!(lifted_token(None, 1, "a", 1, 50), None, "released");
        assert_eq!(lifted_token(Some("a"), 50, "a", 50, 50), None, "not fenced");
        assert_eq!(lifted_token(Some("a"), 1, "a", 1, u64::MAX), None);
    }
}
