//! Each ECS task role's real AWS calls against a private moto with IAM
//! enforcement on (issue 42): the code's own clients (the ECS launcher
//! `EcsLauncher`, the lease store `DynamoLeaseStore`) sign as an IAM user that
//! holds exactly the policies `deploy/iam` ships for the role, so a policy
//! that lacks a grant the code needs fails here with moto's "User: … is not
//! authorized to perform: <action>".
//!
//! Which role: each task definition's `taskRoleArn`; which policies a role
//! carries: `deploy/roles.json` (its `policies`).
//!
//! - maintenance: ListTasks and DescribeTasks (the launcher's listing),
//!   StopTask (the sweep), RunTask (supervision's cold start:
//!   `supervise` → `manager::claim_user` → `launcher.start(Some(user))`).
//! - pool manager: RunTask (`reconcile` → `start(None)`), StopTask.
//! - stream worker (its policy and the sidecar observer's, both on its role):
//!   DescribeTable, PutItem, UpdateItem (acquire, renew with a checkpoint,
//!   checkpoint, doorbell, assign, observer lease, release), GetItem, Scan,
//!   the assignee-index Query, the session-mode takeover transaction.
//! - dashboard: its reads (Scan, GetItem) pass, a write is refused.
//! - credential sealer: `kms:Decrypt` with the `user_id` encryption context
//!   is exercised with real processes in `credentials_kms.rs`, not here.
//!
//! Each role family also has a negative control: the role's policy with one
//! needed action taken out in memory, and the call refused naming it.
//!
//! **What moto checks, and what it does not.** moto authorises one action per
//! request, named after the API operation, against the resource `*`, and
//! evaluates no condition. So the shipped statements are applied with their
//! resources widened to `*` and their conditions dropped
//! (`support::iam::for_moto`): a grant on the wrong table, cluster or key, or a
//! condition that would refuse the call in AWS, passes here
//! (`scripts/check_task_definitions.py` checks resources and conditions
//! statically). A statement narrowed to some items (`dynamodb:LeadingKeys`,
//! the sidecar observer's `UpdateItem`) is left out rather than widened. moto
//! checks a transaction as one action, `dynamodb:TransactWriteItems` (AWS
//! checks each item's: `ConditionCheckItem`, `UpdateItem`), so a statement
//! that grants both item actions is given that one too, and a policy without
//! `ConditionCheckItem` is refused as `dynamodb:TransactWriteItems`. moto does
//! not check `iam:PassRole` on RunTask at all (a test here pins that), so the
//! RunTask cases also look for the `iam:PassRole` grant of the broker worker's
//! two roles in the shipped document itself. moto answers a refusal with an
//! XML body that the JSON-protocol SDK clients cannot parse (their errors do
//! not carry its message), so the clients talk to moto through a loopback
//! proxy that keeps every refusal moto sends ([`Refusals`]).

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::support::iam::{Identity, for_moto, iam_users, shipped_statements, signing_as};
use crate::support::{Proc, private_moto, side_by_side};
use aws_sdk_ecs::types::{ContainerDefinition, LaunchType};
use leasehold_broker::launcher::{EcsLauncher, EcsSettings, TaskLauncher};
use leasehold_control::read::{LeaseTable, read_stream};
use leasehold_control::schema;
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_control::store::{
    AcquireRequest, CheckpointRequest, Consistency, LeaseReader, LeaseStore, ReleaseRequest,
    RenewRequest, TakeoverRequest, list_all,
};
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_testkit::lease_store::{self, LEASE, SKEW, T0};
use leasehold_testkit::{dynamodb_client, unique_name};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// moto's account: what `${ACCOUNT_ID}` renders to here.
const ACCOUNT_ID: &str = "123456789012";

