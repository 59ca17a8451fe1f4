//! One pool bus conformance suite, run against both buses (the in-memory bus
//! must behave as the Redis layout of docs/redis.md does).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use leasehold_testkit::pool_bus::{MemoryTarget, RedisTarget};

mod memory {
    use super::*;
    leasehold_testkit::pool_bus_conformance_suite!(async { Some(MemoryTarget::new()) });
}

mod redis {
    use super::*;
    leasehold_testkit::pool_bus_conformance_suite!(RedisTarget::connect());
}

/// The credential sealer's per-claim Redis users on a real Redis.
mod claim_users {
    use leasehold_pool::claim_users::{ClaimUsers, login_url};
    use leasehold_pool::keys;
    use leasehold_testkit::{redis_url, unique_name};

    async fn connect_as(url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A claim for a user whose previous holder still has connections open:
    /// the new login ends them (a new password alone would not), and the new
    /// holder's works.
    #[tokio::test]
    async fn a_new_claim_login_ends_the_displaced_holders_connections() {
        let Some(url) = redis_url() else {
            return;
        };
        let users = ClaimUsers::connect(&url).await.unwrap();
        let user_id = unique_name("u");
        let mark = keys::worker_active(&user_id);
        let first = users.create(&user_id).await.unwrap();
        let mut displaced = connect_as(&login_url(&url, &first).unwrap()).await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&mark)
            .query_async(&mut displaced)
            .await
            .unwrap();
        assert!(!exists);
        let second = users.create(&user_id).await.unwrap();
        let after: redis::RedisResult<bool> = redis::cmd("EXISTS")
            .arg(&mark)
            .query_async(&mut displaced)
            .await;
        assert!(
            after.is_err(),
            "the displaced holder's connection still serves the user"
        );
        let mut holder = connect_as(&login_url(&url, &second).unwrap()).await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&mark)
            .query_async(&mut holder)
            .await
            .unwrap();
        assert!(!exists);
        let mut admin = connect_as(&url).await;
        let _: u64 = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&second.user)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
}
