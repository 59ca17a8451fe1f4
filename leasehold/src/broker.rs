//! `leasehold broker-worker`, `credentials put`, `claim`, `pool-manager` and
//! `maintenance`: the broker worker pool's commands.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use leasehold_broker::credentials::{self as creds, Credentials, CredentialsCipher};
use leasehold_broker::launcher::{LOCAL_GROUP_VAR, TaskLauncher, register_local_worker};
use leasehold_broker::maintenance;
use leasehold_broker::manager::{self, ClaimWait};
use leasehold_broker::sealer::{self, CredentialSealer};
use leasehold_broker::settings::{self, LauncherSettings};
use leasehold_broker::supervise::{self, SuperviseConfig};
use leasehold_broker::worker::BrokerWorker;
use leasehold_platform::periodic::try_once_or_every;
use leasehold_platform::settings::{ConfigError, Env, process_env as lookup};
use leasehold_pool::bus::PoolBus;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::keys;
use leasehold_pool::protocol::ClaimStatus;
use leasehold_pool::settings::REDIS_URL;
use leasehold_telemetry::LogSink;
use leasehold_telemetry::transport::BufferedShipper;

use crate::{Failure, iam, shutdown_on_signal};

/// Reads settings from the environment with every problem at once.
fn read<T>(read: impl FnOnce(&mut Env) -> T) -> Result<T, ConfigError> {
    let mut env = Env::new(&lookup);
    let value = read(&mut env);
    env.finish(value)
}

/// `leasehold broker-worker` (configured by environment variables only).
#[derive(Debug, Args)]
pub(crate) struct BrokerWorkerArgs {}

/// No core dumps and (Linux) not dumpable, before any secret is read.
fn harden() -> anyhow::Result<()> {
    leasehold_platform::hardening::harden_for_secrets()
        .context("cannot disable core dumps; refusing to handle credentials")?;
    Ok(())
}

/// `leasehold credential-sealer` (configured by environment variables only).
#[derive(Debug, Args)]
pub(crate) struct CredentialSealerArgs {}

/// Runs the credential sealer until SIGTERM: the one process that decrypts
/// blobs, answering broker workers with credentials sealed to them.
pub(crate) async fn credential_sealer(_args: CredentialSealerArgs) -> Result<(), Failure> {
    iam::declare("credential-sealer", &lookup);
    harden()?;
    let settings = settings::sealer_settings(&lookup)?;
    if settings.callers.is_none() {
        tracing::warn!(
            "SEALER_CALLER_AUTH=none: the sealer answers any caller that reaches it (outside ECS only; set aws-iam to have callers prove their task role)"
        );
    }
    let bus = pool_bus(settings.redis_url.expose(), false).await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let interval = settings.sweep_interval;
    let tls = settings.tls.clone();
    let observability = match settings.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?,
        ),
        None => None,
    };
    let sealer = CredentialSealer::from_settings(bus, settings).await;
    let sealer = Arc::new(sealer.map_err(|err| anyhow::anyhow!("cannot reach Redis: {err}"))?);
    // One parseable line for tests and operators.
    let addr = listener.local_addr().context("no local address")?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("credential sealer listening on {addr} ({scheme})");
    let metrics = sealer::install_metrics().context("cannot install the metrics recorder")?;
    let shutdown = shutdown_on_signal();
    if let Some(listener) = observability {
        let served = sealer::serve_observability(listener, metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(err) = served.await {
                tracing::error!(error = %err, "the sealer's health and metrics listener failed");
            }
        });
    }
    sealer::serve(listener, sealer, interval, Some(metrics), tls, shutdown)
        .await
        .context("credential sealer failed")?;
    Ok(())
}

