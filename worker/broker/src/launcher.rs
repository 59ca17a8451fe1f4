//! Starting, stopping and listing broker workers: the [`TaskLauncher`] seam with
//! two implementations, local processes (the embedded default) and ECS
//! (RunTask / StopTask / ListTasks / DescribeTasks).
//!
//! A task's identity is what the worker writes as `task_id` in its mark, so the
//! sweeper can compare marks with tasks: `local-{pid}` or the ECS task ARN.

use std::collections::HashSet;
use std::path::PathBuf;

use async_trait::async_trait;
use aws_sdk_ecs::operation::describe_tasks::DescribeTasksOutput;
use aws_sdk_ecs::types::{
    AssignPublicIp, AwsVpcConfiguration, ContainerOverride, DesiredStatus, KeyValuePair,
    LaunchType, NetworkConfiguration, TaskOverride,
};
use leasehold_platform::iam::{self, ecs};

/// Environment variable that tags local workers with their pool group.
pub const LOCAL_GROUP_VAR: &str = "LEASEHOLD_TASK_GROUP";

/// A running worker as the launcher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningTask {
    /// `local-{pid}` or the ECS task ARN.
    pub task_id: String,
    /// Start time, unix ms.
    pub started_at: u64,
    /// `USER_ID` it was launched with (a cold start); `None` for pool workers.
    pub user_id: Option<String>,
}

/// Launcher failures (AWS errors carry the service's code and message only).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Could not start a worker.
    #[error("cannot start a worker: {0}")]
    Start(String),
    /// Could not stop a worker.
    #[error("cannot stop task {task_id}: {problem}")]
    Stop {
        /// Task.
        task_id: String,
        /// What failed.
        problem: String,
    },
    /// Could not list workers.
    #[error("cannot list workers: {0}")]
    List(String),
}

/// Starts, stops and lists broker workers.
#[async_trait]
pub trait TaskLauncher: Send + Sync {
    /// Starts one worker: in the pool (`None`) or cold for a user. Returns its task id.
    async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError>;
    /// Stops a worker (graceful: SIGTERM locally, StopTask on ECS).
    async fn stop(&self, task_id: &str, reason: &str) -> Result<(), LaunchError>;
    /// Every running worker of this launcher's group.
    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError>;
}

/// Workers as child processes of this binary (`leasehold broker-worker`).
#[derive(Debug, Clone)]
pub struct LocalLauncher {
    /// The `leasehold` executable.
    pub program: PathBuf,
    /// Tag that marks this launcher's processes.
    pub group: String,
    /// Each worker's output goes to `{dir}/{task_id}.log`; `None` inherits stderr
    /// (a caller that waits for this process's output to end would then also
    /// wait for every worker it started).
    pub log_dir: Option<PathBuf>,
}

fn clock_ticks_to_unix_ms(start_ticks: u64) -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_secs: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // USER_HZ is 100 on every Linux ABI in use.
    Some(boot_secs * 1000 + start_ticks * 10)
}

/// A live process's start time in clock ticks since boot (`/proc/{pid}/stat`,
/// readable for every process, hardened or not); `None` if it is gone or a
/// zombie.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is 3rd, starttime 22nd.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// What a local worker writes about itself in its group's registry.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct LocalEntry {
    group: String,
    pid: u32,
    /// With the pid, tells this process from a later one given the same pid.
    start_ticks: u64,
    /// `USER_ID` of a cold start; `None` for a pool worker.
    user_id: Option<String>,
}

/// The directory where a group's local workers register: one file per
/// worker, `{pid}.json`. Finding workers there instead of in
/// `/proc/{pid}/environ` is what lets a normal user list them: a hardened
/// (not dumpable) process's environ is readable by root only. Private to this
/// uid (0700, owned by it, checked), or anyone could plant an entry and have
/// the launcher signal a process of theirs choosing.
fn registry_dir(group: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = nix::unistd::geteuid().as_raw();
    let name: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("leasehold-{uid}-workers-{name}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(format!("{}: {err}", dir.display())),
    }
    let meta =
        std::fs::symlink_metadata(&dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private directory of this user (0700, owned by uid {uid})",
            dir.display()
        ));
    }
    Ok(dir)
}

