//! Per-claim Redis users (self-managed Redis/Valkey, which take `ACL
//! SETUSER`): the credential sealer makes `leasehold-claim-{user_id}` when it
//! seals a claimed user's credentials, confined to that user's keys, and
//! hands the login to the worker inside the sealed answer. A claimed worker
//! serves its user through it, so the pool-wide `broker-worker` user needs no
//! access to any user's queues, control messages, request records or
//! responses. The sealer deletes a claim user once the user has no worker
//! and no pending grant (Redis has no TTL for users).
//!
//! Redis does not replicate users: a failover to a replica, or an operator's
//! `ACL LOAD`, drops every claim user and with it every claimed worker's
//! login. The sealer keeps the SHA-256 of each holder's password in the
//! holder record it alone writes (`pool:holder:{user_id}`, which does
//! replicate) and makes a missing claim user again from it
//! ([`ClaimUsers::restore`]) while that holder still holds the user: the
//! worker's reconnect then logs in with the password it has.

use redis::aio::ConnectionManager;

use crate::bus::assign::{MarkSeen, SealHolder};
use crate::bus::redis::classify;
use crate::bus::{BusError, PoolBus};
use crate::keys;

/// Every claim user's name starts with this.
pub const CLAIM_USER_PREFIX: &str = "leasehold-claim-";

/// The Redis user a claimed worker of `user_id` logs in as.
pub fn claim_user_name(user_id: &str) -> String {
    format!("{CLAIM_USER_PREFIX}{user_id}")
}

/// The user a claim user serves, from its name.
pub fn claim_user_of(name: &str) -> Option<&str> {
    name.strip_prefix(CLAIM_USER_PREFIX)
        .filter(|user| keys::valid_user_id(user))
}

/// A claim user's rules, without its password: the user's mark and metadata,
/// its request and control lists (with their processing and dead-letter
/// lists), and its own request records and responses (keyed by user, so the
/// pattern reaches no other user's: user ids hold no `:` and no glob
/// character, [`keys::valid_user_id`]). The commands are those the claimed
/// phase's functions and blocking moves send.
pub fn claim_user_rules(user_id: &str) -> Vec<String> {
    let mut rules: Vec<String> = ["reset", "on", "resetchannels", "-@all"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    for key in [
        keys::worker_active(user_id),
        keys::worker_metadata(user_id),
        keys::user_requests(user_id),
        keys::dead_letter(&keys::user_requests(user_id)),
        keys::user_processing(user_id),
        keys::worker_control(user_id),
        keys::dead_letter(&keys::worker_control(user_id)),
        keys::worker_control_processing(user_id),
        keys::request_record(user_id, "*"),
        keys::response(user_id, "*"),
    ] {
        rules.push(format!("~{key}"));
    }
    for command in [
        "fcall",
        "multi",
        "exec",
        "client|id",
        "client|unblock",
        "get",
        "set",
        "del",
        "exists",
        "pttl",
        "expire",
        "lpush",
        "rpush",
        "rpop",
        "lmove",
        "blmove",
        "lindex",
        "lrem",
        "lrange",
        "llen",
        "ltrim",
        "hset",
        "hget",
        "incr",
        "time",
    ] {
        rules.push(format!("+{command}"));
    }
    rules
}

/// A fresh claim-user password: 64 hex digits of randomness.
pub fn new_password() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The SHA-256 of `password` as Redis keeps it (`#<hex>` in `ACL SETUSER`).
pub fn password_hash(password: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A Redis login handed to one claimed worker.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisLogin {
    /// The Redis user name.
    pub user: String,
    /// Its password (64 hex digits, random per claim).
    pub password: String,
}

impl std::fmt::Debug for RedisLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLogin")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// `base` (a `redis://` or `rediss://` URL) logging in as `login` instead of
/// whoever it names; the error never shows either URL.
pub fn login_url(base: &str, login: &RedisLogin) -> Result<String, BusError> {
    let invalid = || BusError::Config("the Redis URL cannot carry a claim login".into());
    let mut url = url::Url::parse(base).map_err(|_| invalid())?;
    url.set_username(&login.user).map_err(|_| invalid())?;
    url.set_password(Some(&login.password))
        .map_err(|_| invalid())?;
    Ok(url.into())
}

/// Makes, deletes and restores claim users (the credential sealer's Redis
/// user needs `+acl|setuser +acl|deluser +acl|users +client|kill`, and
/// `+zadd +zrange +zrem +del` on `pool:holders` and `pool:holder:*`).
pub struct ClaimUsers {
    commands: ConnectionManager,
}

impl std::fmt::Debug for ClaimUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimUsers").finish_non_exhaustive()
    }
}

