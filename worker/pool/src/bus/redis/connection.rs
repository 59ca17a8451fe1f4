//! The Redis pool bus's connections: the shared command connection, the
//! connections reserved for blocking pops (ended by `CLIENT UNBLOCK`), SCAN,
//! and the classification of Redis errors. Kept apart from the `PoolBus` impl,
//! which says what each step does, not how it reaches Redis.

use std::sync::Mutex;
use std::time::Duration;

use leasehold_platform::redis_functions::StoredFunction;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use tokio_util::sync::CancellationToken;

use super::RedisPoolBus;
use super::scripts::{Functions, metadata_args};
use crate::bus::{BusError, MarkWrite, whole_seconds};
use crate::keys;

/// Keys SCAN asks for per call: large enough for few round trips, small
/// enough that no single call blocks a shared Redis.
const SCAN_COUNT: u64 = 500;

/// A blocking pop gets this long beyond its own timeout before the connection
/// is considered dead.
const BLOCK_GRACE: Duration = Duration::from_secs(10);

/// How often `CLIENT UNBLOCK` is repeated while the pop has not reached Redis
/// yet, and for how long at most.
const UNBLOCK_RETRY: Duration = Duration::from_millis(20);
const UNBLOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Redis errors, without the URL (a `RedisError`'s text never includes it; it
/// may name the command).
/// How the pool's shared connections (re)connect. Workers and the sealer
/// are patient: the client retries six times with exponential backoff (about
/// 9.5 s), which rides out a Redis restart or failover. `fail_fast` is for
/// an operator's command or the dashboard, which report and go on: a Redis
/// that refuses connections is reported within a fraction of a second (the
/// patient default outlasted `claim --timeout 2s` and every refresh).
pub(crate) fn manager_config(fail_fast: bool) -> ConnectionManagerConfig {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    if fail_fast {
        config
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500))
    } else {
        config
    }
}

pub(crate) fn classify(err: redis::RedisError) -> BusError {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        BusError::Unavailable(err.to_string())
    } else {
        BusError::Rejected(err.to_string())
    }
}