/// Registers this process as a local worker of `group` (the launcher's
/// [`LOCAL_GROUP_VAR`]); the entry goes when the returned guard drops. A
/// crashed worker's entry stays until a launcher sees its pid gone.
pub fn register_local_worker(
    group: &str,
    user_id: Option<&str>,
) -> Result<LocalRegistration, String> {
    let pid = std::process::id();
    let entry = LocalEntry {
        group: group.to_owned(),
        pid,
        start_ticks: start_ticks(pid).ok_or("cannot read this process's /proc stat")?,
        user_id: user_id
            .filter(|u| *u != leasehold_pool::keys::POOL_USER_ID)
            .map(str::to_owned),
    };
    let path = registry_dir(group)?.join(format!("{pid}.json"));
    let json = serde_json::to_vec(&entry).map_err(|err| err.to_string())?;
    std::fs::write(&path, json).map_err(|err| format!("{}: {err}", path.display()))?;
    Ok(LocalRegistration { path })
}

/// A local worker's registry entry; removed on drop.
#[derive(Debug)]
pub struct LocalRegistration {
    path: PathBuf,
}

impl Drop for LocalRegistration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `pid`'s entry if it is a live worker of `group`; a stale entry (its
/// process gone, or the pid reused) is removed.
fn local_task(dir: &std::path::Path, pid: u32, group: &str) -> Option<RunningTask> {
    let path = dir.join(format!("{pid}.json"));
    let entry: LocalEntry = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    if entry.group != group || entry.pid != pid {
        return None;
    }
    if start_ticks(pid) != Some(entry.start_ticks) {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some(RunningTask {
        task_id: format!("local-{pid}"),
        started_at: clock_ticks_to_unix_ms(entry.start_ticks)?,
        user_id: entry.user_id,
    })
}

// The IAM actions each launcher call needs on ECS. The local launcher asks
// too, so the real-process tests (which launch local processes) run every
// subcommand's launcher calls under its IAM declaration.

/// `RunTask` passes the broker worker's task and execution roles.
fn may_start() -> Result<(), LaunchError> {
    iam::authorize(&[ecs::RUN_TASK, iam::roles::PASS_ROLE])
        .map_err(|err| LaunchError::Start(err.to_string()))
}

fn may_stop(task_id: &str) -> Result<(), LaunchError> {
    iam::authorize(&[ecs::STOP_TASK]).map_err(|err| LaunchError::Stop {
        task_id: task_id.to_owned(),
        problem: err.to_string(),
    })
}

fn may_list() -> Result<(), LaunchError> {
    iam::authorize(&[ecs::LIST_TASKS, ecs::DESCRIBE_TASKS])
        .map_err(|err| LaunchError::List(err.to_string()))
}

#[async_trait]
impl TaskLauncher for LocalLauncher {
    async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError> {
        may_start()?;
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(&self.program);
        command
            .arg("broker-worker")
            .env(LOCAL_GROUP_VAR, &self.group)
            .env(
                crate::settings::USER_ID.name,
                user_id.unwrap_or(leasehold_pool::keys::POOL_USER_ID),
            )
            .env_remove(crate::settings::WORKER_ID.name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Its own process group: a Ctrl-C meant for the manager does not stop workers.
            .process_group(0);
        let log = match &self.log_dir {
            Some(dir) => {
                let path = dir.join(format!("worker-{}.log", rand::random::<u64>()));
                let file = std::fs::File::create(&path)
                    .map_err(|err| LaunchError::Start(format!("{}: {err}", path.display())))?;
                Some((path, file))
            }
            None => None,
        };
        if let Some((_, file)) = &log {
            let stderr = file
                .try_clone()
                .map_err(|err| LaunchError::Start(err.to_string()))?;
            command.stderr(stderr);
        }
        let mut child = command
            .spawn()
            .map_err(|err| LaunchError::Start(err.to_string()))?;
        let pid = child.id();
        if let (Some((path, _)), Some(dir)) = (&log, &self.log_dir) {
            // Named after the task once the pid is known.
            let _ = std::fs::rename(path, dir.join(format!("local-{pid}.log")));
        }
        // Reap it when it exits, as long as this process lives.
        std::thread::spawn(move || child.wait());
        Ok(format!("local-{pid}"))
    }

    async fn stop(&self, task_id: &str, _reason: &str) -> Result<(), LaunchError> {
        may_stop(task_id)?;
        let stop_error = |problem: String| LaunchError::Stop {
            task_id: task_id.to_owned(),
            problem,
        };
        let pid: u32 = task_id
            .strip_prefix("local-")
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| stop_error("not a local task id".into()))?;
        // Only ever signal our own workers, never a recycled pid.
        let dir = registry_dir(&self.group).map_err(stop_error)?;
        if local_task(&dir, pid, &self.group).is_none() {
            return Ok(());
        }
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .map_err(|err| stop_error(err.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(stop_error(format!("kill exited with {status}")))
        }
    }

    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
        may_list()?;
        let dir = registry_dir(&self.group).map_err(LaunchError::List)?;
        let entries = std::fs::read_dir(&dir).map_err(|err| LaunchError::List(err.to_string()))?;
        let mut tasks: Vec<RunningTask> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                entry
                    .file_name()
                    .to_str()?
                    .strip_suffix(".json")?
                    .parse::<u32>()
                    .ok()
            })
            .filter_map(|pid| local_task(&dir, pid, &self.group))
            .collect();
        tasks.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        Ok(tasks)
    }
}

