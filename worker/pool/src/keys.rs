//! The broker pool's Redis key names: the one place each is spelled.
//!
//! An API written in any language depends on these exact names (docs/redis.md);
//! `{…}` are placeholders, not Redis Cluster hash tags.

/// The user id pool workers run under until a claim gives them a user (the original broker-pool design).
pub const POOL_USER_ID: &str = "-1";

/// The list claim messages wait in for an idle pool worker (the original
/// design's SQS pool-claim queue). A pool worker takes one by moving it into
/// its own [`claims_processing`] list, never by popping it.
pub const POOL_CLAIMS: &str = "pool:claims";

/// The idle pool (sorted set: pool worker id → last heartbeat, unix ms by
/// Redis `TIME`; a retired worker scores -1). Written with the pool mark and
/// read by claims and the pool manager instead of a SCAN of the keyspace; an
/// entry without its [`pool_worker_active`] mark is stale and dropped by the
/// read that finds it. An addition to the original layout: the marks remain.
pub const POOL_IDLE: &str = "pool:idle";

/// Prefix of the per-pool-worker claim processing lists.
pub const CLAIMS_PROCESSING_PREFIX: &str = "pool:claims:processing:";

/// SCAN pattern matching every pool worker's claim processing list.
pub const CLAIMS_PROCESSING_PATTERN: &str = "pool:claims:processing:*";

/// SCAN pattern matching every pending re-serve lock ([`reserve_lock`]).
pub const RESERVE_LOCK_PATTERN: &str = "pool:reserve:*";

/// SCAN pattern matching every "wants a worker" mark ([`user_wanted`]).
pub const USER_WANTED_PATTERN: &str = "pool:wanted:*";

/// SCAN patterns matching every user's request and processing lists (the
/// supervisor looks for work without a worker).
pub const USER_REQUESTS_PATTERN: &str = "trading:user:*:requests";
/// See [`USER_REQUESTS_PATTERN`].
pub const USER_PROCESSING_PATTERN: &str = "trading:user:*:processing";

/// Latest maintenance sweep report (JSON), read by the dashboard.
pub const MAINTENANCE_LAST_REPORT: &str = "maintenance:last_report";

/// SCAN pattern matching every liveness mark, pool and claimed.
pub const WORKER_ACTIVE_PATTERN: &str = "worker:active:*";

/// SCAN pattern matching idle pool workers' marks.
pub const POOL_WORKER_ACTIVE_PATTERN: &str = "worker:active:-1:*";

/// Prefix shared by every liveness mark.
pub const WORKER_ACTIVE_PREFIX: &str = "worker:active:";

/// Longest user id [`check_user_id`] accepts.
pub const USER_ID_MAX_LEN: usize = 128;

/// Why a user id cannot name a user's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UserIdError {
    /// Empty or longer than [`USER_ID_MAX_LEN`].
    #[error("user id must be 1-128 characters")]
    Length,
    /// Starts with `-`: that prefix is the pool's (`-1`, `-1:{worker_id}`).
    #[error("user id must not start with `-` (reserved for the pool's own marks)")]
    LeadingDash,
    /// A character outside `A-Z a-z 0-9 _ . @ -`.
    #[error("user id may hold only letters, digits and `_ . @ -`")]
    Character,
}

/// The one definition of a user id that can name a user's keys:
/// `[A-Za-z0-9_.@-]{1,128}`, not starting with `-`.
///
/// Why this shape: user ids are spliced into key names, and the pool's own
/// marks live under `worker:active:-1:{worker_id}`. A user id such as `-1:w7`
/// would make `worker:active:{user_id}` *be* a pool worker's mark (the sweep
/// and the pool manager would count it as an idle worker, and the claim
/// script would overwrite it), and one with a `:` or a glob character could
/// fall inside another key family or a `SCAN MATCH` pattern. Excluding `:`,
/// glob characters and a leading `-` rules all of that out; the error never
/// echoes the id (it could be a secret pasted in the wrong field).
pub fn check_user_id(user_id: &str) -> Result<(), UserIdError> {
    if user_id.is_empty() || user_id.len() > USER_ID_MAX_LEN {
        return Err(UserIdError::Length);
    }
    if user_id.starts_with('-') {
        return Err(UserIdError::LeadingDash);
    }
    if !user_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
    {
        return Err(UserIdError::Character);
    }
    Ok(())
}

/// Whether a user id can safely become part of a key ([`check_user_id`]).
pub fn valid_user_id(user_id: &str) -> bool {
    check_user_id(user_id).is_ok()
}