/// Runs one broker worker until it exits; non-zero when broker connects are exhausted.
pub(crate) async fn broker_worker(_args: BrokerWorkerArgs) -> Result<(), Failure> {
    iam::declare("broker-worker", &lookup);
    harden()?;
    let mut settings = settings::worker_settings(&lookup)?;
    // Started by a local launcher: register where it lists its workers (a
    // hardened process's environ is readable by root only).
    let user = lookup(settings::USER_ID.name);
    let _registered = lookup(LOCAL_GROUP_VAR)
        .map(|group| register_local_worker(&group, user.as_deref()))
        .transpose()
        .map_err(|err| anyhow::anyhow!("cannot register with the local launcher: {err}"))?;
    // On ECS the task ARN is the worker's identity in its marks: without it the
    // maintenance sweep would take this healthy worker for an orphan, so a
    // failed lookup ends the worker rather than fall back to `local-{pid}`.
    let task = leasehold_platform::ecs::task_identity()
        .await
        .context("cannot start the broker worker")?;
    settings.adopt_task(&lookup, task)?;
    let shutdown = shutdown_on_signal();
    let worker_id = settings.worker.worker_id.clone();
    // Telemetry goes to the task's sidecar; it outlives the worker loop so the
    // last events (stopped, released) can still be shipped.
    let telemetry_stop = tokio_util::sync::CancellationToken::new();
    let shipper =
        read(|env| leasehold_telemetry::settings::shipper(env, "broker-worker", &worker_id))?;
    let telemetry = Arc::new(BufferedShipper::start(shipper, telemetry_stop.clone()));
    let bus = pool_bus(settings.redis_url.expose(), false).await?;
    let worker = BrokerWorker::from_settings(settings, bus, telemetry.clone());
    // One parseable line for launchers and tests.
    println!("broker worker {worker_id} started");
    let exit = worker.run(shutdown).await.context("broker worker failed")?;
    println!("broker worker {worker_id} stopped: {}", exit.reason());
    telemetry.flush(Duration::from_millis(500)).await;
    telemetry_stop.cancel();
    Ok(())
}

/// The pool bus `REDIS_URL` names (the URL, which may hold a password, is
/// never part of an error), refused (exit 2) unless it runs with
/// `maxmemory-policy noeviction`.
///
/// `fail_fast` for an operator's command (a refused Redis is reported at
/// once); workers and the sealer connect patiently.
async fn pool_bus(url: &str, fail_fast: bool) -> Result<Arc<dyn PoolBus>, Failure> {
    let connect = if fail_fast {
        RedisPoolBus::connect_failing_fast(url).await
    } else {
        RedisPoolBus::connect(url).await
    };
    let bus = connect.map_err(|err| anyhow::anyhow!("cannot reach Redis: {err}"))?;
    bus.require_noeviction()
        .await
        .map_err(|err| ConfigError::one(err.to_string()))?;
    Ok(Arc::new(bus))
}

async fn launcher(settings: LauncherSettings) -> anyhow::Result<Box<dyn TaskLauncher>> {
    let launcher = settings.launcher().await;
    launcher.context("cannot find the leasehold executable")
}

/// `leasehold credentials …`.
#[derive(Debug, Subcommand)]
pub(crate) enum CredentialsCommand {
    /// Encrypts a credentials JSON object from stdin into `credentials:{user_id}`
    /// (version 2 under `CREDENTIALS_KMS_KEY_ID` when set, else version 1 with
    /// the local key).
    Put {
        /// The user.
        user_id: String,
    },
    /// Re-encrypts every `credentials:*` blob under `CREDENTIALS_KMS_KEY_ID`
    /// (version 1 blobs too, with the local key) and asks active workers to
    /// reload. Blobs name their key, so workers keep working throughout.
    Rotate,
}

/// Runs a `credentials` command.
pub(crate) async fn credentials(command: CredentialsCommand) -> Result<(), Failure> {
    iam::declare("credentials", &lookup);
    harden()?;
    match command {
        CredentialsCommand::Put { user_id } => put_credentials(&user_id).await,
        CredentialsCommand::Rotate => rotate_credentials().await,
    }
}