/// A task definition from `deploy/task-definitions/`, as the file has it.
fn task_definition(file: &str) -> Value {
    let path = leasehold_testkit::repo_root()
        .join("deploy/task-definitions")
        .join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The role a task definition's tasks run as (the name in `taskRoleArn`).
fn task_role(file: &str) -> String {
    let arn = task_definition(file)["taskRoleArn"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: no taskRoleArn"))
        .to_owned();
    arn.rsplit('/').next().unwrap().to_owned()
}

/// The policy files of the role `file`'s tasks run as: its `policies` in
/// `deploy/roles.json`, the one table of which role carries which policies
/// (the optional `with_cloudwatch_api` ones are not attached by default).
fn role_policy_files(file: &str) -> Vec<String> {
    let role = task_role(file);
    let path = leasehold_testkit::repo_root().join("deploy/roles.json");
    let roles: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    roles[&role]["policies"]
        .as_array()
        .unwrap_or_else(|| panic!("{file} runs as {role}, which deploy/roles.json does not list"))
        .iter()
        .map(|policy| policy.as_str().unwrap().to_owned())
        .collect()
}

/// The statements of every policy of the role `file`'s tasks run as, as moto
/// can check them, with `drop` (a policy file and an action) taken out of
/// that file first: a negative control.
fn role_statements(file: &str, drop: Option<(&str, &str)>) -> Vec<Value> {
    let files = role_policy_files(file);
    if let Some((policy, _)) = drop {
        assert!(
            files.iter().any(|f| f == policy),
            "{policy} is not on {file}'s role"
        );
    }
    let statements = files
        .iter()
        .flat_map(|policy| {
            let mut statements = shipped_statements(policy);
            if let Some((_, action)) = drop.filter(|(p, _)| *p == policy.as_str()) {
                statements = without(statements, action);
            }
            statements
        })
        .collect();
    for_moto(statements)
}

/// `statements` without `action` (a statement left with no action goes).
fn without(statements: Vec<Value>, action: &str) -> Vec<Value> {
    statements
        .into_iter()
        .filter_map(|mut statement| {
            let actions: Vec<Value> = match &statement["Action"] {
                Value::String(one) => vec![json!(one)],
                Value::Array(many) => many.clone(),
                _ => return Some(statement),
            };
            let kept: Vec<Value> = actions.into_iter().filter(|a| a != action).collect();
            if kept.is_empty() {
                return None;
            }
            statement["Action"] = json!(kept);
            Some(statement)
        })
        .collect()
}

/// Everything allowed: the setup identity once enforcement is on.
fn admin() -> Value {
    json!([{"Effect": "Allow", "Action": "*", "Resource": "*"}])
}

/// `None` (the module's "moto does not check it") when the role's shipped
/// policies grant `iam:PassRole` on the broker worker's task and execution
/// roles, as RunTask needs in AWS; else what is missing.
fn pass_role_missing(file: &str) -> Option<String> {
    let broker = task_definition("broker-worker.json");
    let statements: Vec<Value> = role_policy_files(file)
        .iter()
        .flat_map(|policy| shipped_statements(policy))
        .collect();
    let strings = |value: &Value| -> Vec<String> {
        match value {
            Value::String(one) => vec![one.clone()],
            Value::Array(many) => many
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    };
    let missing: Vec<String> = ["taskRoleArn", "executionRoleArn"]
        .into_iter()
        .map(|field| broker[field].as_str().unwrap().to_owned())
        .filter(|role| {
            !statements.iter().any(|s| {
                s["Effect"] == "Allow"
                    && strings(&s["Action"]).iter().any(|a| a == "iam:PassRole")
                    && strings(&s["Resource"])
                        .iter()
                        .any(|r| r == role || r == "*")
            })
        })
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{}: no iam:PassRole on {} (RunTask passes the broker worker's roles; \
             moto does not check it, so the shipped document is read)",
            role_policy_files(file).join(", "),
            missing.join(", ")
        )
    })
}

/// A loopback proxy in front of moto that keeps every refusal moto answers
/// ("User: … is not authorized to perform: <action>") before the client
/// sees it; the SDK clients go through it.
struct Refusals {
    endpoint: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

const NOT_AUTHORIZED: &str = "is not authorized to perform: ";

/// Every complete refusal message in an answer's bytes so far.
fn refusals_in(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    text.match_indices(NOT_AUTHORIZED)
        .filter_map(|(at, _)| {
            let rest = &text[at + NOT_AUTHORIZED.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))?;
            let from = text[..at].rfind("User: ").unwrap_or(at);
            Some(format!(
                "{}{}",
                &text[from..at + NOT_AUTHORIZED.len()],
                &rest[..end]
            ))
        })
        .collect()
}

impl Refusals {
    async fn start(moto: &str) -> Refusals {
        let upstream = moto.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, log) = (upstream.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    let requests = tokio::io::copy(&mut from_client, &mut to_server);
                    let answers = async {
                        let (mut answer, mut recorded, mut chunk) = (Vec::new(), 0, vec![0; 16384]);
                        while let Ok(n @ 1..) = from_server.read(&mut chunk).await {
                            answer.extend_from_slice(&chunk[..n]);
                            let found = refusals_in(&answer);
                            log.lock()
                                .unwrap()
                                .extend(found.iter().skip(recorded).cloned());
                            recorded = found.len();
                            if to_client.write_all(&chunk[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        () = answers => {}
                    }
                });
            }
        });
        Refusals {
            endpoint,
            seen,
            task,
        }
    }

    /// The refusals since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A private moto with IAM enforcement on, reached through [`Refusals`].
