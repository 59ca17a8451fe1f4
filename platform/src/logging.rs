//! Log output: one line per event on stderr, filtered by `LEASEHOLD_LOG`.

use crate::settings::{Documented, External, Fallback, Setting, parse};

/// The `LEASEHOLD_LOG` variable.
pub const LEASEHOLD_LOG: Setting<String> = Setting::new(
    "LEASEHOLD_LOG",
    parse::TEXT,
    Fallback::Value(|| "warn".to_owned()),
    "Log filter for every subcommand (`tracing` env-filter syntax, e.g. `info` or \
     `leasehold_control=debug`); `dev` defaults to `error`.",
);

/// The AWS SDK's own variables, documented here because users set them.
pub const AWS_REGION: External = External {
    name: "AWS_REGION",
    doc: "AWS region (read by the AWS SDK; profiles and the ECS task environment also work).",
};
/// Endpoint override for every AWS service (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL: External = External {
    name: "AWS_ENDPOINT_URL",
    doc: "Endpoint for all AWS APIs, e.g. a local DynamoDB-compatible server (read by the AWS SDK).",
};
/// Endpoint override for DynamoDB only (read by the AWS SDK itself).
pub const AWS_ENDPOINT_URL_DYNAMODB: External = External {
    name: "AWS_ENDPOINT_URL_DYNAMODB",
    doc: "Endpoint for DynamoDB only (read by the AWS SDK).",
};

/// Every variable of the process environment itself, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &LEASEHOLD_LOG,
    &AWS_REGION,
    &AWS_ENDPOINT_URL,
    &AWS_ENDPOINT_URL_DYNAMODB,
    &crate::ecs::ECS_CONTAINER_METADATA_URI_V4,
];

/// Logs to stderr with the filter from `LEASEHOLD_LOG`, else `default`.
pub fn init(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env(LEASEHOLD_LOG.name).unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
