//! Real-process test harness for the `leasehold` binary: a feed, stream workers
//! and (when a test needs its own) a DynamoDB-compatible server, all on loopback,
//! all killed when the test ends. Server addresses come from
//! `leasehold_testkit`, which the test command fills.

#![allow(dead_code)]

pub mod acl;
pub mod iam;
pub mod recording;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_control::lease::{Lease, LeaseState};
use leasehold_control::store::dynamodb::DynamoLeaseStore;
use leasehold_control::store::{Consistency, list_all};
use leasehold_sink::SinkOptions;
use leasehold_sink::memory::StoredEvent;
use leasehold_sink::redis::RedisSink;
use leasehold_testkit::{dynamodb_client, dynamodb_endpoint, redis_url, unique_name};

/// Process-heavy tests run one at a time: the machine has two cores, and lease
/// timing under heavy contention is not what these tests measure. A serial
/// test runs alone among the tests that start servers or keep processes
/// running: those that may run beside each other take [`side_by_side`].
pub async fn serial() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    SLOTS.write().await
}

/// For a test that starts a server or keeps a process running (a private
/// moto, a sidecar) and may run beside others of its kind, but never beside
/// a [`serial`] one. Every file of these tests was once a test binary of its
/// own, run one after another, so such a test never met another file's
/// serial test; in one binary this keeps it so.
pub async fn side_by_side() -> tokio::sync::RwLockReadGuard<'static, ()> {
    SLOTS.read().await
}

/// [`side_by_side`] for a test without a runtime (`#[test]`).
pub fn side_by_side_blocking() -> tokio::sync::RwLockReadGuard<'static, ()> {
    SLOTS.blocking_read()
}

