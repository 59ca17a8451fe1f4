//! Every role's policies in `deploy/iam/` grant exactly what its subcommands
//! declare: a declared action without a grant fails (the call would be refused
//! on AWS), a grant no subcommand declares is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{path:?}: {err}"));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{path:?}: {err}"))
}

/// The actions a policy allows (its Deny statements grant nothing).
fn allowed(policy: &Value) -> BTreeSet<String> {
    let mut actions = BTreeSet::new();
    for statement in policy["Statement"].as_array().into_iter().flatten() {
        if statement["Effect"] != "Allow" {
            continue;
        }
        match &statement["Action"] {
            Value::String(action) => {
                actions.insert(action.clone());
            }
            Value::Array(list) => {
                actions.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
    }
    actions
}

/// One container of a task definition (or an operator's subcommand): what it
/// runs and with which settings.
struct Runs {
    subcommand: String,
    env: BTreeMap<String, String>,
}

impl Runs {
    fn declared(&self, overrides: &[(&str, &str)]) -> BTreeSet<String> {
        let lookup = |name: &str| {
            overrides
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
                .or_else(|| self.env.get(name).cloned())
        };
        actions(&self.subcommand, &lookup)
            .unwrap_or_else(|| panic!("subcommand {} declares no IAM actions", self.subcommand))
            .iter()
            .map(|action| action.name().to_owned())
            .collect()
    }
}

/// Every role in `deploy/roles.json` with what runs under it: the containers
/// of the task definitions naming it, or the operator's subcommands.
fn roles(deploy: &Path) -> BTreeMap<String, (Value, Vec<Runs>)> {
    let mut runs: BTreeMap<String, Vec<Runs>> = BTreeMap::new();
    let dir = deploy.join("task-definitions");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let task = read_json(&entry.unwrap().path());
        let role = task["taskRoleArn"].as_str().unwrap_or_default();
        let role = role.rsplit('/').next().unwrap_or_default().to_owned();
        for container in task["containerDefinitions"].as_array().unwrap() {
            let env = container["environment"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|pair| {
                    let field = |f: &str| pair[f].as_str().unwrap_or_default().to_owned();
                    (field("name"), field("value"))
                })
                .collect();
            let subcommand = container["command"][0].as_str().unwrap().to_owned();
            runs.entry(role.clone())
                .or_default()
                .push(Runs { subcommand, env });
        }
    }
    let table = read_json(&deploy.join("roles.json"));
    let mut roles = BTreeMap::new();
    for (role, entry) in table.as_object().unwrap() {
        let mut role_runs = runs.remove(role).unwrap_or_default();
        for subcommand in entry["subcommands"].as_array().into_iter().flatten() {
            role_runs.push(Runs {
                subcommand: subcommand.as_str().unwrap().to_owned(),
                env: BTreeMap::new(),
            });
        }
        roles.insert(role.clone(), (entry.clone(), role_runs));
    }
    assert!(
        runs.is_empty(),
        "task roles missing from deploy/roles.json: {:?}",
        runs.keys().collect::<Vec<_>>()
    );
    roles
}

/// Each problem of `deploy`'s policies against the declarations, one line each.
fn problems(deploy: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let granted_by = |files: &Value| -> BTreeSet<String> {
        files
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|file| allowed(&read_json(&deploy.join("iam").join(file.as_str().unwrap()))))
            .collect()
    };
    for (role, (entry, runs)) in roles(deploy) {
        if runs.is_empty() {
            problems.push(format!("role {role}: nothing runs under it"));
        }
        // As deployed, and with CLOUDWATCH_MODE=api plus the policy it needs.
        for (overrides, files) in [
            (&[][..], vec![&entry["policies"]]),
            (
                &[("CLOUDWATCH_MODE", "api")][..],
                vec![&entry["policies"], &entry["with_cloudwatch_api"]],
            ),
        ] {
            let granted: BTreeSet<String> = files.into_iter().flat_map(granted_by).collect();
            let mut declared = BTreeSet::new();
            for run in &runs {
                for action in run.declared(overrides) {
                    if !granted.contains(&action) {
                        problems.push(format!(
                            "role {role}: `leasehold {}` calls {action}, which no policy of the role grants",
                            run.subcommand
                        ));
                    }
                    declared.insert(action);
                }
            }
            for action in granted.difference(&declared) {
                problems.push(format!(
                    "role {role}: grants {action}, which none of its subcommands calls"
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

#[test]
fn every_roles_policies_grant_exactly_what_its_subcommands_call() {
    let problems = problems(&deploy());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A copy of `deploy/` to break.
fn broken_deploy(edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "leasehold-iam-{}-{}",
        std::process::id(),
        leasehold_testkit::unique_name("deploy")
    ));
    for sub in ["iam", "task-definitions"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for entry in std::fs::read_dir(deploy().join(sub)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join(sub).join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(deploy().join("roles.json"), dir.join("roles.json")).unwrap();
    edit(&dir);
    dir
}

fn edit_policy(dir: &Path, file: &str, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("iam").join(file);
    let mut policy = read_json(&path);
    edit(&mut policy);
    std::fs::write(&path, policy.to_string()).unwrap();
}

#[test]
fn a_call_without_a_grant_fails_naming_the_action() {
    // Maintenance's cold start (supervision re-serving a dead worker's user)
    // launches a task: without the grant, the policy check names RunTask.
    let dir = broken_deploy(|dir| {
        edit_policy(dir, "maintenance-task-policy.json", |policy| {
            let statements = policy["Statement"].as_array_mut().unwrap();
            statements.retain(|statement| statement["Action"] != "ecs:RunTask");
        });
    });
    let problems = problems(&dir);
    assert!(
        problems.contains(
            &"role leasehold-maintenance-task: `leasehold maintenance` calls ecs:RunTask, which no policy of the role grants"
                .to_owned()
        ),
        "{problems:#?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_grant_without_a_call_is_reported() {
    let dir = broken_deploy(|dir| {
        edit_policy(dir, "dashboard-task-policy.json", |policy| {
            policy["Statement"][0]["Action"]
                .as_array_mut()
                .unwrap()
                .push("dynamodb:DeleteItem".into());
        });
    });
    let problems = problems(&dir);
    assert_eq!(
        problems,
        [
            "role leasehold-dashboard-task: grants dynamodb:DeleteItem, which none of its subcommands calls"
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// What `subcommand` declares with these settings.
fn declared_by(subcommand: &str, settings: &[(&str, &str)]) -> BTreeSet<String> {
    Runs {
        subcommand: subcommand.to_owned(),
        env: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
    .declared(&[])
}

#[test]
fn the_sidecar_declares_cloudwatch_only_in_api_mode_and_the_observer_only_when_it_observes() {
    let run = |pairs: &[(&str, &str)]| declared_by("sidecar", pairs);
    let names = |actions: &[IamAction]| -> BTreeSet<String> {
        actions.iter().map(|a| a.name().to_owned()).collect()
    };
    let observer = [("SIDECAR_OBSERVER", "true"), ("LEASE_TABLE", "t")];
    assert_eq!(run(&observer), names(SIDECAR_OBSERVER));
    let with_api = [
        ("SIDECAR_OBSERVER", "true"),
        ("LEASE_TABLE", "t"),
        ("CLOUDWATCH_MODE", "api"),
    ];
    let both: BTreeSet<String> = names(SIDECAR_OBSERVER)
        .union(&names(SIDECAR_CLOUDWATCH_API))
        .cloned()
        .collect();
    assert_eq!(run(&with_api), both);
    let neither = [("SIDECAR_OBSERVER", "false"), ("CLOUDWATCH_MODE", "emf")];
    assert_eq!(run(&neither), BTreeSet::new());
}

#[test]
fn a_broker_worker_declares_kms_only_when_it_is_given_a_key() {
    let run = |pairs: &[(&str, &str)]| declared_by("broker-worker", pairs);
    assert_eq!(run(&[]), BTreeSet::new());
    assert_eq!(
        run(&[("CREDENTIALS_KMS_KEY_ID", "alias/leasehold-credentials")]),
        BTreeSet::from(["kms:Decrypt".to_owned()])
    );
}
