//! What each subcommand may call on AWS: its IAM declaration.
//!
//! Each subcommand declares its actions at start ([`declare`]); from then on
//! every AWS call (made in one place per service, which names the call's IAM
//! actions: `leasehold_platform::iam`) that needs an action the declaration
//! lacks fails before it is sent. The real-process tests run every
//! subcommand's paths (the broker pool's cold starts through the local
//! launcher, the stream worker and sidecar against a DynamoDB-compatible
//! server, the sealer against KMS), so a call the declaration lacks fails a
//! test; the tests below compare each ECS task role's declarations with its
//! policies in `deploy/iam/`, both ways.

use leasehold_broker::settings as broker_settings;
use leasehold_platform::iam::{self as platform_iam, Declaration, IamAction};
use leasehold_platform::iam::{cloudwatch, dynamodb, ecs, kms, roles};
use leasehold_platform::settings::{Env, Lookup};
use leasehold_sidecar::cloudwatch::Mode;
use leasehold_sidecar::settings as sidecar_settings;

/// The stream worker: its lease keeper (conditional updates, session
/// takeovers), discovery (scan, or the assignee index), registrations, and
/// the start-up table check.
pub(crate) const STREAM_WORKER: &[IamAction] = &[
    dynamodb::CONDITION_CHECK_ITEM,
    dynamodb::DESCRIBE_TABLE,
    dynamodb::GET_ITEM,
    dynamodb::PUT_ITEM,
    dynamodb::QUERY,
    dynamodb::SCAN,
    dynamodb::UPDATE_ITEM,
];

/// The sidecar's observer: the `leasehold#observer` lease (read, then
/// conditional updates) and the scans behind the cluster gauges.
pub(crate) const SIDECAR_OBSERVER: &[IamAction] =
    &[dynamodb::GET_ITEM, dynamodb::UPDATE_ITEM, dynamodb::SCAN];

/// The sidecar with `CLOUDWATCH_MODE=api`.
pub(crate) const SIDECAR_CLOUDWATCH_API: &[IamAction] = &[cloudwatch::PUT_METRIC_DATA];

/// The dashboard reads the lease table.
pub(crate) const DASHBOARD: &[IamAction] = &[dynamodb::GET_ITEM, dynamodb::SCAN];

/// The pool manager starts pool workers and stops surplus ones.
pub(crate) const POOL_MANAGER: &[IamAction] = &[ecs::RUN_TASK, roles::PASS_ROLE, ecs::STOP_TASK];

/// Maintenance lists the broker cluster's tasks (orphan sweep, supervision),
/// stops orphans, and re-serves a dead worker's user with a cold start.
pub(crate) const MAINTENANCE: &[IamAction] = &[
    ecs::LIST_TASKS,
    ecs::DESCRIBE_TASKS,
    ecs::STOP_TASK,
    ecs::RUN_TASK,
    roles::PASS_ROLE,
];

/// `leasehold claim` (the API side) may cold-start a worker for the user.
pub(crate) const CLAIM: &[IamAction] = &[ecs::RUN_TASK, roles::PASS_ROLE];

/// The credential sealer unwraps data keys, and nothing else.
pub(crate) const CREDENTIAL_SEALER: &[IamAction] = &[kms::DECRYPT];

/// The broker worker as deployed calls no AWS API: the sealer seals its
/// user's credentials to its own key.
pub(crate) const BROKER_WORKER: &[IamAction] = &[];

/// A broker worker given a KMS key (`CREDENTIALS_KMS_KEY_ID`, a self-managed
/// setup without the sealer) unwraps its user's data key itself. The deployed
/// task definition never sets the key (scripts/check_task_definitions.py).
pub(crate) const BROKER_WORKER_WITH_KMS: &[IamAction] = &[kms::DECRYPT];

/// `leasehold credentials put` / `rotate` (an operator): wrap new data keys,
/// re-wrap existing ones under the current key.
pub(crate) const CREDENTIALS_OPERATOR: &[IamAction] = &[
    kms::GENERATE_DATA_KEY,
    kms::RE_ENCRYPT_FROM,
    kms::RE_ENCRYPT_TO,
];

/// The sidecar's actions for its configuration.
fn sidecar(observer: bool, cloudwatch_api: bool) -> &'static [IamAction] {
    const BOTH: &[IamAction] = &[
        dynamodb::GET_ITEM,
        dynamodb::UPDATE_ITEM,
        dynamodb::SCAN,
        cloudwatch::PUT_METRIC_DATA,
    ];
    match (observer, cloudwatch_api) {
        (true, true) => BOTH,
        (true, false) => SIDECAR_OBSERVER,
        (false, true) => SIDECAR_CLOUDWATCH_API,
        (false, false) => &[],
    }
}

/// The actions of `subcommand` (as typed) run with the settings `lookup`
/// gives; `None` for a subcommand that declares nothing (it runs unchecked:
/// `dev`, the operator's `table` and `leases`, `feed`, `redis`).
pub(crate) fn actions(subcommand: &str, lookup: Lookup) -> Option<&'static [IamAction]> {
    Some(match subcommand {
        "stream-worker" => STREAM_WORKER,
        "sidecar" => {
            let mut env = Env::new(lookup);
            let observer = env.get(&sidecar_settings::SIDECAR_OBSERVER);
            let api = env.get(&sidecar_settings::CLOUDWATCH_MODE) == Mode::Api;
            sidecar(observer, api)
        }
        "dashboard" => DASHBOARD,
        "pool-manager" => POOL_MANAGER,
        "maintenance" => MAINTENANCE,
        "claim" => CLAIM,
        "credential-sealer" => CREDENTIAL_SEALER,
        "broker-worker" => {
            let mut env = Env::new(lookup);
            match env.optional(&broker_settings::CREDENTIALS_KMS_KEY_ID) {
                Some(_) => BROKER_WORKER_WITH_KMS,
                None => BROKER_WORKER,
            }
        }
        "credentials" => CREDENTIALS_OPERATOR,
        _ => return None,
    })
}

/// Declares this process's actions: `subcommand` with `lookup`'s settings.
pub(crate) fn declare(subcommand: &'static str, lookup: Lookup) {
    if let Some(actions) = actions(subcommand, lookup) {
        platform_iam::declare(Declaration {
            subcommand,
            actions,
        });
    }
}

#[cfg(test)]
mod tests;
