//! `leasehold`: one binary, every component as a subcommand.
//!
//! This file is the binary's edge: argument parsing, logging setup, and the
//! mapping of outcomes to exit codes (0 ok, 1 failure, 2 invalid configuration).
//! The work itself lives in the library crates; subcommands appear here only
//! once they work.

mod book;
mod broker;
mod dashboard;
mod dev;
mod iam;
mod operator;
mod redis_admin;
mod sidecar;
mod stream;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leasehold_platform::settings::ConfigError;
use tokio_util::sync::CancellationToken;

/// Lease-driven workers for long-lived upstream connections on ECS/Fargate.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage the lease table itself.
    #[command(subcommand)]
    Table(operator::TableCommand),
    /// Operator view of the lease table: register, list, show, release.
    #[command(subcommand)]
    Leases(operator::LeasesCommand),
    /// Rebuild a stream's order book from the sink at an entry and print it.
    Book(book::BookArgs),
    /// Upstream WebSocket feed simulator: sequenced events with replay.
    Feed(stream::FeedArgs),
    /// Lease-driven stream worker: owns streams, consumes them, writes fenced.
    StreamWorker(stream::StreamWorkerArgs),
    /// Per-task telemetry sidecar: /metrics, /healthz, /status, cluster observer.
    Sidecar(sidecar::SidecarArgs),
    /// Cluster web UI and JSON API: ownership, fence tokens, lag, pool, anomalies.
    Dashboard(dashboard::DashboardArgs),
    /// Everything in one process on embedded backends (no AWS, no Redis).
    Dev(dev::DevArgs),
    /// Per-user broker worker; starts in the warm pool (`USER_ID=-1`).
    BrokerWorker(broker::BrokerWorkerArgs),
    /// The one process that decrypts credentials: seals them to the user's worker.
    CredentialSealer(broker::CredentialSealerArgs),
    /// Encrypted broker credentials in Redis.
    #[command(subcommand)]
    Credentials(broker::CredentialsCommand),
    /// Makes sure a user has a worker: active, pool claim, or cold start.
    Claim(broker::ClaimArgs),
    /// Keeps the warm pool at its target size (one pass, or `--every 5m`).
    PoolManager(broker::PoolManagerArgs),
    /// Orphan / stale / duplicate sweep (one pass, or `--every 60s`).
    Maintenance(broker::MaintenanceArgs),
    /// Deploy-time Redis administration: load leasehold's functions.
    #[command(subcommand)]
    Redis(redis_admin::RedisCommand),
}

/// Why a command failed, deciding the exit code.
#[derive(Debug)]
pub enum Failure {
    /// Invalid configuration: every problem is listed, exit 2.
    Config(ConfigError),
    /// The command ran and failed: one line, exit 1.
    Runtime(anyhow::Error),
    /// The command ran and reports a result with its own exit status (e.g.
    /// `claim`: 3 when no outcome came in time); the message is one line.
    Status(u8, String),
}

impl From<ConfigError> for Failure {
    fn from(err: ConfigError) -> Self {
        Failure::Config(err)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Runtime(err)
    }
}

impl From<leasehold_control::LeaseError> for Failure {
    fn from(err: leasehold_control::LeaseError) -> Self {
        Failure::Runtime(err.into())
    }
}

/// Cancels the token on SIGTERM or Ctrl-C: every long-running subcommand
/// drains on it.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutdown requested");
        trigger.cancel();
    });
    token
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `dev --chaos` breaks workers on purpose; their warnings would bury the
    // chaos log and the URLs. LEASEHOLD_LOG=warn brings them back.
    // The SDK's credential chain warns once per source it tried (three
    // ~800-character lines before any error of ours); a missing credential
    // is reported as one line by the call that needed it.
    let logging = leasehold_platform::logging::init(match cli.command {
        Command::Dev(_) => "error",
        _ => "warn,aws_config::meta::credentials::chain=error",
    });
    if let Err(err) = logging {
        eprintln!("leasehold: {err}");
        return ExitCode::from(2);
    }
    let outcome = match cli.command {
        Command::Table(command) => operator::table(command).await,
        Command::Leases(command) => operator::leases(command).await,
        Command::Book(args) => book::book(args).await,
        Command::Feed(args) => stream::feed(args).await,
        Command::StreamWorker(args) => stream::stream_worker(args).await,
        Command::Sidecar(args) => sidecar::sidecar(args).await,
        Command::Dashboard(args) => dashboard::dashboard(args).await,
        Command::Dev(args) => dev::dev(args).await,
        Command::BrokerWorker(args) => broker::broker_worker(args).await,
        Command::CredentialSealer(args) => broker::credential_sealer(args).await,
        Command::Credentials(command) => broker::credentials(command).await,
        Command::Claim(args) => broker::claim(args).await,
        Command::PoolManager(args) => broker::pool_manager(args).await,
        Command::Maintenance(args) => broker::maintenance(args).await,
        Command::Redis(command) => redis_admin::redis(command).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(err)) => {
            eprintln!("leasehold: {err}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(err)) => {
            eprintln!("leasehold: {err:#}");
            ExitCode::from(1)
        }
        Err(Failure::Status(code, message)) => {
            eprintln!("leasehold: {message}");
            ExitCode::from(code)
        }
    }
}