/// A claim taken by pool worker `worker_id`: moved here atomically from
/// [`POOL_CLAIMS`] (`BLMOVE … RIGHT LEFT`) and removed only in the step that
/// settles it (user marked, or outcome `failed` written). A worker that dies
/// in between leaves it here; once the worker's pool mark is gone, a successor
/// or the maintenance sweep puts it back in [`POOL_CLAIMS`].
pub fn claims_processing(worker_id: &str) -> String {
    format!("{CLAIMS_PROCESSING_PREFIX}{worker_id}")
}

/// The pool worker a [`claims_processing`] key belongs to.
pub fn claims_processing_owner(key: &str) -> Option<&str> {
    key.strip_prefix(CLAIMS_PROCESSING_PREFIX)
        .filter(|worker| !worker.is_empty())
}

/// A claim's outcome (string, 60 s): `{"status": "claimed" | "failed",
/// "worker_id", "error"}`, written in the step that settles the claim.
pub fn claim_outcome(claim_id: &str) -> String {
    format!("pool:claim:{claim_id}")
}

/// The supervisor's lock for re-serving one user (`SET NX EX`): while it
/// exists a re-claim or cold start for the user is pending, and no second
/// one is started.
pub fn reserve_lock(user_id: &str) -> String {
    format!("pool:reserve:{user_id}")
}

/// Optional: the API marks a user as wanting a worker; the supervisor gives
/// such a user one like a user with pending requests.
pub fn user_wanted(user_id: &str) -> String {
    format!("pool:wanted:{user_id}")
}

/// The user a key of `pattern`'s shape (`prefix*suffix`) names, for the SCAN
/// patterns above with one `*`.
pub fn user_in(pattern: &str, key: &str) -> Option<String> {
    let (prefix, suffix) = pattern.split_once('*')?;
    key.strip_prefix(prefix)?
        .strip_suffix(suffix)
        .filter(|user| valid_user_id(user))
        .map(str::to_owned)
}

/// Requests for a user's worker (API LPUSH; the worker moves the oldest into
/// [`user_processing`] with `BLMOVE … RIGHT LEFT`).
pub fn user_requests(user_id: &str) -> String {
    format!("trading:user:{user_id}:requests")
}

/// The request a user's worker is serving: moved here atomically from
/// [`user_requests`] and removed only once its final response is stored, so a
/// worker that dies mid-request leaves it for its successor.
pub fn user_processing(user_id: &str) -> String {
    format!("trading:user:{user_id}:processing")
}

/// The answer to one of a user's requests (worker SET with a 60 s TTL, API
/// GET). Keyed by user as well as request id (a deviation from the original
/// `trading:response:{request_id}`), so that a Redis user confined to one
/// user's keys reaches no other user's answers.
pub fn response(user_id: &str, request_id: &str) -> String {
    format!("trading:response:{user_id}:{request_id}")
}

/// One of a user's request records (hash, 24 h): `executing` before the
/// broker call, `done` and the final response after; a repeated id is
/// answered from it. Keyed by user too, as [`response`] is.
pub fn request_record(user_id: &str, request_id: &str) -> String {
    format!("trading:request:{user_id}:{request_id}")
}

/// The paper broker's ledger for one account (hash: client order id → order
/// JSON), kept in Redis as a real broker keeps its orders.
pub fn paper_orders(account_id: &str) -> String {
    format!("paper:orders:{account_id}")
}

/// The counter the paper broker's `broker_order_id`s come from (`INCR`), one
/// per account. A prefix of its own, so no account id can make it collide with
/// a ledger key.
pub fn paper_order_ids(account_id: &str) -> String {
    format!("paper:order_ids:{account_id}")
}

/// A claimed worker's liveness mark (SET every heartbeat, 30 s TTL).
pub fn worker_active(user_id: &str) -> String {
    format!("{WORKER_ACTIVE_PREFIX}{user_id}")
}

/// An idle pool worker's liveness mark.
pub fn pool_worker_active(worker_id: &str) -> String {
    format!("{WORKER_ACTIVE_PREFIX}{POOL_USER_ID}:{worker_id}")
}

/// A claimed worker's metadata hash (`task_arn`, `instance_id`, `launched_at`).
pub fn worker_metadata(user_id: &str) -> String {
    format!("worker:metadata:{user_id}")
}

/// Control messages for a user's worker (`reload_credentials`, `shutdown`).
pub fn worker_control(user_id: &str) -> String {
    format!("worker:control:{user_id}:messages")
}

/// The control message a user's worker is handling: moved here atomically
/// from [`worker_control`] and removed once handled, so a worker that dies
/// right after taking a `reload_credentials` leaves it for its successor.
pub fn worker_control_processing(user_id: &str) -> String {
    format!("worker:control:{user_id}:processing")
}

/// A user's encrypted credentials blob.
pub fn credentials(user_id: &str) -> String {
    format!("credentials:{user_id}")
}