struct Enforced {
    _moto: Proc,
    refusals: Refusals,
    users: HashMap<String, Identity>,
    /// Calls refused that the role needs (reported all at once).
    problems: Vec<String>,
}

/// A private moto without enforcement yet (setup signs as anyone), or `None`
/// when the test servers are not configured (skip), as the other private-moto
/// tests decide.
fn moto() -> Option<(Proc, String)> {
    leasehold_testkit::dynamodb_endpoint()?;
    Some(private_moto())
}

impl Enforced {
    /// Creates `users` and turns enforcement on.
    async fn start((moto, endpoint): (Proc, String), users: Value) -> Enforced {
        let users = iam_users(&endpoint, users);
        Enforced {
            refusals: Refusals::start(&endpoint).await,
            _moto: moto,
            users,
            problems: Vec::new(),
        }
    }

    fn identity(&self, user: &str) -> &Identity {
        self.users
            .get(user)
            .unwrap_or_else(|| panic!("no IAM user {user}"))
    }

    fn ecs(&self, user: &str) -> aws_sdk_ecs::Client {
        let config = local_sdk_config(RetryPolicy::Standard, &self.refusals.endpoint)
            .to_builder()
            .credentials_provider(signing_as(self.identity(user)))
            .build();
        aws_sdk_ecs::Client::new(&config)
    }

    fn launcher(&self, user: &str, settings: &EcsSettings) -> EcsLauncher {
        EcsLauncher::new(self.ecs(user), settings.clone())
    }

    fn store(&self, user: &str, table: &str) -> DynamoLeaseStore {
        let config = local_sdk_config(RetryPolicy::Standard, &self.refusals.endpoint)
            .to_builder()
            .credentials_provider(signing_as(self.identity(user)))
            .build();
        DynamoLeaseStore::from_sdk_config(&config, table)
    }