async fn put_credentials(user_id: &str) -> Result<(), Failure> {
    let (url, cipher) = read(|env| (env.get(&REDIS_URL), settings::keyring(env)))?;
    // The descriptor itself, unbuffered: std's stdin buffer would keep a copy.
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("cannot read stdin")?;
    let plaintext = creds::read_plaintext(std::fs::File::from(stdin))
        .map_err(|err| anyhow::anyhow!("stdin: {err}"))?;
    // Refuse what the worker could not use, before storing it.
    Credentials::from_json(&plaintext).map_err(|err| anyhow::anyhow!("stdin: {err}"))?;
    let blob = cipher
        .encrypt(user_id, &plaintext)
        .await
        .map_err(anyhow::Error::from)?;
    pool_bus(&url, true)
        .await?
        .put_credentials(user_id, &blob)
        .await
        .context("cannot store the credentials")?;
    let version = creds::version_of(&blob).unwrap_or(0);
    println!("stored {} (version {version})", keys::credentials(user_id));
    Ok(())
}

async fn rotate_credentials() -> Result<(), Failure> {
    let (url, cipher) = read(|env| {
        let key_id = env.required(&settings::CREDENTIALS_KMS_KEY_ID, "by `credentials rotate`");
        (env.get(&REDIS_URL), key_id.map(|_| settings::keyring(env)))
    })?;
    let cipher = cipher.expect("a missing key id is a recorded problem");
    let bus = pool_bus(&url, true).await?;
    let report = leasehold_broker::rotation::rotate_all(bus.as_ref(), &cipher)
        .await
        .map_err(anyhow::Error::from)?;
    for line in report.lines() {
        println!("{line}");
    }
    if !report.failed.is_empty() {
        let failed = report.failed.len();
        return Err(anyhow::anyhow!("{failed} blobs were not rotated (listed above)").into());
    }
    Ok(())
}

/// `leasehold claim USER_ID`.
#[derive(Debug, Args)]
pub(crate) struct ClaimArgs {
    /// The user who needs a worker.
    user_id: String,
    /// How long to wait for the outcome (`pool:claim:{claim_id}`, or the
    /// user's mark after a cold start); `0s` does not wait.
    #[arg(long, default_value = "30s")]
    timeout: humantime::Duration,
}

/// Exit status of `claim` when no outcome came within `--timeout`.
const CLAIM_TIMEOUT_EXIT: u8 = 3;

/// Active → nothing; idle pool worker → claim; none → cold start. Prints the
/// path, then waits for the outcome and prints it: exit 0 when the user has a
/// worker, 1 when the claim failed, 3 when nothing was known in time.
pub(crate) async fn claim(args: ClaimArgs) -> Result<(), Failure> {
    iam::declare("claim", &lookup);
    let (url, launcher_settings) =
        read(|env| (env.get(&REDIS_URL), settings::launcher_settings(env)))?;
    let bus = pool_bus(&url, true).await?;
    let launcher = launcher(launcher_settings).await?;
    let path = manager::claim_user(bus.as_ref(), launcher.as_ref(), &args.user_id)
        .await
        .map_err(anyhow::Error::from)?;
    tracing::info!(user_id = args.user_id, path = %path, "claim path");
    println!("claim {}: {path}", args.user_id);
    let timeout: Duration = args.timeout.into();
    if timeout.is_zero() {
        return Ok(());
    }
    let poll = Duration::from_millis(50);
    let wait = manager::wait_for_claim(bus.as_ref(), &path, &args.user_id, timeout, poll);
    match wait.await.map_err(anyhow::Error::from)? {
        ClaimWait::AlreadyActive => Ok(()),
        ClaimWait::Pending => Err(Failure::Status(
            CLAIM_TIMEOUT_EXIT,
            format!(
                "no outcome for {} within {} (pending, not failed)",
                args.user_id, args.timeout
            ),
        )),
        ClaimWait::Active => {
            println!("claim {}: active", args.user_id);
            Ok(())
        }
        ClaimWait::Outcome { claim_id, outcome } => {
            // The stored JSON, one line, for scripts.
            println!("{}", outcome.to_json());
            match outcome.status {
                ClaimStatus::Claimed => Ok(()),
                ClaimStatus::Failed => Err(Failure::Status(
                    1,
                    format!(
                        "claim {claim_id} failed: {}",
                        outcome.error.as_deref().unwrap_or("no reason given")
                    ),
                )),
            }
        }
    }
}

