//! IAM: the name of every AWS action the code calls, and the actions each
//! subcommand declares for its task role.
//!
//! Every AWS call is made in one place per service (the DynamoDB lease store,
//! the ECS launcher, the KMS credentials cipher, the CloudWatch exporter), and
//! that place asks [`authorize`] for the actions the call needs before it
//! sends. A subcommand declares its actions once at start ([`declare`]); from
//! then on a call whose action the declaration lacks fails here, naming the
//! subcommand and the action, instead of being refused by AWS on a first
//! deployment. A test compares every role's declarations with its policy in
//! `deploy/iam/` both ways (a call without a grant fails; a grant without a
//! call is reported), and the real-process tests run each subcommand's real
//! paths under its declaration, so the policy cannot lag behind the code.
//!
//! The local launcher asks too (for the ECS call the deployed launcher would
//! make), so the real-process broker tests, which launch local processes,
//! exercise the same declarations; the in-memory lease store does not (only
//! `dev` uses it, undeclared). Without a declaration (library tests, `dev`)
//! every call passes.

use std::fmt;
use std::sync::OnceLock;

/// One IAM action, `service:Action`, exactly as a policy names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IamAction(&'static str);

impl IamAction {
    /// The action as a policy names it.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for IamAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// DynamoDB: the lease table.
pub mod dynamodb {
    use super::IamAction;
    /// `GetItem` (strongly and eventually consistent reads).
    pub const GET_ITEM: IamAction = IamAction("dynamodb:GetItem");
    /// `PutItem` (registering a stream).
    pub const PUT_ITEM: IamAction = IamAction("dynamodb:PutItem");
    /// `UpdateItem` (every conditional lease write).
    pub const UPDATE_ITEM: IamAction = IamAction("dynamodb:UpdateItem");
    /// `Scan` (discovery, listings).
    pub const SCAN: IamAction = IamAction("dynamodb:Scan");
    /// `Query` (the assignee index).
    pub const QUERY: IamAction = IamAction("dynamodb:Query");
    /// A `TransactWriteItems` item that only checks a condition (session
    /// takeover). AWS authorises a transaction by its items' actions; there is
    /// no `dynamodb:TransactWriteItems` action.
    pub const CONDITION_CHECK_ITEM: IamAction = IamAction("dynamodb:ConditionCheckItem");
    /// `DescribeTable` (the start-up check that the table exists).
    pub const DESCRIBE_TABLE: IamAction = IamAction("dynamodb:DescribeTable");
    /// `CreateTable` (`leasehold table create`).
    pub const CREATE_TABLE: IamAction = IamAction("dynamodb:CreateTable");
    /// `UpdateTable` (adding the assignee index to an older table).
    pub const UPDATE_TABLE: IamAction = IamAction("dynamodb:UpdateTable");
}

/// ECS: broker worker tasks.
pub mod ecs {
    use super::IamAction;
    /// `RunTask` (a pool worker, or a cold start for a user).
    pub const RUN_TASK: IamAction = IamAction("ecs:RunTask");
    /// `StopTask`.
    pub const STOP_TASK: IamAction = IamAction("ecs:StopTask");
    /// `ListTasks` (the launcher's group).
    pub const LIST_TASKS: IamAction = IamAction("ecs:ListTasks");
    /// `DescribeTasks` (each listed task's state and start time).
    pub const DESCRIBE_TASKS: IamAction = IamAction("ecs:DescribeTasks");
}

/// IAM itself: the roles a call hands to another service.
pub mod roles {
    use super::IamAction;
    /// `PassRole`: `RunTask` passes the broker worker's task and execution
    /// roles to ECS, and AWS checks the caller may pass them.
    pub const PASS_ROLE: IamAction = IamAction("iam:PassRole");
}

/// KMS: the credentials key.
pub mod kms {
    use super::IamAction;
    /// `Decrypt` (unwrap a user's data key).
    pub const DECRYPT: IamAction = IamAction("kms:Decrypt");
    /// `GenerateDataKey` (wrap new credentials).
    pub const GENERATE_DATA_KEY: IamAction = IamAction("kms:GenerateDataKey");
    /// `ReEncrypt`, authorised on the source key.
    pub const RE_ENCRYPT_FROM: IamAction = IamAction("kms:ReEncryptFrom");
    /// `ReEncrypt`, authorised on the destination key.
    pub const RE_ENCRYPT_TO: IamAction = IamAction("kms:ReEncryptTo");
}

/// CloudWatch: metrics in API mode.
pub mod cloudwatch {
    use super::IamAction;
    /// `PutMetricData`.
    pub const PUT_METRIC_DATA: IamAction = IamAction("cloudwatch:PutMetricData");
}

/// What one subcommand may call, declared once at its start.
#[derive(Debug, Clone, Copy)]
pub struct Declaration {
    /// The subcommand, as typed (`maintenance`).
    pub subcommand: &'static str,
    /// Every action its code may call.
    pub actions: &'static [IamAction],
}

static DECLARED: OnceLock<Declaration> = OnceLock::new();

/// Declares this process's actions. The first declaration stands; a process
/// runs one subcommand.
pub fn declare(declaration: Declaration) {
    let _ = DECLARED.set(declaration);
}

/// A call needs an action its subcommand did not declare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`leasehold {subcommand}` would call {action}, which it does not declare \
     (its task role's policy grants exactly what it declares)"
)]
pub struct Undeclared {
    /// The declaring subcommand.
    pub subcommand: &'static str,
    /// The missing action.
    pub action: IamAction,
}

/// Checks that this process declared every action in `needs` (all of them
/// pass when nothing was declared).
pub fn authorize(needs: &[IamAction]) -> Result<(), Undeclared> {
    match DECLARED.get() {
        Some(declared) => check(declared, needs),
        None => Ok(()),
    }
}

fn check(declared: &Declaration, needs: &[IamAction]) -> Result<(), Undeclared> {
    match needs.iter().find(|need| !declared.actions.contains(need)) {
        Some(&action) => Err(Undeclared {
            subcommand: declared.subcommand,
            action,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_passes_what_it_lists_and_names_the_first_action_it_lacks() {
        let declared = Declaration {
            subcommand: "maintenance",
            actions: &[ecs::LIST_TASKS, ecs::DESCRIBE_TASKS],
        };
        assert_eq!(check(&declared, &[ecs::LIST_TASKS]), Ok(()));
        let refused = check(
            &declared,
            &[ecs::DESCRIBE_TASKS, ecs::RUN_TASK, roles::PASS_ROLE],
        );
        assert_eq!(
            refused,
            Err(Undeclared {
                subcommand: "maintenance",
                action: ecs::RUN_TASK
            })
        );
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("`leasehold maintenance` would call ecs:RunTask")
        );
    }
}
