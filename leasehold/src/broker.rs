//! `leasehold broker-worker`, `credentials put`, `claim`, `pool-manager` and
//! `maintenance`: the broker worker pool's commands (seed 002).

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use leasehold_control::config::{self, Problems};
use leasehold_control::keys;
use leasehold_control::telemetry::LogSink;
use leasehold_control::transport::{BufferedShipper, ShipperConfig};
use leasehold_worker::broker::bus::PoolBus;
use leasehold_worker::broker::bus::redis::RedisPoolBus;
use leasehold_worker::broker::credentials::{Credentials, CredentialsCipher};
use leasehold_worker::broker::launcher::{EcsLauncher, LocalLauncher, TaskLauncher};
use leasehold_worker::broker::paper::{Broker, PaperBroker};
use leasehold_worker::broker::settings::{self, LauncherSettings};
use leasehold_worker::broker::worker::{BrokerWorker, WorkerExit};
use leasehold_worker::broker::{maintenance, pool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Failure;
use crate::stream::shutdown_on_signal;

fn lookup(name: &str) -> Option<String> {
    config::process_env(name)
}

/// Reads `TaskARN` from the ECS task metadata endpoint v4 (plain HTTP on a
/// link-local address, so a minimal HTTP/1.0 GET is enough).
async fn ecs_task_arn(uri: &str) -> Option<String> {
    let rest = uri.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let address = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:80")
    };
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(&address).await.ok()?;
        let request = format!("GET /{path}/task HTTP/1.0\r\nHost: {host}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await.ok()?;
        let text = String::from_utf8_lossy(&body);
        let json = text.split_once("\r\n\r\n")?.1;
        let value: serde_json::Value = serde_json::from_str(json).ok()?;
        value["TaskARN"].as_str().map(str::to_owned)
    };
    tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()
        .flatten()
}

/// `leasehold broker-worker` (configured by environment variables only).
#[derive(Debug, Args)]
pub struct BrokerWorkerArgs {}

/// Runs one broker worker until it exits; non-zero when broker connects are exhausted.
pub async fn broker_worker(_args: BrokerWorkerArgs) -> Result<(), Failure> {
    let mut settings = settings::worker_settings(&lookup)?;
    if let Some(uri) = &settings.ecs_metadata_uri
        && let Some(arn) = ecs_task_arn(uri).await
    {
        settings.worker.task_id = arn.clone();
        settings.worker.metadata.task_arn = arn;
        if lookup(config::WORKER_ID.name).is_none() {
            settings.worker.worker_id = settings
                .worker
                .task_id
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
        }
    }
    let brokers: HashMap<String, Arc<dyn Broker>> = HashMap::from([(
        "paper".to_owned(),
        Arc::new(PaperBroker::new(settings.paper)) as Arc<dyn Broker>,
    )]);
    let shutdown = shutdown_on_signal();
    let worker_id = settings.worker.worker_id.clone();
    // Telemetry goes to the task's sidecar; it outlives the worker loop so the
    // last events (stopped, released) can still be shipped.
    let telemetry_stop = tokio_util::sync::CancellationToken::new();
    let telemetry = Arc::new(BufferedShipper::start(
        ShipperConfig {
            capacity: lookup(config::TELEMETRY_BUFFER.name)
                .and_then(|raw| raw.parse().ok())
                .filter(|capacity: &usize| *capacity > 0)
                .unwrap_or(65_536),
            ..ShipperConfig::new(
                lookup(config::TELEMETRY_ADDR.name)
                    .unwrap_or_else(|| config::TELEMETRY_ADDR.default.to_owned()),
                "broker-worker",
                &worker_id,
            )
        },
        telemetry_stop.clone(),
    ));
    let bus = pool_bus(&settings.redis_url)
        .await
        .context("cannot start the broker worker")?;
    let worker = BrokerWorker::new(
        settings.worker,
        bus,
        Arc::new(settings.cipher),
        brokers,
        telemetry.clone(),
    );
    // One parseable line for launchers and tests.
    println!("broker worker {worker_id} started");
    let exit = worker.run(shutdown).await.context("broker worker failed")?;
    let reason = match exit {
        WorkerExit::Signal => "signal",
        WorkerExit::ControlShutdown => "shutdown message",
        WorkerExit::IdleTimeout => "idle timeout",
        WorkerExit::Lost => "another worker holds the user",
        WorkerExit::AlreadyServed => "user already served",
    };
    println!("broker worker {worker_id} stopped: {reason}");
    crate::stream::flush_telemetry(&telemetry).await;
    telemetry_stop.cancel();
    Ok(())
}

/// The pool bus `REDIS_URL` names (the URL, which may hold a password, is
/// never part of an error).
async fn pool_bus(url: &str) -> anyhow::Result<Arc<dyn PoolBus>> {
    let bus = RedisPoolBus::connect(url)
        .await
        .map_err(|err| anyhow::anyhow!("cannot reach Redis: {err}"))?;
    Ok(Arc::new(bus))
}

