//! AWS SDK configuration, with the retry policy that fits each caller.
//!
//! The lease keeper owns its retries: it backs off with jitter and never past the
//! holder's deadline, so an SDK retry hidden inside a renew would only eat the time
//! the keeper budgets. Other callers (the ECS launcher, CloudWatch, the operator
//! CLI's table creation) have no such deadline and want the SDK's standard retries,
//! so one throttled `RunTask` does not fail a user's cold start.

use std::time::Duration;

use crate::settings::ConfigError;

/// Who retries a failed AWS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// The caller retries (lease store under the keeper): one attempt, short
    /// per-attempt timeout, because a renew that hangs is worth less than one
    /// that fails.
    CallerRetries,
    /// The SDK's standard mode: up to 3 attempts with backoff and jitter, for
    /// calls without a lease deadline (ECS, CloudWatch).
    Standard,
}

impl RetryPolicy {
    fn retry_config(self) -> aws_config::retry::RetryConfig {
        match self {
            RetryPolicy::CallerRetries => aws_config::retry::RetryConfig::disabled(),
            RetryPolicy::Standard => {
                aws_config::retry::RetryConfig::standard().with_max_attempts(3)
            }
        }
    }

    fn timeout_config(self) -> aws_config::timeout::TimeoutConfig {
        let builder =
            aws_config::timeout::TimeoutConfig::builder().connect_timeout(Duration::from_secs(2));
        match self {
            RetryPolicy::CallerRetries => builder
                .operation_attempt_timeout(Duration::from_secs(5))
                .build(),
            RetryPolicy::Standard => builder
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        }
    }
}

/// The AWS SDK's standard configuration chain (environment, profiles, ECS task
/// role) with `policy`'s retries and timeouts.
pub async fn sdk_config(policy: RetryPolicy) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(policy.timeout_config())
        .retry_config(policy.retry_config())
        .load()
        .await
}

/// A configuration for a local AWS-compatible server (`dev --dynamodb-endpoint`,
/// the test command's server): `policy`'s retries and timeouts, that endpoint,
/// and placeholder region and credentials, which a local server accepts. It
/// never reads the environment's AWS configuration, so nothing built from it can
/// reach a real account.
pub fn local_sdk_config(policy: RetryPolicy, endpoint: &str) -> aws_config::SdkConfig {
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::SharedCredentialsProvider;
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "local",
            "local",
            None,
            None,
            "leasehold-local",
        )))
        .retry_config(policy.retry_config())
        .timeout_config(policy.timeout_config())
        .build()
}

/// Adds the missing-region problem to a settings result: every leasehold AWS
/// client needs a region, and a missing one is a configuration error (exit 2)
/// listed with the others.
pub fn require_region<T>(
    config: &aws_config::SdkConfig,
    settings: Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let missing = config.region().is_none().then(|| {
        format!(
            "{}: not set, and no region in the AWS profile",
            crate::logging::AWS_REGION.name
        )
    });
    match (settings, missing) {
        (Ok(settings), None) => Ok(settings),
        (Ok(_), Some(problem)) => Err(ConfigError {
            problems: vec![problem],
        }),
        (Err(mut err), missing) => {
            err.problems.extend(missing);
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_keeper_keeps_sdk_retries_off_and_others_get_standard_retries() {
        let keeper = sdk_config(RetryPolicy::CallerRetries).await;
        assert_eq!(keeper.retry_config().unwrap().max_attempts(), 1);
        let ecs = sdk_config(RetryPolicy::Standard).await;
        assert_eq!(ecs.retry_config().unwrap().max_attempts(), 3);
        assert!(ecs.timeout_config().unwrap().operation_timeout().is_some());
    }
}

/// What the AWS SDK says when no credential source answered (the
/// environment, a profile, the ECS task role, the instance role).
pub const NO_CREDENTIALS: &str = "no AWS credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and \
     AWS_SECRET_ACCESS_KEY, or run under an ECS task role";

/// One line for a request that never got an answer (an SDK dispatch
/// failure): the innermost cause's text, or [`NO_CREDENTIALS`]. The SDK's own
/// text for these is its `Debug` dump of the whole chain (response headers
/// included), about 1.5 KB for a missing credential.
pub fn unanswered(err: &(dyn std::error::Error + 'static)) -> String {
    let mut causes = Vec::new();
    let mut next = Some(err);
    while let Some(cause) = next {
        causes.push(cause.to_string());
        next = cause.source();
    }
    let credentials = [
        "loading credentials",
        "no credentials",
        "no providers in chain",
    ];
    if causes
        .iter()
        .any(|c| credentials.iter().any(|words| c.contains(words)))
    {
        return NO_CREDENTIALS.to_owned();
    }
    // The innermost cause is the specific one ("Connection refused (os error
    // 111)"); the outer ones wrap it in generic words.
    let innermost = causes
        .iter()
        .rev()
        .find(|c| !c.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| "no answer".to_owned());
    // Only its first line: the SDK appends `(Debug…)` to some of them.
    let line = innermost.lines().next().unwrap_or_default();
    match line.find(" (") {
        Some(at) if line[at..].contains('{') => line[..at].to_owned(),
        _ => line.to_owned(),
    }
}

#[cfg(test)]
mod unanswered_tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn a_missing_credential_and_a_refused_connection_are_one_short_line() {
        let credentials = Layer(
            "dispatch failure",
            Some(Box::new(Layer(
                "other: an error occurred while loading credentials: failed to load IMDS session token (ProviderError(ProviderError { source: … }))",
                None,
            ))),
        );
        assert_eq!(unanswered(&credentials), NO_CREDENTIALS);
        let refused = Layer(
            "dispatch failure",
            Some(Box::new(Layer(
                "io error",
                Some(Box::new(Layer(
                    "tcp connect error (Os { code: 111, kind: ConnectionRefused })",
                    None,
                ))),
            ))),
        );
        assert_eq!(unanswered(&refused), "tcp connect error");
    }
}
