//! Redis must never evict leasehold's keys: `maxmemory-policy noeviction`.
//!
//! Under memory pressure any other policy drops keys: a user's liveness mark
//! (two workers then serve one user), an `executing` request record (its order
//! is then placed again or answered wrongly), a grant, a sink stream. With
//! `noeviction` Redis refuses writes instead, which every role already reports
//! and retries. ElastiCache's default parameter group evicts (`volatile-lru`),
//! so every role reads the policy at start (`INFO memory`, which ElastiCache
//! allows where `CONFIG GET` is disabled) and refuses to run on anything else.

/// The one policy leasehold runs on.
pub const REQUIRED_POLICY: &str = "noeviction";

/// Why a Redis is not fit for leasehold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvictionError {
    /// It evicts keys under memory pressure.
    #[error(
        "{setting}: Redis runs with maxmemory-policy {policy}, which evicts keys under memory \
         pressure (liveness marks, in-flight request records); set maxmemory-policy noeviction \
         (on ElastiCache, in the parameter group)"
    )]
    Evicts {
        /// The variable naming this Redis (`REDIS_URL`, `SINK_URL`).
        setting: &'static str,
        /// The policy it runs with.
        policy: String,
    },
    /// The policy could not be read.
    #[error(
        "{setting}: cannot read Redis's maxmemory-policy with INFO memory ({problem}); \
         leasehold runs only on maxmemory-policy noeviction (the role's ACL needs +info)"
    )]
    Unreadable {
        /// The variable naming this Redis.
        setting: &'static str,
        /// What went wrong (never the URL).
        problem: String,
    },
}

/// The `maxmemory_policy` field of an `INFO memory` answer.
pub fn policy_of(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
}

/// Reads the policy of the Redis behind `connection` and refuses any but
/// `noeviction`. `setting` names the variable that points at it.
pub async fn require_noeviction(
    connection: &mut impl redis::aio::ConnectionLike,
    setting: &'static str,
) -> Result<(), EvictionError> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(connection)
        .await
        .map_err(|err| EvictionError::Unreadable {
            setting,
            problem: err.to_string(),
        })?;
    check(&info, setting)
}

fn check(info: &str, setting: &'static str) -> Result<(), EvictionError> {
    match policy_of(info) {
        Some(REQUIRED_POLICY) => Ok(()),
        Some(policy) => Err(EvictionError::Evicts {
            setting,
            policy: policy.to_owned(),
        }),
        None => Err(EvictionError::Unreadable {
            setting,
            problem: "the answer has no maxmemory_policy".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Memory\r\nused_memory:1024\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\nallocator_frag_ratio:1.00\r\n";

    #[test]
    fn only_noeviction_passes_and_the_error_names_the_setting_and_the_policy() {
        assert_eq!(policy_of(INFO), Some("noeviction"));
        assert_eq!(check(INFO, "REDIS_URL"), Ok(()));
        let evicting = INFO.replace("noeviction", "volatile-lru");
        let err = check(&evicting, "REDIS_URL").unwrap_err();
        assert_eq!(
            err,
            EvictionError::Evicts {
                setting: "REDIS_URL",
                policy: "volatile-lru".into()
            }
        );
        assert!(
            err.to_string()
                .starts_with("REDIS_URL: Redis runs with maxmemory-policy volatile-lru")
        );
        assert!(matches!(
            check("# Memory\r\n", "SINK_URL"),
            Err(EvictionError::Unreadable {
                setting: "SINK_URL",
                ..
            })
        ));
    }
}
