//! IAM enforcement on a private moto (`super::private_moto`): IAM users that
//! hold the policies `deploy/iam` ships, as moto can check them, and clients
//! signing as those users. Used by `credentials_kms.rs` (KMS) and
//! `iam_enforced.rs` (ECS and DynamoDB).
//!
//! moto authorises one action per request, named after the API operation, on
//! the resource `*`, and evaluates no policy condition. [`for_moto`] adapts
//! the shipped statements to that, and says how.

use std::collections::HashMap;
use std::process::{Command, Stdio};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};

/// An IAM user's access key id and secret.
pub type Identity = (String, String);

/// A deployed IAM policy's statements exactly as the file has them. No file:
/// no statements.
pub fn shipped_statements(file: &str) -> Vec<serde_json::Value> {
    let path = leasehold_testkit::repo_root().join("deploy/iam").join(file);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    let policy: serde_json::Value = serde_json::from_str(&text).unwrap();
    policy["Statement"].as_array().unwrap().clone()
}

/// A deployed IAM policy's statements as moto can check them ([`for_moto`]).
pub fn shipped_policy(file: &str) -> Vec<serde_json::Value> {
    for_moto(shipped_statements(file))
}

/// Statements as moto can check them: resources `*`, conditions dropped,
/// and the names AWS and moto give an operation's permission reconciled.
/// - A statement whose condition narrows it to some items
///   (`dynamodb:LeadingKeys`) is left out rather than widened to every item:
///   widened, it could hide a missing table-wide grant (the sidecar
///   observer's `UpdateItem`, on its own record only, would stand in for the
///   stream worker's).
/// - AWS authorises `ReEncrypt` as `kms:ReEncryptFrom` on the source key and
///   `kms:ReEncryptTo` on the destination; moto checks `kms:ReEncrypt`.
/// - AWS authorises `TransactWriteItems` item by item (`ConditionCheckItem`,
///   `UpdateItem`, …); moto checks `dynamodb:TransactWriteItems` once per
///   request. A statement that grants both item actions of leasehold's one
///   transaction (the session-mode takeover: `ConditionCheckItem` and
///   `UpdateItem`) also grants that.
pub fn for_moto(statements: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    statements
        .into_iter()
        .filter(|statement| {
            !statement["Condition"]
                .as_object()
                .into_iter()
                .flat_map(|operators| operators.values())
                .filter_map(|keys| keys.as_object())
                .any(|keys| keys.contains_key("dynamodb:LeadingKeys"))
        })
        .map(|mut statement| {
            let object = statement.as_object_mut().unwrap();
            object.remove("Condition");
            object.insert("Resource".into(), serde_json::json!("*"));
            if let Some(actions) = object.get_mut("Action").and_then(|a| a.as_array_mut()) {
                let grants =
                    |actions: &[serde_json::Value], name: &str| actions.iter().any(|a| a == name);
                if grants(actions, "kms:ReEncryptFrom") {
                    actions.push(serde_json::json!("kms:ReEncrypt"));
                }
                if grants(actions, "dynamodb:ConditionCheckItem")
                    && grants(actions, "dynamodb:UpdateItem")
                {
                    actions.push(serde_json::json!("dynamodb:TransactWriteItems"));
                }
            }
            statement
        })
        .collect()
}

/// IAM users with these statements on the private moto, which enforces IAM
/// from then on; each user's access key and secret.
pub fn iam_users(endpoint: &str, users: serde_json::Value) -> HashMap<String, Identity> {
    let python = std::env::var(leasehold_testkit::PYTHON_VAR).unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .arg(leasehold_testkit::repo_root().join("scripts/moto_iam_users.py"))
        .arg(endpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(users.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys: HashMap<String, serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    keys.into_iter()
        .map(|(name, key)| {
            let field = |f: &str| key[f].as_str().unwrap().to_owned();
            (name, (field("key"), field("secret")))
        })
        .collect()
}

/// A credentials provider for this identity, for a client's configuration.
pub fn signing_as((key, secret): &Identity) -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(Credentials::new(key, secret, None, None, "test"))
}

/// A KMS client signing as this identity.
pub fn kms_as(endpoint: &str, identity: &Identity) -> aws_sdk_kms::Client {
    let config = local_sdk_config(RetryPolicy::Standard, endpoint)
        .to_builder()
        .credentials_provider(signing_as(identity))
        .build();
    aws_sdk_kms::Client::new(&config)
}