impl ClaimUsers {
    /// Connects to the Redis at `url` (never part of an error).
    pub async fn connect(url: &str) -> Result<Self, BusError> {
        let client = redis::Client::open(url)
            .map_err(|err| BusError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let commands =
            ConnectionManager::new_with_config(client, crate::bus::redis::manager_config(false))
                .await
                .map_err(classify)?;
        Ok(ClaimUsers { commands })
    }

    /// (Re)makes `user_id`'s claim user with `password` (from
    /// [`new_password`]): a previous holder's password stops working, and its
    /// open connections are ended. The sealer calls it only after its assign
    /// step made the asker the user's holder, so it never resets the login of
    /// a live holder.
    pub async fn create(&self, user_id: &str, password: &str) -> Result<RedisLogin, BusError> {
        let user = claim_user_name(user_id);
        self.set_user(user_id, &format!(">{password}")).await?;
        // A new password stops only new connections: a displaced holder's
        // open ones would go on serving the user. They end here, before the
        // new holder has the login to connect with.
        let _killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("USER")
            .arg(&user)
            .query_async(&mut self.commands.clone())
            .await
            .map_err(classify)?;
        Ok(RedisLogin {
            user,
            password: password.to_owned(),
        })
    }

    /// `ACL SETUSER leasehold-claim-{user_id}` with its rules and one
    /// password modifier (`>password` or `#sha256`).
    async fn set_user(&self, user_id: &str, password: &str) -> Result<(), BusError> {
        let user = claim_user_name(user_id);
        let mut command = redis::cmd("ACL");
        command.arg("SETUSER").arg(&user);
        for rule in claim_user_rules(user_id) {
            command.arg(rule);
        }
        command.arg(password);
        let set: Result<(), redis::RedisError> =
            command.query_async(&mut self.commands.clone()).await;
        // Redis's error can quote the modifier it refused, the password
        // included: only its kind is passed on.
        set.map_err(|err| match classify(err) {
            BusError::Unavailable(_) => BusError::Unavailable("ACL SETUSER".into()),
            _ => BusError::Rejected(format!("ACL SETUSER {user} was refused")),
        })
    }

    /// Makes again, from the hash in its holder record, the claim user of
    /// every user whose recorded holder still holds the user's mark and whose
    /// claim user is gone (a failover or an `ACL LOAD`); forgets the holder
    /// record of a user that has neither a worker nor a grant. Walks
    /// `pool:holders`, never the keyspace. Returns how many it made again.
    pub async fn restore(&self) -> Result<u64, BusError> {
        let mut redis = self.commands.clone();
        let existing: std::collections::HashSet<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async::<Vec<String>>(&mut redis)
            .await
            .map_err(classify)?
            .into_iter()
            .collect();
        let users: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys::SEAL_HOLDERS)
            .arg(0)
            .arg(-1)
            .query_async(&mut redis)
            .await
            .map_err(classify)?;
        let mut restored = 0;
        for user_id in users.iter().filter(|user| keys::valid_user_id(user)) {
            let (holder, mark, grant): (Option<String>, Option<String>, Option<String>) =
                redis::pipe()
                    .get(keys::seal_holder(user_id))
                    .get(keys::worker_active(user_id))
                    .get(keys::credentials_grant(user_id))
                    .query_async(&mut redis)
                    .await
                    .map_err(classify)?;
            let holder = holder.and_then(|text| serde_json::from_str::<SealHolder>(&text).ok());
            let held = holder.as_ref().is_some_and(|holder| {
                MarkSeen::of(mark.as_deref()) == MarkSeen::Held(holder.worker_id.clone())
            });
            if mark.is_none() && grant.is_none() {
                let _: () = redis::pipe()
                    .zrem(keys::SEAL_HOLDERS, user_id)
                    .del(keys::seal_holder(user_id))
                    .query_async(&mut redis)
                    .await
                    .map_err(classify)?;
                continue;
            }
            let Some(holder) = holder.filter(|_| held) else {
                continue;
            };
            let hash = holder.login_hash.to_ascii_lowercase();
            if existing.contains(&claim_user_name(user_id))
                || hash.len() != 64
                || !hash.bytes().all(|b| b.is_ascii_hexdigit())
            {
                continue;
            }
            self.set_user(user_id, &format!("#{hash}")).await?;
            restored += 1;
        }
        Ok(restored)
    }

