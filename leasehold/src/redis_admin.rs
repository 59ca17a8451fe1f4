//! `leasehold redis …`: deploy-time Redis administration.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use leasehold_platform::settings::{Env, process_env};
use leasehold_pool::settings::REDIS_URL;
use leasehold_sink::redis::RedisConnection;
use leasehold_stream::settings::SINK_URL;

use crate::Failure;

/// `leasehold redis …`
#[derive(Debug, Subcommand)]
pub(crate) enum RedisCommand {
    /// Load leasehold's Lua as Redis functions (`FUNCTION LOAD REPLACE`), as a
    /// user allowed to (the admin role): once per deploy and per Redis, before
    /// the workers start. Worker roles may only call them (`FCALL`).
    LoadFunctions {
        /// Use `SINK_URL` (which may name a Redis Cluster: every primary gets
        /// them) instead of `REDIS_URL`.
        #[arg(long)]
        sink: bool,
    },
}

/// Runs a `redis` command.
pub(crate) async fn redis(command: RedisCommand) -> Result<(), Failure> {
    match command {
        RedisCommand::LoadFunctions { sink } => load_functions(sink).await,
    }
}

async fn load_functions(sink: bool) -> Result<(), Failure> {
    let mut env = Env::new(&process_env);
    let url = env.get(if sink { &SINK_URL } else { &REDIS_URL });
    let url = env.finish(url)?;
    let mut connection = RedisConnection::connect(&url, Duration::from_secs(10), 3)
        .await
        .context("cannot connect to Redis")?;
    let functions: Vec<_> = leasehold_pool::bus::redis::stored_functions()
        .into_iter()
        .chain(leasehold_sink::redis::stored_functions())
        .collect();
    for function in &functions {
        function
            .load(&mut connection)
            .await
            .with_context(|| format!("cannot load {}", function.name()))?;
        println!("loaded {}", function.name());
    }
    println!("{} functions loaded", functions.len());
    Ok(())
}