/// What the ECS launcher needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EcsSettings {
    /// Cluster.
    pub cluster: String,
    /// Task definition of the broker worker.
    pub task_definition: String,
    /// Container that runs `leasehold broker-worker`.
    pub container: String,
    /// `awsvpc` subnets (empty: no network configuration).
    pub subnets: Vec<String>,
    /// `awsvpc` security groups.
    pub security_groups: Vec<String>,
    /// `FARGATE`, `EC2` or `EXTERNAL`.
    pub launch_type: String,
    /// `startedBy` of every task (at most 36 characters).
    pub group: String,
}

/// Workers as ECS tasks.
#[derive(Debug, Clone)]
pub struct EcsLauncher {
    client: aws_sdk_ecs::Client,
    settings: EcsSettings,
}

fn aws_message<E: aws_sdk_ecs::error::ProvideErrorMetadata>(err: &E) -> String {
    format!(
        "{}: {}",
        err.code().unwrap_or("error"),
        err.message().unwrap_or("no message")
    )
}

fn sdk_error<E, R>(err: aws_sdk_ecs::error::SdkError<E, R>) -> String
where
    E: aws_sdk_ecs::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match err.as_service_error() {
        Some(service) => aws_message(service),
        None => format!("{}", aws_sdk_ecs::error::DisplayErrorContext(&err)),
    }
}

impl EcsLauncher {
    /// A launcher on an ECS client.
    pub fn new(client: aws_sdk_ecs::Client, settings: EcsSettings) -> Self {
        EcsLauncher { client, settings }
    }
}

#[async_trait]
impl TaskLauncher for EcsLauncher {
    async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError> {
        may_start()?;
        let settings = &self.settings;
        let overrides = TaskOverride::builder()
            .container_overrides(
                ContainerOverride::builder()
                    .name(&settings.container)
                    .environment(
                        KeyValuePair::builder()
                            .name(crate::settings::USER_ID.name)
                            .value(user_id.unwrap_or(leasehold_pool::keys::POOL_USER_ID))
                            .build(),
                    )
                    .build(),
            )
            .build();
        let mut request = self
            .client
            .run_task()
            .cluster(&settings.cluster)
            .task_definition(&settings.task_definition)
            .launch_type(LaunchType::from(settings.launch_type.as_str()))
            .started_by(&settings.group)
            .count(1)
            .overrides(overrides);
        if !settings.subnets.is_empty() {
            let vpc = AwsVpcConfiguration::builder()
                .set_subnets(Some(settings.subnets.clone()))
                .set_security_groups(Some(settings.security_groups.clone()))
                .assign_public_ip(AssignPublicIp::Disabled)
                .build()
                .map_err(|err| LaunchError::Start(err.to_string()))?;
            request = request.network_configuration(
                NetworkConfiguration::builder()
                    .awsvpc_configuration(vpc)
                    .build(),
            );
        }
        let output = request
            .send()
            .await
            .map_err(|err| LaunchError::Start(sdk_error(err)))?;
        if let Some(failure) = output.failures().first() {
            return Err(LaunchError::Start(format!(
                "{}: {}",
                failure.reason().unwrap_or("failure"),
                failure.detail().unwrap_or("")
            )));
        }
        output
            .tasks()
            .first()
            .and_then(|task| task.task_arn())
            .map(str::to_owned)
            .ok_or_else(|| LaunchError::Start("RunTask returned no task".into()))
    }

