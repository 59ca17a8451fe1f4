//! Typed reads of the pool's state for the components that act on it: the
//! claim path, supervision, the credential sealer, rotation and pool workers.
//!
//! [`crate::read`] is the read model for those that only show or count (the
//! dashboard, the observer) and cannot see credentials. This is its
//! counterpart for domain code: each read names what it returns, builds its key
//! from [`crate::keys`] and parses the value with [`crate::protocol`], so no
//! caller spells a key or parses raw text. Every pool bus has it (anything that
//! can [`Inspect`] the keyspace).

use std::collections::BTreeSet;

use async_trait::async_trait;

use crate::bus::{BusError, Inspect};
use crate::keys;
use crate::protocol::{ClaimOutcome, CredentialsGrant, MarkValue, ParseError};

/// What the acting components read from the pool, typed.
#[async_trait]
pub trait PoolState: Send + Sync {
    /// The outcome of claim `claim_id` once settled (`pool:claim:{claim_id}`);
    /// `None` while pending. An outcome that does not parse is returned as the
    /// parse error, so the caller can say which field was wrong.
    async fn claim_outcome(
        &self,
        claim_id: &str,
    ) -> Result<Option<Result<ClaimOutcome, ParseError>>, BusError>;

    /// The user's live credentials grant (`pool:grant:{user_id}`). A grant
    /// that does not parse still exists: `Some(None)`.
    async fn credentials_grant(
        &self,
        user_id: &str,
    ) -> Result<Option<Option<CredentialsGrant>>, BusError>;

    /// The user's liveness mark (`worker:active:{user_id}`); `None` when absent
    /// or unreadable (an unreadable mark names no worker).
    async fn user_mark(&self, user_id: &str) -> Result<Option<MarkValue>, BusError>;

    /// An idle pool worker's mark (`pool:worker:active:{worker_id}`); `None`
    /// when absent or unreadable.
    async fn pool_mark(&self, worker_id: &str) -> Result<Option<MarkValue>, BusError>;

    /// The claims a pool worker has taken and not settled
    /// (`pool:claims:processing:{worker_id}`), as stored.
    async fn claims_taken_by(&self, worker_id: &str) -> Result<Vec<String>, BusError>;

    /// Every pool worker with a list of taken, unsettled claims (a SCAN: for
    /// the sweep and supervision, never a pool worker's hot path).
    async fn workers_with_taken_claims(&self) -> Result<Vec<String>, BusError>;

    /// Every user with a stored credentials blob (a SCAN of `credentials:*`).
    async fn users_with_credentials(&self) -> Result<Vec<String>, BusError>;

    /// Users with work waiting: queued or in-flight requests, or a "wants a
    /// worker" mark (a SCAN of each pattern; an empty list does not exist in
    /// Redis, so a key is work).
    async fn users_with_work(&self) -> Result<BTreeSet<String>, BusError>;
}

#[async_trait]
impl<T: Inspect + ?Sized> PoolState for T {
    async fn claim_outcome(
        &self,
        claim_id: &str,
    ) -> Result<Option<Result<ClaimOutcome, ParseError>>, BusError> {
        Ok(self
            .get(&keys::claim_outcome(claim_id))
            .await?
            .map(|text| ClaimOutcome::parse(&text)))
    }

    async fn credentials_grant(
        &self,
        user_id: &str,
    ) -> Result<Option<Option<CredentialsGrant>>, BusError> {
        Ok(self
            .get(&keys::credentials_grant(user_id))
            .await?
            .map(|text| serde_json::from_str(&text).ok()))
    }

    async fn user_mark(&self, user_id: &str) -> Result<Option<MarkValue>, BusError> {
        Ok(self
            .get(&keys::worker_active(user_id))
            .await?
            .and_then(|text| MarkValue::parse(&text)))
    }

    async fn pool_mark(&self, worker_id: &str) -> Result<Option<MarkValue>, BusError> {
        Ok(self
            .get(&keys::pool_worker_active(worker_id))
            .await?
            .and_then(|text| MarkValue::parse(&text)))
    }

    async fn claims_taken_by(&self, worker_id: &str) -> Result<Vec<String>, BusError> {
        self.list_items(&keys::claims_processing(worker_id)).await
    }