    /// Deletes every claim user whose user has no worker (`worker:active:{user_id}`)
    /// and no pending grant; returns how many.
    pub async fn sweep(&self, bus: &dyn PoolBus) -> Result<u64, BusError> {
        let names: Vec<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async(&mut self.commands.clone())
            .await
            .map_err(classify)?;
        let mut deleted = 0;
        for name in names {
            let Some(user_id) = claim_user_of(&name) else {
                continue;
            };
            if bus.get(&keys::worker_active(user_id)).await?.is_some()
                || bus.get(&keys::credentials_grant(user_id)).await?.is_some()
            {
                continue;
            }
            let gone: u64 = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&name)
                .query_async(&mut self.commands.clone())
                .await
                .map_err(classify)?;
            deleted += gone;
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_user_is_confined_to_its_users_keys() {
        let rules = claim_user_rules("alice");
        assert_eq!(&rules[..4], ["reset", "on", "resetchannels", "-@all"]);
        let patterns: Vec<&str> = rules.iter().filter_map(|r| r.strip_prefix('~')).collect();
        for pattern in &patterns {
            assert!(
                pattern.contains("alice") || pattern.ends_with(":*"),
                "{pattern}"
            );
            assert!(!pattern.starts_with("credentials"), "{pattern}");
        }
        assert!(patterns.contains(&"trading:user:alice:requests"));
        assert!(!patterns.iter().any(|p| p.starts_with("pool:")));
        assert_eq!(claim_user_of(&claim_user_name("alice")), Some("alice"));
        assert_eq!(claim_user_of("leasehold-claim-a*b"), None);
        assert_eq!(claim_user_of("admin"), None);
    }

    #[test]
    fn a_login_replaces_the_urls_user_and_never_shows_in_debug() {
        let login = RedisLogin {
            user: "leasehold-claim-alice".into(),
            password: "0123abcd".into(),
        };
        assert_eq!(
            login_url("rediss://broker-worker:pw@cache.example:6380/0", &login).unwrap(),
            "rediss://leasehold-claim-alice:0123abcd@cache.example:6380/0"
        );
        assert_eq!(
            login_url("redis://127.0.0.1:6379", &login).unwrap(),
            "redis://leasehold-claim-alice:0123abcd@127.0.0.1:6379"
        );
        assert!(!format!("{login:?}").contains("0123abcd"));
        assert!(login_url("not a url", &login).is_err());
    }

    #[test]
    fn a_password_hash_is_the_sha256_redis_keeps() {
        // `echo -n abc | sha256sum`
        assert_eq!(
            password_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(new_password().len(), 64);
        assert_ne!(new_password(), new_password());
    }
}