    async fn stop(&self, task_id: &str, reason: &str) -> Result<(), LaunchError> {
        may_stop(task_id)?;
        self.client
            .stop_task()
            .cluster(&self.settings.cluster)
            .task(task_id)
            .reason(reason)
            .send()
            .await
            .map_err(|err| LaunchError::Stop {
                task_id: task_id.to_owned(),
                problem: sdk_error(err),
            })?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
        may_list()?;
        let mut arns = Vec::new();
        let mut pages = self
            .client
            .list_tasks()
            .cluster(&self.settings.cluster)
            .started_by(&self.settings.group)
            .desired_status(DesiredStatus::Running)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|err| LaunchError::List(sdk_error(err)))?;
            arns.extend(page.task_arns().iter().cloned());
        }
        let mut tasks = Vec::new();
        // DescribeTasks takes at most 100 tasks per call.
        for chunk in arns.chunks(100) {
            let described = self
                .client
                .describe_tasks()
                .cluster(&self.settings.cluster)
                .set_tasks(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|err| LaunchError::List(sdk_error(err)))?;
            tasks.extend(described_tasks(chunk, &described)?);
        }
        Ok(tasks)
    }
}

/// The running tasks of one DescribeTasks answer for `requested` (pure). Any
/// failure, or a requested task the answer leaves out, makes the whole
/// listing unusable: the sweep and supervision take a task missing from a
/// listing for a dead one, so a partial list must never pass for a whole one.
fn described_tasks(
    requested: &[String],
    described: &DescribeTasksOutput,
) -> Result<Vec<RunningTask>, LaunchError> {
    if let Some(failure) = described.failures().first() {
        return Err(LaunchError::List(format!(
            "DescribeTasks failed for {} of {} tasks (first {}: {} {})",
            described.failures().len(),
            requested.len(),
            failure.arn().unwrap_or("?"),
            failure.reason().unwrap_or("failure"),
            failure.detail().unwrap_or(""),
        )));
    }
    let answered: HashSet<&str> = described
        .tasks()
        .iter()
        .filter_map(|task| task.task_arn())
        .collect();
    if let Some(missing) = requested
        .iter()
        .find(|arn| !answered.contains(arn.as_str()))
    {
        return Err(LaunchError::List(format!(
            "DescribeTasks left out {missing} (described {} of {})",
            answered.len(),
            requested.len()
        )));
    }
    let mut tasks = Vec::new();
    for task in described.tasks() {
        let Some(arn) = task.task_arn() else { continue };
        if task.last_status() == Some("STOPPED") {
            continue;
        }
        let started = task.started_at().or(task.created_at());
        let user_id = task
            .overrides()
            .map(|o| o.container_overrides())
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.environment())
            .find(|kv| kv.name() == Some(crate::settings::USER_ID.name))
            .and_then(|kv| kv.value())
            .filter(|u| *u != leasehold_pool::keys::POOL_USER_ID)
            .map(str::to_owned);
        tasks.push(RunningTask {
            task_id: arn.to_owned(),
            started_at: started
                .and_then(|t| u64::try_from(t.to_millis().ok()?).ok())
                .unwrap_or(0),
            user_id,
        });
    }
    Ok(tasks)
}

