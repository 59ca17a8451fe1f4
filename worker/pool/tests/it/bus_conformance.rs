//! One pool bus conformance suite, run against both buses (the in-memory bus
//! must behave as the Redis layout of docs/redis.md does).

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
    use std::time::Duration;

    use leasehold_pool::bus::PoolBus;
    use leasehold_pool::bus::assign::SealHolder;
    use leasehold_pool::bus::redis::RedisPoolBus;
    use leasehold_pool::claim_users::{ClaimUsers, login_url, new_password, password_hash};
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
        let first = users.create(&user_id, &new_password()).await.unwrap();
        let mut displaced = connect_as(&login_url(&url, &first).unwrap()).await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&mark)
            .query_async(&mut displaced)
            .await
            .unwrap();
        assert!(!exists);
        let second = users.create(&user_id, &new_password()).await.unwrap();
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

    /// Redis does not replicate users: after a failover or an `ACL LOAD`
    /// (here `ACL DELUSER`), the sealer makes a claim user again from the
    /// hash in its holder record, with the password the worker has, but only
    /// while that holder still holds the user.
    #[tokio::test]
    async fn a_dropped_claim_user_is_made_again_for_its_live_holder_only() {
        let Some(url) = redis_url() else {
            return;
        };
        let users = ClaimUsers::connect(&url).await.unwrap();
        let bus = RedisPoolBus::connect(&url).await.unwrap();
        let mut admin = connect_as(&url).await;
        let hour = Duration::from_secs(3_600);
        let (held, displaced) = (unique_name("u"), unique_name("u"));
        let mut logins = Vec::new();
        for (user_id, mark_holder) in [(&held, "w1"), (&displaced, "w2")] {
            let password = new_password();
            let holder = SealHolder {
                worker_id: "w1".into(),
                seal_key: "K1".into(),
                bound_to: "c1".into(),
                login_hash: password_hash(&password),
            };
            let mark = format!(r#"{{"worker_id":"{mark_holder}"}}"#);
            assert!(
                bus.set_if_absent(&keys::seal_holder(user_id), &holder.to_json(), hour)
                    .await
                    .unwrap()
            );
            assert!(
                bus.set_if_absent(&keys::worker_active(user_id), &mark, hour)
                    .await
                    .unwrap()
            );
            let _: u64 = redis::cmd("ZADD")
                .arg(keys::SEAL_HOLDERS)
                .arg(0)
                .arg(user_id.as_str())
                .query_async(&mut admin)
                .await
                .unwrap();
            let login = users.create(user_id, &password).await.unwrap();
            let _: u64 = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&login.user)
                .query_async(&mut admin)
                .await
                .unwrap();
            logins.push(login);
        }
        let restored = users.restore().await.unwrap();
        assert!(restored >= 1, "{restored}");
        // The live holder logs in again with the password it was given.
        let mut again = connect_as(&login_url(&url, &logins[0]).unwrap()).await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(keys::worker_active(&held))
            .query_async(&mut again)
            .await
            .unwrap();
        assert!(exists);
        // A recorded holder another worker displaced gets nothing back.
        let names: Vec<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(names.contains(&logins[0].user));
        assert!(!names.contains(&logins[1].user), "{names:?}");
        let _: u64 = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&logins[0].user)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
}