    async fn workers_with_taken_claims(&self) -> Result<Vec<String>, BusError> {
        Ok(self
            .scan_keys(keys::CLAIMS_PROCESSING_PATTERN)
            .await?
            .iter()
            .filter_map(|key| keys::claims_processing_owner(key).map(str::to_owned))
            .collect())
    }

    async fn users_with_credentials(&self) -> Result<Vec<String>, BusError> {
        let prefix = keys::credentials("");
        Ok(self
            .scan_keys(&keys::credentials("*"))
            .await?
            .iter()
            .filter_map(|key| key.strip_prefix(&prefix).map(str::to_owned))
            .collect())
    }

    async fn users_with_work(&self) -> Result<BTreeSet<String>, BusError> {
        let mut users = BTreeSet::new();
        for pattern in [
            keys::USER_REQUESTS_PATTERN,
            keys::USER_PROCESSING_PATTERN,
            keys::USER_WANTED_PATTERN,
        ] {
            for key in self.scan_keys(pattern).await? {
                if let Some(user) = keys::user_in(pattern, &key) {
                    users.insert(user);
                }
            }
        }
        Ok(users)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bus::memory::MemoryPoolBus;
    use crate::bus::{CredentialBus, MarkBus, MarkWrite, PoolBus, WorkerMetadata};
    use crate::protocol::GrantReason;

    fn mark(worker_id: &str, user_id: &str) -> MarkValue {
        MarkValue {
            worker_id: worker_id.into(),
            task_id: format!("task-{worker_id}"),
            user_id: user_id.into(),
            heartbeat_at: 1,
            started_at: 1,
            sidecar_url: None,
            ttl_ms: None,
            heartbeat_interval_ms: None,
            seal_key: None,
        }
    }

    /// Each typed read finds what the bus's own steps wrote, under the key the
    /// layout names, and reads absence as absence.
    #[tokio::test]
    async fn typed_reads_find_what_the_bus_steps_wrote() {
        let bus = MemoryPoolBus::new();
        let metadata = WorkerMetadata {
            task_arn: "arn".into(),
            instance_id: "host".into(),
            launched_at: 1,
            sidecar_url: None,
        };
        assert_eq!(bus.user_mark("u1").await.unwrap(), None);
        let value = mark("w1", "u1").to_json();
        let write = MarkWrite {
            user_id: "u1",
            worker_id: "w1",
            value: &value,
            ttl: Duration::from_secs(60),
            metadata: &metadata,
        };
        assert!(bus.claim_user(&write).await.unwrap());
        assert_eq!(bus.user_mark("u1").await.unwrap().unwrap().worker_id, "w1");

        let idle = mark("w2", "").to_json();
        bus.set_pool_mark("w2", &idle, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(bus.pool_mark("w2").await.unwrap().unwrap().worker_id, "w2");
        assert_eq!(bus.pool_mark("w3").await.unwrap(), None);

        assert_eq!(bus.credentials_grant("u1").await.unwrap(), None);
        let grant = CredentialsGrant::new(GrantReason::Reload, 5);
        bus.grant_credentials("u1", &grant.to_json(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            bus.credentials_grant("u1").await.unwrap(),
            Some(Some(grant))
        );

        bus.put_credentials("u1", "blob").await.unwrap();
        bus.put_credentials("u2", "blob").await.unwrap();
        let mut users = bus.users_with_credentials().await.unwrap();
        users.sort();
        assert_eq!(users, ["u1", "u2"]);

        bus.push_request("u3", "{}").await.unwrap();
        assert_eq!(
            bus.users_with_work().await.unwrap(),
            BTreeSet::from(["u3".to_owned()])
        );

        assert_eq!(bus.claim_outcome("c1").await.unwrap(), None);
        assert!(bus.workers_with_taken_claims().await.unwrap().is_empty());
        bus.push_claim("a claim").await.unwrap();
        bus.take_claim(
            "w2",
            Duration::from_millis(10),
            &tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(bus.claims_taken_by("w2").await.unwrap(), ["a claim"]);
        assert_eq!(bus.workers_with_taken_claims().await.unwrap(), ["w2"]);
    }
}