/// A launcher for race tests: its tasks are what the test says runs, its
/// stops are recorded, and a hook can run right after the n-th `list` took
/// its snapshot (a task that starts between two reads of a sweep).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use futures_util::future::BoxFuture;

    use super::{LaunchError, RunningTask, TaskLauncher};

    type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

    /// See the module.
    #[derive(Default)]
    pub struct ScriptedLauncher {
        /// The running tasks (shared, so hooks can start one).
        pub running: Arc<Mutex<Vec<RunningTask>>>,
        /// Task ids stopped, in order.
        pub stopped: Mutex<Vec<String>>,
        hooks: Mutex<BTreeMap<u32, Hook>>,
        lists: Mutex<u32>,
        failing: Mutex<BTreeSet<u32>>,
    }

    impl ScriptedLauncher {
        /// A launcher listing `tasks`.
        pub fn with(tasks: Vec<RunningTask>) -> Self {
            let launcher = ScriptedLauncher::default();
            *launcher.running.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
            launcher
        }

        /// Runs `hook` after the `call`-th `list` (from 1) took its snapshot.
        pub fn after_list<F>(&self, call: u32, hook: F)
        where
            F: FnOnce() -> BoxFuture<'static, ()> + Send + 'static,
        {
            self.hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(call, Box::new(hook));
        }

        /// Makes the `call`-th `list` (from 1) fail, as a listing the
        /// launcher cannot complete (ECS `DescribeTasks` failures) does.
        pub fn fail_list(&self, call: u32) {
            self.failing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(call);
        }

        /// The stopped task ids.
        pub fn stopped(&self) -> Vec<String> {
            self.stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        }
    }

    #[async_trait]
    impl TaskLauncher for ScriptedLauncher {
        async fn start(&self, user_id: Option<&str>) -> Result<String, LaunchError> {
            let task_id = format!("started-{}", rand::random::<u32>());
            self.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(RunningTask {
                    task_id: task_id.clone(),
                    started_at: 0,
                    user_id: user_id.map(str::to_owned),
                });
            Ok(task_id)
        }
        async fn stop(&self, task_id: &str, _reason: &str) -> Result<(), LaunchError> {
            self.stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(task_id.to_owned());
            Ok(())
        }
        async fn list(&self) -> Result<Vec<RunningTask>, LaunchError> {
            let listed = self
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let call = {
                let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
                *lists += 1;
                *lists
            };
            let hook = self
                .hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&call);
            if let Some(hook) = hook {
                hook().await;
            }
            let failing = self
                .failing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&call);
            if failing {
                return Err(LaunchError::List(format!(
                    "scripted failure of list {call}"
                )));
            }
            Ok(listed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ecs::types::{Failure, Task};

    /// The task ids `launcher` lists now.
    async fn task_ids(launcher: &LocalLauncher) -> Vec<String> {
        let listed = launcher.list().await.unwrap();
        listed.into_iter().map(|t| t.task_id).collect()
    }

    /// Writes `pid`'s registry entry the way a worker does for itself.
    fn enter(group: &str, pid: u32, start: u64, user_id: Option<&str>) {
        let entry = LocalEntry {
            group: group.to_owned(),
            pid,
            start_ticks: start,
            user_id: user_id.map(str::to_owned),
        };
        let path = registry_dir(group).unwrap().join(format!("{pid}.json"));
        std::fs::write(path, serde_json::to_vec(&entry).unwrap()).unwrap();
    }

    #[tokio::test]
    async fn local_workers_are_found_by_their_registry_entry_not_their_environment() {
        let group = format!("test-{}", rand::random::<u64>());
        let launcher = LocalLauncher {
            program: PathBuf::from("leasehold"),
            group: group.clone(),
            log_dir: None,
        };
        // A process with no group variable in its environment: only its entry
        // says it is a worker of this group.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        enter(&group, pid, start_ticks(pid).unwrap(), Some("alice"));
        let this = register_local_worker(&group, Some(leasehold_pool::keys::POOL_USER_ID)).unwrap();
        let listed = launcher.list().await.unwrap();
        let ids: Vec<&str> = listed.iter().map(|t| t.task_id.as_str()).collect();
        let me = format!("local-{}", std::process::id());
        let mut expected = vec![format!("local-{pid}"), me.clone()];
        expected.sort();
        assert_eq!(ids, expected);
        let sleeper = listed
            .iter()
            .find(|t| t.task_id == format!("local-{pid}"))
            .unwrap();
        assert_eq!(sleeper.user_id.as_deref(), Some("alice"));
        assert!(
            listed
                .iter()
                .find(|t| t.task_id == me)
                .unwrap()
                .user_id
                .is_none()
        );

        // Stop signals it; once it is gone, its entry is stale and dropped.
        launcher
            .stop(&format!("local-{pid}"), "test")
            .await
            .unwrap();
        child.wait().unwrap();
        let ids = task_ids(&launcher).await;
        assert_eq!(ids, std::slice::from_ref(&me));
        let dir = registry_dir(&group).unwrap();
        assert!(
            !dir.join(format!("{pid}.json")).exists(),
            "a stale entry stays"
        );

        // An entry whose start time is not the process's (a reused pid) is
        // no worker: listing skips it and stopping leaves the process alone.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        enter(
            &group,
            other.id(),
            start_ticks(other.id()).unwrap() + 1,
            None,
        );
        launcher
            .stop(&format!("local-{}", other.id()), "test")
            .await
            .unwrap();
        assert!(
            other.try_wait().unwrap().is_none(),
            "a reused pid was signalled"
        );
        let ids = task_ids(&launcher).await;
        assert_eq!(ids, [me]);
        other.kill().unwrap();
        other.wait().unwrap();

        // A worker's own entry goes when it exits.
        drop(this);
        assert!(launcher.list().await.unwrap().is_empty());
        let _ = std::fs::remove_dir(dir);
    }

    #[test]
    fn a_registry_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let group = format!("test-{}", rand::random::<u64>());
        let dir = registry_dir(&group).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = registry_dir(&group).unwrap_err();
        assert!(err.contains("not a private directory"), "{err}");
        std::fs::remove_dir(dir).unwrap();
    }

    fn arns(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| format!("arn:task/{id}")).collect()
    }

    fn task(id: &str, status: &str) -> Task {
        Task::builder()
            .task_arn(format!("arn:task/{id}"))
            .last_status(status)
            .build()
    }

    #[test]
    fn a_whole_describe_answer_lists_its_running_tasks() {
        let answer = DescribeTasksOutput::builder()
            .tasks(task("t1", "RUNNING"))
            .tasks(task("t2", "STOPPED"))
            .build();
        let tasks = described_tasks(&arns(&["t1", "t2"]), &answer).unwrap();
        let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
        assert_eq!(ids, ["arn:task/t1"]);
    }

    /// Guard: a DescribeTasks failure makes the listing an error, never a
    /// list without the task (which supervision and the sweep would take
    /// for a dead worker).
    #[test]
    fn describe_failures_make_the_listing_an_error() {
        let answer = DescribeTasksOutput::builder()
            .tasks(task("t1", "RUNNING"))
            .failures(
                Failure::builder()
                    .arn("arn:task/t2")
                    .reason("ThrottlingException")
                    .build(),
            )
            .build();
        let err = described_tasks(&arns(&["t1", "t2"]), &answer).unwrap_err();
        assert!(err.to_string().contains("1 of 2 tasks"), "{err}");
        assert!(err.to_string().contains("ThrottlingException"), "{err}");
    }

    /// Guard: an answer that leaves out a requested task (with no failure
    /// either) is as unusable as one with failures.
    #[test]
    fn a_describe_answer_that_leaves_a_task_out_is_an_error() {
        let answer = DescribeTasksOutput::builder()
            .tasks(task("t1", "RUNNING"))
            .build();
        let err = described_tasks(&arns(&["t1", "t2"]), &answer).unwrap_err();
        assert!(err.to_string().contains("left out arn:task/t2"), "{err}");
    }
}