async fn launcher(settings: LauncherSettings) -> anyhow::Result<Box<dyn TaskLauncher>> {
    Ok(match settings {
        LauncherSettings::Local { group, log_dir } => Box::new(LocalLauncher {
            program: std::env::current_exe().context("cannot find the leasehold executable")?,
            group,
            log_dir,
        }),
        LauncherSettings::Ecs(ecs) => {
            let sdk = leasehold_control::store::dynamodb::load_sdk_config().await;
            Box::new(EcsLauncher::new(aws_sdk_ecs::Client::new(&sdk), ecs))
        }
    })
}

/// `leasehold credentials …`.
#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// Encrypts a credentials JSON object from stdin into `credentials:{user_id}`.
    Put {
        /// The user.
        user_id: String,
    },
}

/// Runs a `credentials` command.
pub async fn credentials(command: CredentialsCommand) -> Result<(), Failure> {
    let CredentialsCommand::Put { user_id } = command;
    let mut problems = Problems::default();
    let url = settings::redis_url(&mut problems, &lookup);
    let cipher = settings::cipher(&mut problems, &lookup);
    let Some(cipher) = problems.finish(cipher)? else {
        return Err(Failure::Config(config::ConfigError { problems: vec![] }));
    };
    let mut plaintext = zeroize::Zeroizing::new(Vec::new());
    std::io::stdin()
        .read_to_end(&mut plaintext)
        .context("cannot read stdin")?;
    // Refuse what the worker could not use, before storing it.
    Credentials::from_json(&plaintext).map_err(|err| anyhow::anyhow!("stdin: {err}"))?;
    let blob = cipher
        .encrypt(&user_id, &plaintext)
        .map_err(anyhow::Error::from)?;
    pool_bus(&url)
        .await?
        .put_credentials(&user_id, &blob)
        .await
        .context("cannot store the credentials")?;
    println!("stored {}", keys::credentials(&user_id));
    Ok(())
}

/// `leasehold claim USER_ID`.
#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// The user who needs a worker.
    user_id: String,
}

/// Active → nothing; idle pool worker → claim; none → cold start. Prints the path.
pub async fn claim(args: ClaimArgs) -> Result<(), Failure> {
    let mut problems = Problems::default();
    let url = settings::redis_url(&mut problems, &lookup);
    let launcher_settings = settings::launcher_settings(&mut problems, &lookup);
    problems.finish(())?;
    let bus = pool_bus(&url).await?;
    let launcher = launcher(launcher_settings).await?;
    let path = pool::claim_user(bus.as_ref(), launcher.as_ref(), &args.user_id)
        .await
        .map_err(anyhow::Error::from)?;
    tracing::info!(user_id = args.user_id, path = %path, "claim path");
    println!("claim {}: {path}", args.user_id);
    Ok(())
}

/// `leasehold pool-manager`.
#[derive(Debug, Args)]
pub struct PoolManagerArgs {
    /// Repeat the pass at this period (e.g. `5m`); default: one pass.
    #[arg(long)]
    every: Option<humantime::Duration>,
}

/// Keeps the warm pool at `POOL_TARGET_SIZE`.
pub async fn pool_manager(args: PoolManagerArgs) -> Result<(), Failure> {
    let mut problems = Problems::default();
    let url = settings::redis_url(&mut problems, &lookup);
    let launcher_settings = settings::launcher_settings(&mut problems, &lookup);
    let target = settings::pool_target(&mut problems, &lookup);
    problems.finish(())?;
    let bus = pool_bus(&url).await?;
    let launcher = launcher(launcher_settings).await?;
    let shutdown = shutdown_on_signal();
    loop {
        let outcome = pool::reconcile(bus.as_ref(), launcher.as_ref(), target, &LogSink)
            .await
            .map_err(anyhow::Error::from)?;
        println!(
            "pool: idle {} target {target} started {} stopped {}",
            outcome.idle,
            outcome.started.len(),
            outcome.stopped.len()
        );
        let Some(every) = args.every else {
            return Ok(());
        };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every.into()) => {}
        }
    }
}

/// `leasehold maintenance`.
#[derive(Debug, Args)]
pub struct MaintenanceArgs {
    /// Repeat the sweep at this period (e.g. `60s`); default: one sweep.
    #[arg(long)]
    every: Option<humantime::Duration>,
    /// Only report what would be done.
    #[arg(long)]
    dry_run: bool,
}

/// The orphan / stale / duplicate sweep.
pub async fn maintenance(args: MaintenanceArgs) -> Result<(), Failure> {
    let mut problems = Problems::default();
    let url = settings::redis_url(&mut problems, &lookup);
    let launcher_settings = settings::launcher_settings(&mut problems, &lookup);
    let sweep = settings::sweep_config(&mut problems, &lookup, args.dry_run);
    problems.finish(())?;
    let bus = pool_bus(&url).await?;
    let launcher = launcher(launcher_settings).await?;
    let shutdown = shutdown_on_signal();
    loop {
        let report = maintenance::sweep(bus.as_ref(), launcher.as_ref(), &sweep, &LogSink)
            .await
            .map_err(anyhow::Error::from)?;
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
        let Some(every) = args.every else {
            return Ok(());
        };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every.into()) => {}
        }
    }
}