/// Held exclusively by [`serial`], shared by [`side_by_side`] (fair: a
/// waiting serial test is not overtaken by later ones).
static SLOTS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A child process that is killed (SIGKILL) when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(name: &str, mut command: Command) -> Proc {
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            });
        }
        Proc {
            name: name.into(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits for a printed line containing `needle` and returns it.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{} never printed {needle:?}\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free right now, for a process the test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `127.0.0.1:` and a free port.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A private DynamoDB-compatible server, for tests that stop it.
pub fn private_moto() -> (Proc, String) {
    let python = std::env::var(leasehold_testkit::PYTHON_VAR).unwrap_or_else(|_| "python3".into());
    let port = free_port();
    let script = leasehold_testkit::repo_root().join("scripts/moto_serialized.py");
    let mut command = Command::new(python);
    command.arg(script).arg(port.to_string());
    let proc = Proc::spawn("moto", command);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "private moto did not start\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (proc, format!("http://127.0.0.1:{port}"))
}

/// Lease timings used by every process test: short, so scenarios take seconds.
pub const LEASE_SECONDS: u64 = 3;
pub const SKEW_MS: u64 = 500;
pub const DISCOVERY_MS: u64 = 1000;

/// A `leasehold sidecar` started next to one worker.
pub struct SidecarProc {
    pub proc: Proc,
    /// Its HTTP address (`/metrics`, `/healthz`, `/status`): what Prometheus scrapes.
    pub http: String,
    /// The telemetry address its worker ships to (`TELEMETRY_ADDR`).
    pub telemetry: String,
}

/// A feed, a lease table, a Redis sink and any number of stream workers, some
/// with a sidecar.
pub struct Cluster {
    pub endpoint: String,
    pub table: String,
    pub redis: String,
    /// The feed simulator process (`None` when the test serves the upstream itself).
    feed: Option<Proc>,
    pub feed_url: String,
    pub streams: Vec<String>,
    pub workers: BTreeMap<String, Proc>,
    /// Sidecars by the owner id of the worker they serve.
    pub sidecars: BTreeMap<String, SidecarProc>,
    pub store: DynamoLeaseStore,
    sink: RedisSink,
}

impl Cluster {
    /// `None` when the test servers are not configured (skip).
    pub async fn start(streams: usize, rate: u32) -> Option<Cluster> {
        let endpoint = dynamodb_endpoint()?;
        Self::start_with(endpoint, streams, rate).await
    }

    /// Streams with no traffic while a test runs (one event per 1,000 s).
    pub async fn start_quiet(streams: usize) -> Option<Cluster> {
        let endpoint = dynamodb_endpoint()?;
        Self::start_at_rate(endpoint, streams, "0.001").await
    }

    /// Against a given DynamoDB endpoint (a private server).
    pub async fn start_with(endpoint: String, streams: usize, rate: u32) -> Option<Cluster> {
        Self::start_at_rate(endpoint, streams, &rate.to_string()).await
    }

    /// A lease table and the Redis sink for `streams`, the workers reading
    /// `upstream_url` (an upstream the test serves itself).
    pub async fn start_on(upstream_url: String, streams: Vec<String>) -> Option<Cluster> {
        let endpoint = dynamodb_endpoint()?;
        let redis = redis_url()?;
        let table = unique_name("e2e");
        let store = DynamoLeaseStore::new(dynamodb_client(&endpoint), table.clone());
        store.create_table().await.unwrap();
        let sink = RedisSink::connect(&redis, SinkOptions::default())
            .await
            .unwrap();
        Some(Cluster {
            endpoint,
            table,
            redis,
            feed: None,
            feed_url: upstream_url,
            streams,
            workers: BTreeMap::new(),
            sidecars: BTreeMap::new(),
            store,
            sink,
        })
    }

    /// The feed simulator process.
    pub fn feed(&self) -> &Proc {
        self.feed
            .as_ref()
            .expect("this cluster runs the feed simulator")
    }

    /// Against the test Redis Cluster (`SINK_URL=redis+cluster://…`).
    pub async fn start_on_redis_cluster(streams: usize, rate: u32) -> Option<Cluster> {
        let endpoint = dynamodb_endpoint()?;
        let redis = leasehold_testkit::redis_cluster_url()?;
        Self::start_at(endpoint, redis, streams, &rate.to_string()).await
    }

    async fn start_at_rate(endpoint: String, streams: usize, rate: &str) -> Option<Cluster> {
        let redis = redis_url()?;
        Self::start_at(endpoint, redis, streams, rate).await
    }

    async fn start_at(
        endpoint: String,
        redis: String,
        streams: usize,
        rate: &str,
    ) -> Option<Cluster> {
        let table = unique_name("e2e");
        let store = DynamoLeaseStore::new(dynamodb_client(&endpoint), table.clone());
        store.create_table().await.unwrap();
        // Retention far back: a busy stream's replay after a takeover must not
        // fall off the feed (the feed stores nothing, so this costs nothing).
        let (feed, feed_url) = spawn_feed(&["--rate", rate, "--retention", "100000000"]);
        let prefix = unique_name("s");
        let streams = (0..streams).map(|i| format!("{prefix}-{i}")).collect();
        let sink = RedisSink::connect(&redis, SinkOptions::default())
            .await
            .unwrap();
        Some(Cluster {
            endpoint,
            table,
            redis,
            feed: Some(feed),
            feed_url,
            streams,
            workers: BTreeMap::new(),
            sidecars: BTreeMap::new(),
            store,
            sink,
        })
    }

    /// Starts `leasehold stream-worker` with this owner id.
    pub fn start_worker(&mut self, owner: &str) {
        self.start_worker_with(owner, &[]);
    }

    /// A `leasehold` command with exactly the variables a lease-table
    /// participant needs (the test server, this cluster's table and lease
    /// timings, `owner` as `OWNER_ID`) plus PATH.
    fn lease_command(&self, owner: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("LEASE_TABLE", &self.table)
            .env("LEASE_SECONDS", LEASE_SECONDS.to_string())
            .env("LEASE_SKEW_MARGIN_MS", SKEW_MS.to_string())
            .env("OWNER_ID", owner)
            .env("LEASEHOLD_LOG", "info");
        command
    }

    /// Starts `leasehold stream-worker` with this owner id and variables that
    /// override the harness's.
    pub fn start_worker_with(&mut self, owner: &str, overrides: &[(&str, &str)]) {
        let mut command = self.lease_command(owner);
        command
            .arg("stream-worker")
            .env("DISCOVERY_INTERVAL_MS", DISCOVERY_MS.to_string())
            .env("HANDOFF_POLL_MS", "100")
            .env("DRAIN_TIMEOUT_MS", "2000")
            .env("UPSTREAM_URL", &self.feed_url)
            .env("SINK_URL", &self.redis)
            // Every event kept: the scenarios read the whole sink back
            // (the default cap trims a 20,000 events/s stream within seconds).
            .env("SINK_MAX_LEN", "0")
            .env("STREAM_IDS", self.streams.join(","));
        for (name, value) in overrides {
            command.env(name, value);
        }
        self.workers
            .insert(owner.to_owned(), Proc::spawn(owner, command));
    }

    /// Starts a `leasehold sidecar` (competing for the observer lease in this
    /// cluster's table, as deployed) on loopback ports it picks itself, then
    /// the worker `owner` shipping its telemetry there. The sidecar's
    /// addresses are in `self.sidecars[owner]`.
    pub fn start_worker_with_sidecar(&mut self, owner: &str, overrides: &[(&str, &str)]) {
        let name = format!("{owner}-sidecar");
        let mut command = self.lease_command(&name);
        command.args([
            "sidecar",
            "--listen",
            "127.0.0.1:0",
            "--telemetry-addr",
            "127.0.0.1:0",
        ]);
        let proc = Proc::spawn(&name, command);
        // "sidecar: metrics on http://ADDR/metrics, telemetry on ADDR"
        let line = proc.wait_line("sidecar: metrics on http://", Duration::from_secs(20));
        let (http, telemetry) = line
            .split_once("http://")
            .and_then(|(_, rest)| rest.split_once("/metrics, telemetry on "))
            .map(|(http, telemetry)| (http.to_owned(), telemetry.trim().to_owned()))
            .unwrap_or_else(|| panic!("{name}: unexpected start line {line:?}"));
        let mut overrides = overrides.to_vec();
        overrides.push(("TELEMETRY_ADDR", &telemetry));
        self.start_worker_with(owner, &overrides);
        self.sidecars.insert(
            owner.to_owned(),
            SidecarProc {
                proc,
                http,
                telemetry,
            },
        );
    }

    /// Starts `leasehold dashboard` on this cluster's table, polling exactly
    /// the sidecars started so far, refreshing every 500 ms; returns it and
    /// its address once it listens.
    pub fn start_dashboard(&self) -> (Proc, String) {
        let sidecars: Vec<String> = self
            .sidecars
            .values()
            .map(|s| format!("http://{}", s.http))
            .collect();
        let mut command = self.lease_command("dashboard");
        command
            .args(["dashboard", "--listen", "127.0.0.1:0"])
            .env("DASHBOARD_SIDECARS", sidecars.join(","))
            .env("DASHBOARD_REFRESH_MS", "500");
        let proc = Proc::spawn("dashboard", command);
        let line = proc.wait_line("dashboard: http://", Duration::from_secs(20));
        let addr = line
            .split("http://")
            .nth(1)
            .unwrap_or_default()
            .trim()
            .trim_end_matches('/')
            .to_owned();
        (proc, addr)
    }

    /// The stream records (reserved records left out), a session-mode
    /// stream's expiry read from its session as every reader does.
    pub async fn leases(&self) -> Vec<Lease> {
        let mut records = list_all(&self.store, 100, Consistency::Strong)
            .await
            .unwrap();
        leasehold_control::read::resolve_sessions(&mut records);
        records
            .into_iter()
            .map(|r| r.unwrap())
            .filter(|l| l.is_stream() && self.streams.contains(&l.stream_id))
            .collect()
    }

    /// Owner of each stream that is validly owned right now.
    pub async fn owners(&self) -> BTreeMap<String, String> {
        let now = leasehold_control::clock::unix_ms(std::time::SystemTime::now());
        self.leases()
            .await
            .into_iter()
            .filter(|l| l.state(now) == LeaseState::Owned)
            .map(|l| (l.stream_id, l.owner_id.unwrap()))
            .collect()
    }

    /// Polls until `condition` holds for the owner map; returns the time it took.
    pub async fn wait_owners(
        &self,
        timeout: Duration,
        condition: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let owners = self.owners().await;
            if condition(&owners) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "ownership condition not reached in {timeout:?}: {owners:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Every stream owned by some live worker.
    pub async fn wait_all_owned(&self, timeout: Duration) -> Duration {
        let count = self.streams.len();
        self.wait_owners(timeout, |owners| owners.len() == count)
            .await
    }

    /// The sink's fence for a stream: the token of its last id (layout v2),
    /// 0 when the stream does not exist.
    pub async fn sink_fence(&self, stream: &str) -> u64 {
        let last = self.sink.last_id(stream).await.unwrap();
        last.map_or(0, |id| id.token)
    }

    /// What the sink holds for a stream.
    pub async fn sink_entries(&self, stream: &str) -> Vec<StoredEvent> {
        self.sink.stored(stream).await.unwrap()
    }

    /// Checks a stream's sink: sequences 1..=n without gap or duplicate, and
    /// tokens never decreasing (a decrease would be an accepted stale write).
    /// Returns n.
    pub async fn verify_sink(&self, stream: &str) -> u64 {
        let entries = self.sink_entries(stream).await;
        assert!(!entries.is_empty(), "{stream}: nothing written");
        for (i, entry) in entries.iter().enumerate() {
            assert_eq!(
                entry.seq,
                i as u64 + 1,
                "{stream}: gap or duplicate at entry {i}; around it (seq, token): {:?}",
                entries[i.saturating_sub(3)..(i + 4).min(entries.len())]
                    .iter()
                    .map(|e| (e.seq, e.fence_token))
                    .collect::<Vec<_>>()
            );
        }
        for pair in entries.windows(2) {
            assert!(
                pair[0].fence_token <= pair[1].fence_token,
                "{stream}: seq {} written with token {} after token {}",
                pair[1].seq,
                pair[1].fence_token,
                pair[0].fence_token
            );
        }
        entries.len() as u64
    }

    /// SIGTERM every worker and wait for clean exits.
    pub fn stop_workers(&mut self) {
        for worker in self.workers.values() {
            worker.signal("TERM");
        }
        for worker in self.workers.values_mut() {
            let status = worker.wait_exit(Duration::from_secs(15));
            assert!(
                status.success(),
                "{} exited with {status}\n{}",
                worker.name,
                worker.output()
            );
        }
    }

    /// The workers' and sidecars' output, for failure messages.
    pub fn logs(&self) -> String {
        self.workers
            .values()
            .chain(self.sidecars.values().map(|s| &s.proc))
            .map(|w| {
                format!(
                    "--- {}\n{}",
                    w.name,
                    w.output()
                        .lines()
                        .rev()
                        .take(15)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `leasehold ARGS` to completion with exactly `envs` (plus PATH) and
/// optional stdin; returns the exit status and everything it printed.
pub fn run_leasehold(
    args: &[&str],
    envs: &[(String, String)],
    stdin: Option<&str>,
) -> (std::process::ExitStatus, String) {
    use std::io::Write;
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn leasehold");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, text)
}

/// `leasehold feed` on a free loopback port with `flags` (`--rate`,
/// `--retention`, `--backlog` …); returns the process and its URL once it
/// listens. Tests and benchmarks start every feed through here.
pub fn spawn_feed(flags: &[&str]) -> (Proc, String) {
    let mut args = vec!["feed", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    let feed = spawn_leasehold("feed", &args, &[]);
    let line = feed.wait_line("feed listening on ", Duration::from_secs(10));
    let url = line.rsplit(' ').next().unwrap().to_owned();
    (feed, url)
}

/// Starts `leasehold ARGS` in the background with exactly `envs` (plus PATH).
pub fn spawn_leasehold(name: &str, args: &[&str], envs: &[(String, String)]) -> Proc {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Proc::spawn(name, command)
}

/// `leasehold dev --chaos` with 6 streams, 3 workers, a pool of 2, 3 s leases
/// and a fault every 2 s (takeovers within seconds); returns the process and
/// its dashboard address (`host:port`) once the dashboard line is printed.
pub fn spawn_dev_chaos(name: &str, dashboard_within: Duration) -> (Proc, String) {
    spawn_dev_chaos_with(name, dashboard_within, &[])
}

/// [`spawn_dev_chaos`] with more `dev` arguments (e.g. `--feed exchange`).
pub fn spawn_dev_chaos_with(
    name: &str,
    dashboard_within: Duration,
    extra: &[&str],
) -> (Proc, String) {
    let mut args = vec![
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--streams",
        "6",
        "--workers",
        "3",
        "--pool",
        "2",
        "--lease-seconds",
        "3",
        "--chaos",
        "--chaos-every",
        "2",
    ];
    args.extend_from_slice(extra);
    let dev = spawn_leasehold(name, &args, &[]);
    let line = dev.wait_line("dashboard     http://", dashboard_within);
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    (dev, addr)
}

/// Starts a prepared command in the background (its output captured, killed
/// when dropped), for tests that need more than `spawn_leasehold` sets.
pub fn spawn_command(name: &str, command: Command) -> Proc {
    Proc::spawn(name, command)
}

/// A busy stream's owner killed (SIGKILL) while a peer runs: two streams at
/// `rate` events/s each, two workers with a 10 s lease (renewed every ~3.3 s),
/// the kill 2.5 s after a checkpoint commit, so the checkpoint trails the sink
/// by about 2.5 s of events when the owner dies. Both workers are
/// stopped when it returns; the sink is left to judge.
pub struct BusyTakeover {
    /// The cluster, workers stopped.
    pub cluster: Cluster,
    /// The stream whose owner was killed.
    pub victim: String,
    /// The victim's checkpoint when its owner died.
    pub checkpoint_at_kill: u64,
    /// Events the dead owner wrote past that checkpoint: what a resume from the
    /// checkpoint alone would replay.
    pub past_checkpoint: usize,
    /// Events the new owner wrote.
    pub new_owner_wrote: usize,
}

impl BusyTakeover {
    /// Runs the scenario; `None` when the test servers are not configured.
    pub async fn run(rate: u32) -> Option<BusyTakeover> {
        let mut cluster = Cluster::start(2, rate).await?;
        let lease = [("LEASE_SECONDS", "10"), ("BATCH_MAX_EVENTS", "2000")];
        let owned_by = |owners: &BTreeMap<String, String>, owner: &str| {
            owners.values().filter(|o| o.as_str() == owner).count()
        };
        cluster.start_worker_with("w1", &lease);
        cluster
            .wait_owners(Duration::from_secs(30), |o| {
                o.len() == 2 && owned_by(o, "w1") == 2
            })
            .await;
        cluster.start_worker_with("w2", &lease);
        cluster
            .wait_owners(Duration::from_secs(40), |o| {
                o.len() == 2 && owned_by(o, "w1") == 1 && owned_by(o, "w2") == 1
            })
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let victim: String = cluster
            .owners()
            .await
            .into_iter()
            .find(|(_, owner)| owner == "w1")
            .map(|(stream, _)| stream)
            .expect("w1 holds a stream");
        let checkpoint_of = |leases: Vec<Lease>| {
            leases
                .into_iter()
                .find(|l| l.stream_id == victim)
                .and_then(|l| l.checkpoint)
        };
        // Kill late in a renew interval (the checkpoint rides on renewals,
        // every ~3.3 s here): right after a commit, wait 2.5 s, so the
        // checkpoint trails the sink by about 2.5 s of events whatever the
        // phase the scenario happens to start in.
        let committed = checkpoint_of(cluster.leases().await);
        let start = Instant::now();
        while checkpoint_of(cluster.leases().await) == committed {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no checkpoint commit"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let record = cluster
            .leases()
            .await
            .into_iter()
            .find(|l| l.stream_id == victim)
            .expect("the victim's record");
        cluster.workers["w1"].signal("KILL");
        let (old_token, checkpoint_at_kill) = (record.fence_token, record.checkpoint.unwrap_or(0));
        cluster
            .wait_owners(Duration::from_secs(30), |o| {
                o.get(&victim).map(String::as_str) == Some("w2")
            })
            .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.workers.remove("w1");
        cluster.stop_workers();
        let entries = cluster.sink_entries(&victim).await;
        let past_checkpoint = entries
            .iter()
            .filter(|e| e.fence_token == old_token && e.seq > checkpoint_at_kill)
            .count();
        let new_owner_wrote = entries.iter().filter(|e| e.fence_token > old_token).count();
        Some(BusyTakeover {
            cluster,
            victim,
            checkpoint_at_kill,
            past_checkpoint,
            new_owner_wrote,
        })
    }
}

/// A real Prometheus server (`LEASEHOLD_PROMETHEUS`, Debian's package) on a
/// free loopback port: scrape and rule evaluation every second, its data in a
/// temporary directory removed (after a SIGKILL) when dropped.
pub struct Prometheus {
    pub proc: Proc,
    /// Its HTTP address (API, `/-/ready`).
    pub addr: String,
    dir: std::path::PathBuf,
}

impl Prometheus {
    /// Starts `binary` scraping `targets` (`/metrics`) as job `job` and
    /// evaluating `rule_files`; returns once `/-/ready` answers 200.
    pub async fn start(
        binary: &str,
        job: &str,
        targets: &[String],
        rule_files: &[std::path::PathBuf],
    ) -> Prometheus {
        let dir = std::env::temp_dir().join(unique_name("prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let quoted = |items: Vec<String>| {
            items
                .into_iter()
                .map(|i| format!("'{i}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
            quoted(rule_files.iter().map(|f| f.display().to_string()).collect()),
            quoted(targets.to_vec()),
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, &config).unwrap();
        let addr = free_addr();
        let mut command = Command::new(binary);
        command
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"));
        let prometheus = Prometheus {
            proc: Proc::spawn("prometheus", command),
            addr,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _, _)) = leasehold_testkit::http_get(&prometheus.addr, "/-/ready").await
            {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s\nconfig:\n{config}\nlog:\n{}",
                prometheus.proc.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET path` on the API; the `data` member of a successful answer.
    pub async fn api(&self, path: &str) -> serde_json::Value {
        let (status, _, body) = leasehold_testkit::http_get(&self.addr, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.proc.output()));
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert!(
            status == 200 && json["status"] == "success",
            "GET {path}: {status} {body}\n{}",
            self.proc.output()
        );
        json["data"].clone()
    }

    /// Active alerts (pending and firing), as `/api/v1/alerts` lists them.
    pub async fn alerts(&self) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/alerts").await;
        data["alerts"].as_array().cloned().unwrap_or_default()
    }

    /// Active scrape targets, as `/api/v1/targets` lists them.
    pub async fn targets(&self) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/targets?state=active").await;
        data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The loaded rule groups, as `/api/v1/rules` lists them.
    pub async fn rule_groups(&self) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/rules").await;
        data["groups"].as_array().cloned().unwrap_or_default()
    }

    /// An instant query's result vector.
    pub async fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let data = self.api(&format!("/api/v1/query?query={encoded}")).await;
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// Its log, for failure messages.
    pub fn log(&self) -> String {
        self.proc.output()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A credential sealer's `/metrics` text (asked up to five times, 100 ms
/// apart, so a busy machine's slow accept is not taken for a missing page);
/// panics with what it got otherwise.
pub async fn sealer_metrics(addr: &str) -> String {
    let mut last = String::new();
    for _ in 0..5 {
        match leasehold_testkit::http_get(addr, "/metrics").await {
            Ok((200, _, body)) if !body.is_empty() => return body,
            Ok((status, head, body)) => last = format!("status {status}\n{head}\n{body}"),
            Err(err) => last = format!("request failed: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no /metrics from the sealer at {addr}: {last}");
}