    /// Runs a call the role needs; a refusal (or any failure) is kept as a
    /// problem, with what moto said.
    async fn allowed<T, E: Display>(
        &mut self,
        what: &str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Option<T> {
        self.refusals.take();
        match call.await {
            Ok(value) => {
                self.refusals.take();
                Some(value)
            }
            Err(err) => {
                let said = self.refusals.take();
                self.problems.push(if said.is_empty() {
                    format!("{what}: failed: {err}")
                } else {
                    format!("{what}: refused: {}", said.join("; "))
                });
                None
            }
        }
    }

    /// [`Self::allowed`] for a call later ones depend on: a failure ends the
    /// test with every problem so far.
    async fn required<T, E: Display>(
        &mut self,
        what: &str,
        call: impl Future<Output = Result<T, E>>,
    ) -> T {
        match self.allowed(what, call).await {
            Some(value) => value,
            None => {
                self.finish();
                unreachable!()
            }
        }
    }

    /// A call moto must refuse, naming `action`.
    async fn refused<T: Debug, E: Debug + Display>(
        &mut self,
        what: &str,
        action: &str,
        call: impl Future<Output = Result<T, E>>,
    ) {
        self.refusals.take();
        let result = call.await;
        let said = self.refusals.take();
        assert!(result.is_err(), "{what}: allowed ({result:?})");
        let named = format!("{NOT_AUTHORIZED}{action}");
        assert!(
            said.iter().any(|s| s.ends_with(&named)),
            "{what}: not refused for {action}: moto said {said:?}, the call {}",
            result.err().map(|e| e.to_string()).unwrap_or_default()
        );
    }

    /// Fails with every problem kept.
    fn finish(&self) {
        assert!(
            self.problems.is_empty(),
            "calls the role needs were refused:\n{}",
            self.problems.join("\n")
        );
    }
}

/// The broker worker's cluster and task definition (family, container and
/// roles from `broker-worker.json`) on a moto not enforcing yet; the launcher
/// settings that start it, as the pool manager and maintenance have them.
async fn broker_cluster(endpoint: &str) -> EcsSettings {
    let shipped = task_definition("broker-worker.json");
    let container = shipped["containerDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["command"][0] == "broker-worker")
        .expect("a container runs broker-worker");
    let render = |field: &str| {
        shipped[field]
            .as_str()
            .unwrap()
            .replace("${ACCOUNT_ID}", ACCOUNT_ID)
    };
    let client = aws_sdk_ecs::Client::new(&local_sdk_config(RetryPolicy::Standard, endpoint));
    let cluster = unique_name("leasehold-broker");
    client
        .create_cluster()
        .cluster_name(&cluster)
        .send()
        .await
        .unwrap();
    let family = shipped["family"].as_str().unwrap();
    let container_name = container["name"].as_str().unwrap();
    client
        .register_task_definition()
        .family(family)
        .task_role_arn(render("taskRoleArn"))
        .execution_role_arn(render("executionRoleArn"))
        .cpu("256")
        .memory("512")
        .container_definitions(
            ContainerDefinition::builder()
                .name(container_name)
                .image("leasehold:test")
                .memory_reservation(512)
                .command("broker-worker")
                .build(),
        )
        .send()
        .await
        .unwrap();
    EcsSettings {
        cluster,
        task_definition: family.to_owned(),
        container: container_name.to_owned(),
        // moto checks subnets against its EC2 model, which is not set up here.
        subnets: vec![],
        security_groups: vec![],
        launch_type: LaunchType::Fargate.as_str().into(),
        group: "leasehold-pool".into(),
    }
}

/// A lease table made as the unrestricted setup identity, before enforcement.
async fn lease_table(endpoint: &str) -> (String, DynamoLeaseStore) {
    let table = unique_name("leases");
    let store = DynamoLeaseStore::new(dynamodb_client(endpoint), &table);
    store.create_table().await.unwrap();
    (table, store)
}

/// An acquire, within a session when `session` names one.
fn acquire(stream: &str, owner: &str, now_ms: i64, session: Option<u64>) -> AcquireRequest {
    match session {
        Some(session) => lease_store::session_acquire(stream, owner, session, now_ms),
        None => lease_store::acquire(stream, owner, now_ms),
    }
}

/// Session mode, as the conformance suite's takeover checks set it up:
/// `a` holds `stream` under its session, `b` started its own once `a`'s had
/// expired. Returns the takeover `b` makes.
async fn ended_session(store: &DynamoLeaseStore, stream: &str) -> TakeoverRequest {
    let a = store
        .acquire(&acquire(&schema::session_record("a"), "a", T0, None))
        .await
        .unwrap()
        .fence_token;
    store
        .acquire(&acquire(stream, "a", T0, Some(a)))
        .await
        .unwrap();
    let later = T0 + LEASE + SKEW + 1;
    let b = store
        .acquire(&acquire(&schema::session_record("b"), "b", later, None))
        .await
        .unwrap()
        .fence_token;
    TakeoverRequest {
        acquire: acquire(stream, "b", later, Some(b)),
        from_owner: "a".into(),
        from_session_token: a,
        from_fence_token: 1,
        from_expires_at: Some(T0 + LEASE),
    }
}

/// Maintenance lists, describes and stops broker workers, and supervision's
/// cold start runs one for a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_role_lists_stops_and_cold_starts_broker_workers() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let settings = broker_cluster(&moto.1).await;
    let mut aws = Enforced::start(
        moto,
        json!({
            "maintenance": role_statements("maintenance.json", None),
            "admin": admin(),
        }),
    )
    .await;
    let pool_worker = aws
        .launcher("admin", &settings)
        .start(None)
        .await
        .expect("setup: a pool worker");
    let maintenance = aws.launcher("maintenance", &settings);
    if let Some(tasks) = aws
        .allowed("list (ListTasks, DescribeTasks)", maintenance.list())
        .await
    {
        assert!(tasks.iter().any(|t| t.task_id == pool_worker), "{tasks:?}");
    }
    aws.allowed(
        "stop an orphan (StopTask)",
        maintenance.stop(&pool_worker, "orphan"),
    )
    .await;
    aws.allowed(
        "supervision's cold start (RunTask)",
        maintenance.start(Some("u-cold")),
    )
    .await;
    if let Some(missing) = pass_role_missing("maintenance.json") {
        aws.problems.push(missing);
    }
    aws.finish();
}

/// Negative control: without `ecs:RunTask` the cold start is refused, naming
/// it, while the listing still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_without_run_task_is_refused_run_task() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let settings = broker_cluster(&moto.1).await;
    let dropped = ("maintenance-task-policy.json", "ecs:RunTask");
    let mut aws = Enforced::start(
        moto,
        json!({"maintenance": role_statements("maintenance.json", Some(dropped))}),
    )
    .await;
    let maintenance = aws.launcher("maintenance", &settings);
    aws.required("list (ListTasks, DescribeTasks)", maintenance.list())
        .await;
    aws.refused(
        "cold start",
        "ecs:RunTask",
        maintenance.start(Some("u-cold")),
    )
    .await;
}