/// `leasehold pool-manager`.
#[derive(Debug, Args)]
pub(crate) struct PoolManagerArgs {
    /// Repeat the pass at this period (e.g. `5m`); default: one pass.
    #[arg(long)]
    every: Option<humantime::Duration>,
}

/// Keeps the warm pool at `POOL_TARGET_SIZE`.
pub(crate) async fn pool_manager(args: PoolManagerArgs) -> Result<(), Failure> {
    iam::declare("pool-manager", &lookup);
    let (url, launcher_settings, target) = read(|env| {
        (
            env.get(&REDIS_URL),
            settings::launcher_settings(env),
            settings::pool_target(env),
        )
    })?;
    let bus = pool_bus(&url, true).await?;
    let launcher = launcher(launcher_settings).await?;
    let every = args.every.map(Into::into);
    try_once_or_every(every, shutdown_on_signal(), || async {
        let outcome = manager::reconcile(bus.as_ref(), launcher.as_ref(), target, &LogSink)
            .await
            .map_err(anyhow::Error::from)?;
        println!("{}", outcome.summary(target));
        Ok(())
    })
    .await
}

/// `leasehold maintenance`.
#[derive(Debug, Args)]
pub(crate) struct MaintenanceArgs {
    /// Repeat the sweep at this period (e.g. `60s`); default: one sweep.
    #[arg(long)]
    every: Option<humantime::Duration>,
    /// Only report what would be done.
    #[arg(long)]
    dry_run: bool,
}

/// The orphan / stale / duplicate sweep, the re-queue of dead pool workers'
/// claims, and supervision (users whose worker died with work pending get a
/// new one). With `--every`, supervision also runs on its own, shorter
/// period (`SUPERVISE_INTERVAL_SECONDS`) between sweeps, under the sweep's
/// guard rails (`SWEEP_MAX_FRACTION`, a second look).
pub(crate) async fn maintenance(args: MaintenanceArgs) -> Result<(), Failure> {
    iam::declare("maintenance", &lookup);
    let (url, launcher_settings, sweep, interval, heartbeat) = read(|env| {
        (
            env.get(&REDIS_URL),
            settings::launcher_settings(env),
            settings::sweep_config(env, args.dry_run),
            settings::supervise_interval(env),
            // Assumed for marks that do not carry their own heartbeat (written
            // before marks did): how long the second look waits.
            env.get(&settings::WORKER_HEARTBEAT_MS),
        )
    })?;
    let bus = pool_bus(&url, true).await?;
    let launcher = launcher(launcher_settings).await?;
    let every: Option<Duration> = args.every.map(Into::into);
    let stop = shutdown_on_signal();
    let sweeps = try_once_or_every(every, stop.clone(), || async {
        let report = maintenance::sweep_with_heartbeat(
            bus.as_ref(),
            launcher.as_ref(),
            &sweep,
            heartbeat,
            &LogSink,
        )
        .await
        .map_err(anyhow::Error::from)?;
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
        Ok(())
    });
    let (Some(lock), Some(_)) = (sweep.supervise, every) else {
        return sweeps.await;
    };
    // The sweep's guard rails (its valve, the mark's own TTL and heartbeat, a
    // second look) apply to these passes too: they release marks as well.
    let config = SuperviseConfig::for_sweep(&sweep, lock, heartbeat);
    let supervision = leasehold_platform::periodic::every(interval, stop.clone(), || async {
        let (bus, launcher) = (bus.as_ref(), launcher.as_ref());
        for line in
            supervise::supervision_pass(bus, launcher, &config, args.dry_run, &LogSink).await
        {
            println!("{line}");
        }
    });
    tokio::pin!(sweeps, supervision);
    tokio::select! {
        swept = &mut sweeps => {
            // A failed sweep ends the command; supervision stops with it.
            stop.cancel();
            (&mut supervision).await;
            swept
        }
        () = &mut supervision => sweeps.await,
    }
}
