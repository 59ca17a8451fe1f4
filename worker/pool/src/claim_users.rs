//! Per-claim Redis users (self-managed Redis/Valkey, which take `ACL
//! SETUSER`): the credential sealer makes `leasehold-claim-{user_id}` when it
//! seals a claimed user's credentials, confined to that user's keys, and
//! hands the login to the worker inside the sealed answer. A claimed worker
//! serves its user through it, so the pool-wide `broker-worker` user needs no
//! access to any user's queues, control messages, request records or
//! responses. The sealer deletes a claim user once the user has no worker
//! and no pending grant (Redis has no TTL for users).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

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

/// Makes and deletes claim users (the credential sealer's Redis user needs
/// `+acl|setuser +acl|deluser +acl|users +client|kill`).
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
        let commands = ConnectionManager::new_with_config(
            client,
            ConnectionManagerConfig::new()
                .set_response_timeout(Some(Duration::from_secs(5)))
                .set_connection_timeout(Some(Duration::from_secs(2))),
        )
        .await
        .map_err(classify)?;
        Ok(ClaimUsers { commands })
    }

    /// (Re)makes `user_id`'s claim user with a fresh password: a previous
    /// holder's password stops working, and its open connections are ended.
    pub async fn create(&self, user_id: &str) -> Result<RedisLogin, BusError> {
        let password: String = rand::random::<[u8; 32]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let user = claim_user_name(user_id);
        let mut command = redis::cmd("ACL");
        command.arg("SETUSER").arg(&user);
        for rule in claim_user_rules(user_id) {
            command.arg(rule);
        }
        command.arg(format!(">{password}"));
        let set: Result<(), redis::RedisError> =
            command.query_async(&mut self.commands.clone()).await;
        // Redis's error can quote the modifier it refused, the password
        // included: only its kind is passed on.
        set.map_err(|err| match classify(err) {
            BusError::Unavailable(_) => BusError::Unavailable("ACL SETUSER".into()),
            _ => BusError::Rejected(format!("ACL SETUSER {user} was refused")),
        })?;
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
        Ok(RedisLogin { user, password })
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
}