/// The pool manager starts pool workers and stops surplus ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_manager_role_starts_and_stops_pool_workers() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let settings = broker_cluster(&moto.1).await;
    let mut aws = Enforced::start(
        moto,
        json!({"pool-manager": role_statements("pool-manager.json", None)}),
    )
    .await;
    let manager = aws.launcher("pool-manager", &settings);
    if let Some(task) = aws
        .allowed("start a pool worker (RunTask)", manager.start(None))
        .await
    {
        aws.allowed(
            "stop a surplus worker (StopTask)",
            manager.stop(&task, "pool above target size"),
        )
        .await;
    }
    if let Some(missing) = pass_role_missing("pool-manager.json") {
        aws.problems.push(missing);
    }
    aws.finish();
}

/// Negative control: without `ecs:StopTask` the stop is refused, naming it.
/// And moto does not check `iam:PassRole`: without it RunTask still passes
/// (if this fails, moto started checking it: the module doc and
/// `pass_role_missing` can change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_manager_without_stop_task_is_refused_and_moto_does_not_check_pass_role() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let settings = broker_cluster(&moto.1).await;
    let policy = "pool-manager-task-policy.json";
    let mut aws = Enforced::start(
        moto,
        json!({
            "no-stop": role_statements("pool-manager.json", Some((policy, "ecs:StopTask"))),
            "no-pass-role": role_statements("pool-manager.json", Some((policy, "iam:PassRole"))),
        }),
    )
    .await;
    let no_stop = aws.launcher("no-stop", &settings);
    let task = aws.required("start (RunTask)", no_stop.start(None)).await;
    aws.refused("stop", "ecs:StopTask", no_stop.stop(&task, "test"))
        .await;
    let no_pass_role = aws.launcher("no-pass-role", &settings);
    aws.required(
        "RunTask without iam:PassRole (moto does not check it)",
        no_pass_role.start(None),
    )
    .await;
}