/// A trusted component's permission for the credential sealer to hand
/// `user_id`'s credentials to the worker that holds or is claiming the user
/// (string, [`crate::protocol::CredentialsGrant`] JSON, with a TTL): written
/// before a claim is pushed, a cold start launched or `reload_credentials`
/// sent. No broker worker may write it, so a worker cannot give itself
/// another user's credentials.
pub fn credentials_grant(user_id: &str) -> String {
    format!("pool:grant:{user_id}")
}

/// The users the credential sealer has a holder record for (sorted set,
/// member = user id, score 0): what it walks to make claim users again after
/// a failover, without a SCAN. Written and pruned only by the sealer.
pub const SEAL_HOLDERS: &str = "pool:holders";

/// The worker the credential sealer last assigned a user to and its key
/// (string, [`crate::bus::assign::SealHolder`] JSON, no TTL): written only by
/// the sealer's assign step, read by it on a reload.
pub fn seal_holder(user_id: &str) -> String {
    format!("pool:holder:{user_id}")
}

/// Where invalid messages taken from `list_key` are moved, with the reason.
pub fn dead_letter(list_key: &str) -> String {
    format!("{list_key}:dead")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_follow_the_contract() {
        assert_eq!(user_requests("u1"), "trading:user:u1:requests");
        assert_eq!(user_processing("u1"), "trading:user:u1:processing");
        assert_eq!(response("u1", "r1"), "trading:response:u1:r1");
        assert_eq!(request_record("u1", "r1"), "trading:request:u1:r1");
        assert_eq!(paper_orders("A1"), "paper:orders:A1");
        assert_eq!(paper_order_ids("A1"), "paper:order_ids:A1");
        assert_eq!(worker_active("u1"), "worker:active:u1");
        assert_eq!(pool_worker_active("w1"), "worker:active:-1:w1");
        assert_eq!(worker_metadata("u1"), "worker:metadata:u1");
        assert_eq!(worker_control("u1"), "worker:control:u1:messages");
        assert_eq!(credentials("u1"), "credentials:u1");
        assert_eq!(dead_letter(POOL_CLAIMS), "pool:claims:dead");
        assert!(pool_worker_active("w1").starts_with(&POOL_WORKER_ACTIVE_PATTERN[..16]));
        assert_eq!(claims_processing("w1"), "pool:claims:processing:w1");
        assert_eq!(POOL_IDLE, "pool:idle");
        assert_eq!(
            claims_processing_owner("pool:claims:processing:w1"),
            Some("w1")
        );
        assert_eq!(claims_processing_owner("pool:claims:processing:"), None);
        assert_eq!(claim_outcome("c1"), "pool:claim:c1");
        assert_eq!(reserve_lock("u1"), "pool:reserve:u1");
        assert_eq!(user_wanted("u1"), "pool:wanted:u1");
        assert_eq!(
            user_in(USER_REQUESTS_PATTERN, "trading:user:u1:requests").as_deref(),
            Some("u1")
        );
        assert_eq!(
            user_in(USER_PROCESSING_PATTERN, "trading:user:u1:processing").as_deref(),
            Some("u1")
        );
        assert_eq!(
            user_in(USER_REQUESTS_PATTERN, "trading:user:a:b:requests"),
            None
        );
        assert_eq!(
            user_in(RESERVE_LOCK_PATTERN, "pool:reserve:u1").as_deref(),
            Some("u1")
        );
    }

    #[test]
    fn user_ids_cannot_take_the_shape_of_pool_keys() {
        for good in ["u1", "alice@example.com", "A_b.c-9", &"x".repeat(128)] {
            assert!(valid_user_id(good), "{good}");
        }
        for bad in ["", "-1", "-1:w7", "u 1", "u:1", "u*", "ü", &"x".repeat(129)] {
            assert!(!valid_user_id(bad), "{bad}");
        }
    }

    #[test]
    fn user_ids_cannot_reach_into_pool_keys() {
        for good in ["u1", "alice@example.com", "A-1_b.c", "0", &"x".repeat(128)] {
            assert_eq!(check_user_id(good), Ok(()), "{good}");
        }
        assert_eq!(check_user_id("-1"), Err(UserIdError::LeadingDash));
        assert_eq!(check_user_id("-1:w7"), Err(UserIdError::LeadingDash));
        assert_eq!(check_user_id(""), Err(UserIdError::Length));
        assert_eq!(check_user_id(&"x".repeat(129)), Err(UserIdError::Length));
        for bad in ["u1:w7", "u*", "u?", "u[1]", "u 1", "ü", "u\\1", "u{1}"] {
            assert_eq!(check_user_id(bad), Err(UserIdError::Character), "{bad}");
        }
        // The id the pool's marks are built from is not a user id.
        assert!(check_user_id(POOL_USER_ID).is_err());
    }
}