/// Keys matching `pattern`, by SCAN (never KEYS: it would block Redis on a
/// large keyspace); sorted, without the duplicates SCAN may return.
pub async fn scan_keys<C: ConnectionLike + Send>(
    redis: &mut C,
    pattern: &str,
) -> Result<Vec<String>, redis::RedisError> {
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(redis)
            .await?;
        found.extend(batch);
        if next == 0 {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}

/// A connection reserved for blocking pops, with its `CLIENT ID`.
pub(in crate::bus) struct Blocking {
    connection: MultiplexedConnection,
    id: i64,
}

impl RedisPoolBus {
    /// Connects (the URL is never part of an error), patiently: what a
    /// worker or the sealer does ([`manager_config`]).
    pub async fn connect(url: &str) -> Result<Self, BusError> {
        Self::connect_with(url, false).await
    }

    /// Connects, reporting an unreachable Redis at once: what an operator's
    /// command and the dashboard do.
    pub async fn connect_failing_fast(url: &str) -> Result<Self, BusError> {
        Self::connect_with(url, true).await
    }

    async fn connect_with(url: &str, fail_fast: bool) -> Result<Self, BusError> {
        let client = redis::Client::open(url)
            .map_err(|err| BusError::Config(format!("invalid Redis URL ({:?})", err.kind())))?;
        let commands =
            ConnectionManager::new_with_config(client.clone(), manager_config(fail_fast))
                .await
                .map_err(classify)?;
        Ok(RedisPoolBus {
            client,
            commands,
            blocking: Mutex::default(),
            functions: Functions::new(),
        })
    }

    pub(in crate::bus) fn commands(&self) -> ConnectionManager {
        self.commands.clone()
    }

    pub(in crate::bus) async fn blocking_connection(&self) -> Result<Blocking, BusError> {
        let idle = self
            .blocking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        if let Some(blocking) = idle {
            return Ok(blocking);
        }
        // No response timeout: the pop's own timeout plus a grace bounds it.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(Duration::from_secs(2)));
        let mut connection = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(classify)?;
        let id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut connection)
            .await
            .map_err(classify)?;
        Ok(Blocking { connection, id })
    }
    /// One blocking command (its timeout argument appended here) on a
    /// connection of its own, ended early by `interrupt` through `CLIENT
    /// UNBLOCK`, so whatever Redis already did is still reported.
    pub(in crate::bus) async fn blocking<T: redis::FromRedisValue>(
        &self,
        mut command: redis::Cmd,
        name: &'static str,
        timeout: Duration,
        interrupt: &CancellationToken,
    ) -> Result<T, BusError> {
        let Blocking { connection, id } = self.blocking_connection().await?;
        // 0 would block forever.
        command.arg(format!("{:.3}", timeout.as_secs_f64().max(0.01)));
        // A handle of its own for the command, so the connection can go back
        // to the idle list afterwards.
        let mut popping = connection.clone();
        let pop = tokio::time::timeout(
            timeout + BLOCK_GRACE,
            command.query_async::<T>(&mut popping),
        );
        tokio::pin!(pop);
        let result = tokio::select! {
            result = &mut pop => result,
            _ = interrupt.cancelled() => {
                let patience = tokio::time::Instant::now() + UNBLOCK_PATIENCE;
                loop {
                    let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("UNBLOCK")
                        .arg(id)
                        .query_async(&mut self.commands())
                        .await;
                    match unblocked {
                        Ok(1) => break pop.await,
                        // Not blocked yet (the pop is still on its way) or
                        // already answered: wait a little for it and retry.
                        Ok(_) if tokio::time::Instant::now() < patience => {
                            tokio::select! {
                                result = &mut pop => break result,
                                _ = tokio::time::sleep(UNBLOCK_RETRY) => {}
                            }
                        }
                        Ok(_) => break pop.await,
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot unblock a blocking pop; waiting for its timeout");
                            break pop.await;
                        }
                    }
                }
            }
        };
        match result {
            Ok(Ok(popped)) => {
                self.blocking
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Blocking { connection, id });
                Ok(popped)
            }
            // The connection is dropped: its state is unknown.
            Ok(Err(err)) => Err(classify(err)),
            Err(_) => Err(BusError::Unavailable(format!(
                "{name} got no answer within its timeout"
            ))),
        }
    }

    /// One command on the shared connection, its failure classified.
    pub(in crate::bus) async fn query<T: redis::FromRedisValue>(
        &self,
        command: &redis::Cmd,
    ) -> Result<T, BusError> {
        command
            .query_async(&mut self.commands())
            .await
            .map_err(classify)
    }

    pub(in crate::bus) async fn lpush(&self, list: &str, body: &str) -> Result<(), BusError> {
        let _: i64 = self.query(redis::cmd("LPUSH").arg(list).arg(body)).await?;
        Ok(())
    }

    pub(in crate::bus) async fn set(&self, key: &str, value: &str) -> Result<(), BusError> {
        let _: () = self.query(redis::cmd("SET").arg(key).arg(value)).await?;
        Ok(())
    }

    pub(in crate::bus) async fn invoke_mark_script(
        &self,
        script: &StoredFunction,
        mark: &MarkWrite<'_>,
    ) -> Result<bool, BusError> {
        let done: i64 = metadata_args(
            script
                .key(keys::worker_active(mark.user_id))
                .key(keys::worker_metadata(mark.user_id))
                .arg(mark.worker_id)
                .arg(mark.value)
                .arg(whole_seconds(mark.ttl)),
            mark.metadata,
        )
        .invoke_async(&mut self.commands())
        .await
        .map_err(classify)?;
        Ok(done == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis that refuses connections is reported at once, not after the
    /// client's default ~9.5 s of reconnect attempts (which outlasted every
    /// caller's timeout: `claim --timeout 2s`, the dashboard's refresh).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_connection_is_reported_within_a_second() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let began = std::time::Instant::now();
        let result = RedisPoolBus::connect_failing_fast(&format!("redis://{closed}")).await;
        let took = began.elapsed();
        assert!(
            matches!(result, Err(BusError::Unavailable(_))),
            "{:?}",
            result.err()
        );
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
}