/// Every lease-table call a stream worker and its sidecar make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_worker_role_makes_every_lease_table_call_of_the_worker_and_its_sidecar() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let (table, _) = lease_table(&moto.1).await;
    let mut aws = Enforced::start(
        moto,
        json!({"stream-worker": role_statements("stream-worker.json", None)}),
    )
    .await;
    let store = aws.store("stream-worker", &table);
    let stream = "btc-usd";
    aws.allowed("start-up table check (DescribeTable)", store.check_table())
        .await;
    aws.allowed("register a stream (PutItem)", store.register(stream, T0))
        .await;
    let lease = aws
        .required(
            "acquire (UpdateItem)",
            store.acquire(&acquire(stream, "w1", T0, None)),
        )
        .await;
    let token = lease.fence_token;
    aws.allowed(
        "renew with a checkpoint (UpdateItem)",
        store.renew(&RenewRequest {
            stream_id: stream.into(),
            owner_id: "w1".into(),
            fence_token: token,
            now_ms: T0 + 1,
            lease_ms: LEASE,
            checkpoint: Some(10),
        }),
    )
    .await;
    aws.allowed(
        "checkpoint (UpdateItem)",
        store.checkpoint(&CheckpointRequest {
            stream_id: stream.into(),
            owner_id: "w1".into(),
            fence_token: token,
            checkpoint: 20,
            now_ms: T0 + 2,
        }),
    )
    .await;
    aws.allowed(
        "read a stream (GetItem)",
        store.get_with(stream, Consistency::Strong),
    )
    .await;
    aws.allowed(
        "discovery (Scan)",
        list_all(&store, 100, Consistency::Eventual),
    )
    .await;
    aws.allowed(
        "hand-off doorbell (UpdateItem)",
        store.bump(schema::HANDOFF_DOORBELL, T0 + 3),
    )
    .await;
    aws.allowed(
        "the assigner's advice (UpdateItem)",
        store.assign(stream, Some("w1")),
    )
    .await;
    if let Some(mine) = aws
        .allowed(
            "assigned discovery (Query on the assignee index)",
            store.assigned("w1"),
        )
        .await
    {
        assert_eq!(mine, [stream]);
    }
    aws.allowed(
        "the sidecar's observer lease (UpdateItem)",
        store.acquire(&acquire(schema::OBSERVER_LEASE, "w1-sidecar", T0, None)),
    )
    .await;
    aws.allowed(
        "release with the last checkpoint (UpdateItem)",
        store.release(&ReleaseRequest {
            stream_id: stream.into(),
            owner_id: "w1".into(),
            fence_token: token,
            checkpoint: Some(30),
            now_ms: T0 + 4,
            successor: Some("w2".into()),
        }),
    )
    .await;
    let takeover = ended_session(&store, "eth-usd").await;
    if let Some(taken) = aws
        .allowed(
            "session-mode takeover (TransactWriteItems: ConditionCheckItem + UpdateItem)",
            store.take_over(&takeover),
        )
        .await
    {
        assert_eq!(taken.owner_id.as_deref(), Some("b"));
    }
    aws.finish();
}

/// Negative controls: without `dynamodb:Query` assigned discovery is
/// refused, naming it; without `dynamodb:ConditionCheckItem` the takeover is
/// refused as moto names it (`dynamodb:TransactWriteItems`, see the module).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_worker_without_query_or_condition_check_is_refused() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let (table, _) = lease_table(&moto.1).await;
    let policy = "stream-worker-task-policy.json";
    let mut aws = Enforced::start(
        moto,
        json!({
            "no-query": role_statements("stream-worker.json", Some((policy, "dynamodb:Query"))),
            "no-condition-check": role_statements(
                "stream-worker.json",
                Some((policy, "dynamodb:ConditionCheckItem")),
            ),
        }),
    )
    .await;
    let no_query = aws.store("no-query", &table);
    aws.required("register", no_query.register("btc-usd", T0))
        .await;
    aws.required("assign", no_query.assign("btc-usd", Some("w1")))
        .await;
    aws.refused(
        "assigned discovery",
        "dynamodb:Query",
        no_query.assigned("w1"),
    )
    .await;
    let no_check = aws.store("no-condition-check", &table);
    let takeover = ended_session(&no_check, "eth-usd").await;
    aws.refused(
        "session-mode takeover",
        "dynamodb:TransactWriteItems",
        no_check.take_over(&takeover),
    )
    .await;
}

/// The dashboard reads the lease table (its table read and a stream's
/// record) and may not write it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_role_reads_the_lease_table_and_may_not_write_it() {
    let _slot = side_by_side().await;
    let Some(moto) = moto() else {
        return;
    };
    let (table, setup) = lease_table(&moto.1).await;
    setup.register("btc-usd", T0).await.unwrap();
    setup
        .acquire(&acquire("btc-usd", "w1", T0, None))
        .await
        .unwrap();
    let mut aws = Enforced::start(
        moto,
        json!({"dashboard": role_statements("dashboard.json", None)}),
    )
    .await;
    let dashboard = aws.store("dashboard", &table);
    if let Some(read) = aws
        .allowed(
            "the table read (Scan)",
            LeaseTable::read(&dashboard, 100, Consistency::Eventual),
        )
        .await
    {
        assert_eq!(read.streams.len(), 1, "{read:?}");
    }
    aws.allowed(
        "a stream's record (GetItem)",
        read_stream(&dashboard, "btc-usd", Consistency::Eventual),
    )
    .await;
    aws.finish();
    aws.refused(
        "an acquire",
        "dynamodb:UpdateItem",
        dashboard.acquire(&acquire("btc-usd", "dashboard", T0 + LEASE * 2, None)),
    )
    .await;
    aws.refused(
        "a registration",
        "dynamodb:PutItem",
        dashboard.register("eth-usd", T0),
    )
    .await;
}
