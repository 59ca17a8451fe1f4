//! What the set reads from and does to the Redis it writes to: cleaning up
//! after a case, and the server's own counters (`INFO`) for the CPU and
//! transactions each write path costs it.

/// Deletes what a case stored in Redis.
pub(super) async fn clean_redis(redis: &str, streams: &[String]) {
    let client = redis::Client::open(redis).expect("redis url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let mut del = redis::cmd("DEL");
    for stream in streams {
        del.arg(format!("peer:{stream}"))
            .arg(leasehold_sink::keys::sink_stream(stream))
            .arg(leasehold_sink::keys::sink_fence(stream));
    }
    let _: redis::RedisResult<u64> = del.query_async(&mut connection).await;
}

/// One section of Redis's `INFO`.
pub(super) async fn redis_info(redis: &str, section: &str) -> String {
    let client = redis::Client::open(redis).expect("redis url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut connection)
        .await
        .expect("INFO")
}

/// Batch transactions Redis has run (`EXEC`: the Redis sink sends one per
/// batch, layout v2; the peer sends none).
pub(super) async fn transactions(redis: &str) -> u64 {
    redis_info(redis, "commandstats")
        .await
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_exec:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds the Redis server has used (`INFO cpu`, user + system). Per
/// event, it is the figure a loaded machine moves least: what each write path
/// costs the one Redis every stream shares.
pub(super) async fn redis_cpu_seconds(redis: &str) -> f64 {
    redis_info(redis, "cpu")
        .await
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}
