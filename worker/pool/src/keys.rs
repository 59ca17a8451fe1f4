//! The broker pool's Redis key names: the one place each is spelled.
//!
//! An API written in any language depends on these exact names (docs/redis.md);
//! `{…}` are placeholders, not Redis Cluster hash tags.

/// The user id pool workers run under until a claim gives them a user (the original broker-pool design).
pub const POOL_USER_ID: &str = "-1";

/// The list pool workers BRPOP claim messages from (the original design's SQS pool-claim queue).
pub const POOL_CLAIMS: &str = "pool:claims";

/// Latest maintenance sweep report (JSON), read by the dashboard.
pub const MAINTENANCE_LAST_REPORT: &str = "maintenance:last_report";

/// SCAN pattern matching every liveness mark, pool and claimed.
pub const WORKER_ACTIVE_PATTERN: &str = "worker:active:*";

/// SCAN pattern matching idle pool workers' marks.
pub const POOL_WORKER_ACTIVE_PATTERN: &str = "worker:active:-1:*";

/// Prefix shared by every liveness mark.
pub const WORKER_ACTIVE_PREFIX: &str = "worker:active:";

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

/// The answer to one request (worker SET with a 60 s TTL, API GET).
pub fn response(request_id: &str) -> String {
    format!("trading:response:{request_id}")
}

/// One request's record (hash, 24 h): `executing` before the broker call,
/// `done` and the final response after; a repeated id is answered from it.
pub fn request_record(request_id: &str) -> String {
    format!("trading:request:{request_id}")
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

/// A user's encrypted credentials blob.
pub fn credentials(user_id: &str) -> String {
    format!("credentials:{user_id}")
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
        assert_eq!(response("r1"), "trading:response:r1");
        assert_eq!(request_record("r1"), "trading:request:r1");
        assert_eq!(paper_orders("A1"), "paper:orders:A1");
        assert_eq!(paper_order_ids("A1"), "paper:order_ids:A1");
        assert_eq!(worker_active("u1"), "worker:active:u1");
        assert_eq!(pool_worker_active("w1"), "worker:active:-1:w1");
        assert_eq!(worker_metadata("u1"), "worker:metadata:u1");
        assert_eq!(worker_control("u1"), "worker:control:u1:messages");
        assert_eq!(credentials("u1"), "credentials:u1");
        assert_eq!(dead_letter(POOL_CLAIMS), "pool:claims:dead");
        assert!(pool_worker_active("w1").starts_with(&POOL_WORKER_ACTIVE_PATTERN[..16]));
    }
}
