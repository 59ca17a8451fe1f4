//! Least-privilege Redis: a real `redis-server` loads `deploy/redis-acl.conf`
//! rendered by `deploy/render-redis-acl.sh` (test passwords hashed the way a
//! deployment renders its own), then every role does its real work under its
//! own user and nothing is refused (the ACL log stays empty), and the
//! operations a role must not do are refused with NOPERM: the dashboard and the
//! sidecar cannot read `credentials:*`, the stream worker cannot touch the
//! pool, the broker worker can neither read nor write credentials (the
//! credential sealer, under its own read-only user, seals them to it) nor the sink, no role but
//! admin may switch databases or send or load Lua (a loaded function runs with
//! the caller's rights), and so on. No process prints a password, whatever the URL (`redis://`, `rediss://`, a
//! wrong password).

use std::time::{Duration, Instant};

use crate::support::acl::{AclRedis, assert_refused, envs, password, refused, run_ok};
use crate::support::{free_port, run_leasehold, serial, spawn_feed, spawn_leasehold};
use leasehold_broker::credentials::AesGcmCipher;
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{CredentialBus, Inspect, PoolBus};
use leasehold_pool::keys;
use leasehold_pool::read::PoolReader;
use leasehold_sink::{SinkBatch, SinkEvent, SinkOptions};
use leasehold_testkit::unique_name;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_works_under_its_own_user_and_nothing_more() {
    let _serial = serial().await;
    let Some(mut redis) = AclRedis::start().await else {
        return;
    };
    let mut outputs: Vec<String> = Vec::new();
    let group = unique_name("g").chars().rev().take(30).collect::<String>();
    let key = AesGcmCipher::generate_key();
    let user = unique_name("u");
    let log_dir = std::env::temp_dir().join(unique_name("acl-logs"));
    std::fs::create_dir_all(&log_dir).unwrap();
    let api_url = redis.url("api");

    // ---- Deploy step: no role but admin loads Lua. ----
    // Before it, a worker role's first function call fails and says what to
    // run (it may not load the function itself).
    let unloaded = leasehold_sink::open(&redis.url("stream-worker"), SinkOptions::default())
        .await
        .unwrap();
    let err = unloaded
        .open(&unique_name("early"), 1)
        .await
        .expect_err("a stream-worker loaded its own function");
    assert!(
        err.to_string().contains("leasehold redis load-functions"),
        "{err}"
    );
    let out = run_ok(
        &["redis", "load-functions"],
        &envs(&[("REDIS_URL", &redis.url("admin"))]),
        None,
    );
    let loaded = leasehold_pool::bus::redis::stored_functions().len()
        + leasehold_sink::redis::stored_functions().len();
    assert!(out.contains(&format!("{loaded} functions loaded")), "{out}");
    outputs.push(out);

    // ---- Allowed: each role does its real work; Redis refuses nothing. ----
    redis.reset_log().await;

    // API side: store the user's credentials (`credentials put`).
    let api_env = envs(&[
        ("REDIS_URL", &api_url),
        ("CREDENTIALS_KEY", &key),
        ("POOL_GROUP", &group),
        ("LEASEHOLD_LOG", "debug"),
    ]);
    outputs.push(run_ok(
        &["credentials", "put", &user],
        &api_env,
        Some(r#"{"api_key": "k", "account_id": "A1"}"#),
    ));

    // The credential sealer under its user: the one process with the key.
    // Over HTTPS, as deployed, with health and metrics on a plain port.
    let sealer_port = free_port();
    let sealer_listen = format!("127.0.0.1:{sealer_port}");
    let sealer_metrics = format!("127.0.0.1:{}", free_port());
    let sealer = spawn_leasehold(
        "credential-sealer",
        &["credential-sealer"],
        &envs(&[
            ("REDIS_URL", &redis.url("credential-sealer")),
            ("CREDENTIALS_KEY", &key),
            ("SEALER_LISTEN", &sealer_listen),
            ("SEALER_METRICS_LISTEN", &sealer_metrics),
            ("SEALER_TLS_CERT", leasehold_testkit::sealer_tls::CERT),
            ("SEALER_TLS_KEY", leasehold_testkit::sealer_tls::KEY),
            ("SEALER_CLAIM_REDIS_USERS", "true"),
            ("SEALER_SWEEP_INTERVAL_MS", "300"),
            ("LEASEHOLD_LOG", "debug"),
        ]),
    );
    sealer.wait_line("credential sealer listening", Duration::from_secs(15));
    // Plain HTTP on the sealer's port gets nothing; its health port answers.
    let plain = leasehold_testkit::http_get(&sealer_listen, "/healthz").await;
    assert!(
        !matches!(plain, Ok((200, _, _))),
        "the sealer answered plain HTTP: {plain:?}"
    );
    let health = leasehold_testkit::http_get(&sealer_metrics, "/healthz").await;
    assert!(matches!(health, Ok((200, _, _))), "{health:?}");
    let seal =
        leasehold_testkit::http_get(&sealer_metrics, leasehold_broker::sealer::SEAL_PATH).await;
    assert!(
        matches!(seal, Ok((404 | 405, _, _))),
        "the plain port must not serve seals: {seal:?}"
    );

    // A pool worker under the broker-worker user (as the pool manager's
    // launcher would start it: same group, USER_ID=-1), without a key: its
    // credentials come sealed from the sealer.
    let worker_env = envs(&[
        ("REDIS_URL", &redis.url("broker-worker")),
        (
            "CREDENTIALS_SEALER_URL",
            &format!("https://localhost:{sealer_port}"),
        ),
        ("CREDENTIALS_SEALER_CA", leasehold_testkit::sealer_tls::CA),
        ("POOL_GROUP", &group),
        ("USER_ID", keys::POOL_USER_ID),
        (leasehold_broker::launcher::LOCAL_GROUP_VAR, &group),
        ("WORKER_HEARTBEAT_MS", "300"),
        ("WORKER_MARK_TTL_SECONDS", "5"),
        ("LEASEHOLD_LOG", "debug"),
    ]);
    let mut worker = spawn_leasehold("broker-worker", &["broker-worker"], &worker_env);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let idle = leasehold_pool::bus::redis::scan_keys(
            &mut redis.admin.clone(),
            keys::POOL_WORKER_ACTIVE_PATTERN,
        )
        .await
        .unwrap();
        if !idle.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool worker never marked itself idle\n{}",
            worker.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The pool manager counts it: at target, nothing to start or stop.
    let manager_env = envs(&[
        ("REDIS_URL", &redis.url("pool-manager")),
        ("POOL_GROUP", &group),
        ("POOL_TARGET_SIZE", "1"),
        ("LOCAL_WORKER_LOG_DIR", log_dir.to_str().unwrap()),
        ("LEASEHOLD_LOG", "debug"),
    ]);
    let out = run_ok(&["pool-manager"], &manager_env, None);
    assert!(out.contains("idle 1 target 1 started 0 stopped 0"), "{out}");
    outputs.push(out);

    // API side: `claim` finds the idle worker, pushes the claim, waits for
    // the outcome; the worker claims the user.
    let out = run_ok(&["claim", &user, "--timeout", "15s"], &api_env, None);
    assert!(out.contains(r#""status":"claimed""#), "{out}");
    outputs.push(out);

    // API side: a request in, its response out (the worker serves it with
    // the paper broker, whose ledger is in Redis).
    let mut api = redis.connect("api").await;
    let request_id = unique_name("r");
    let body = serde_json::json!({
        "request_id": request_id, "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    })
    .to_string();
    let _: () = api.lpush(keys::user_requests(&user), &body).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let response = loop {
        let value: Option<String> = api.get(keys::response(&user, &request_id)).await.unwrap();
        if let Some(value) = value {
            break value;
        }
        assert!(
            Instant::now() < deadline,
            "no response\n{}",
            worker.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let response: serde_json::Value = serde_json::from_str(&response).unwrap();
    assert_eq!(response["status"], "ok", "{response}");
    // It served as the claim user the sealer made for this claim: its
    // connections log in as `leasehold-claim-{user}`, which reaches this
    // user's keys and no other's.
    let claim_user = leasehold_pool::claim_users::claim_user_name(&user);
    let users: Vec<String> = redis::cmd("ACL")
        .arg("USERS")
        .query_async(&mut redis.admin)
        .await
        .unwrap();
    assert!(users.contains(&claim_user), "{users:?}");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut redis.admin)
        .await
        .unwrap();
    assert!(
        clients.contains(&format!("user={claim_user} ")),
        "no connection as {claim_user}:\n{clients}"
    );
    let other = unique_name("other");
    for (args, allowed) in [
        (vec!["LLEN", &keys::user_requests(&user)], true),
        (vec!["GET", &keys::response(&user, &request_id)], true),
        (
            vec!["HGET", &keys::request_record(&user, &request_id), "state"],
            true,
        ),
        // The same request id under another user: records and answers are
        // keyed by user, so the claim user reaches none of them.
        (vec!["GET", &keys::response(&other, &request_id)], false),
        (
            vec!["SET", &keys::response(&other, &request_id), "x"],
            false,
        ),
        (
            vec![
                "HSET",
                &keys::request_record(&other, &request_id),
                "state",
                "done",
            ],
            false,
        ),
        (
            vec!["DEL", &keys::request_record(&other, &request_id)],
            false,
        ),
        (vec!["LLEN", &keys::user_requests(&other)], false),
        (vec!["LLEN", &keys::worker_control(&other)], false),
        (vec!["GET", &keys::worker_active(&other)], false),
        (vec!["GET", &keys::credentials(&user)], false),
        (vec!["LLEN", keys::POOL_CLAIMS], false),
    ] {
        let verdict: String = redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&claim_user)
            .arg(&args)
            .query_async(&mut redis.admin)
            .await
            .unwrap();
        assert_eq!(verdict == "OK", allowed, "{claim_user} {args:?}: {verdict}");
    }
    // `claim` again: the user is active (EXISTS on the mark).
    outputs.push(run_ok(&["claim", &user, "--timeout", "0s"], &api_env, None));

    // Maintenance: one sweep (marks, claims left by dead pool workers, the
    // report) and supervision (users with work), all healthy here.
    let maintenance_env = envs(&[
        ("REDIS_URL", &redis.url("maintenance")),
        ("POOL_GROUP", &group),
        ("SWEEP_GRACE_SECONDS", "30"),
        ("LOCAL_WORKER_LOG_DIR", log_dir.to_str().unwrap()),
        ("LEASEHOLD_LOG", "debug"),
    ]);
    outputs.push(run_ok(&["maintenance"], &maintenance_env, None));
    let report: Option<String> = redis
        .admin
        .get(keys::MAINTENANCE_LAST_REPORT)
        .await
        .unwrap();
    assert!(report.is_some(), "maintenance wrote no report");

    // The dashboard and the sidecar as processes under their users: the pool
    // views and gauges come from Redis (their lease reads go to the test's
    // DynamoDB-compatible server).
    if let Some(endpoint) = leasehold_testkit::dynamodb_endpoint() {
        let table = unique_name("acl-leases");
        let aws = [
            ("LEASE_TABLE", table.as_str()),
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ];
        run_ok(&["table", "create"], &envs(&aws), None);
        let mut dashboard_env = envs(&aws);
        dashboard_env.extend(envs(&[
            ("REDIS_URL", &redis.url("dashboard")),
            ("DASHBOARD_REFRESH_MS", "300"),
            ("LEASEHOLD_LOG", "debug"),
        ]));
        let dashboard = spawn_leasehold(
            "dashboard",
            &["dashboard", "--listen", "127.0.0.1:0"],
            &dashboard_env,
        );
        let line = dashboard.wait_line("dashboard: http://", Duration::from_secs(20));
        let addr = line
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, _, body) = leasehold_testkit::http_get(&addr, "/api/pool")
                .await
                .unwrap();
            if status == 200 && body.contains(&user) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the dashboard never showed the claimed user: {status} {body}\n{}",
                dashboard.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, _, body) = leasehold_testkit::http_get(&addr, "/api/anomalies")
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        outputs.push(dashboard.output());

        // The sidecar process under its user: as the cluster observer it
        // publishes the pool gauges it reads from Redis.
        let mut sidecar_env = envs(&aws);
        sidecar_env.extend(envs(&[
            ("REDIS_URL", &redis.url("sidecar")),
            ("OWNER_ID", "acl-sidecar"),
            ("LEASEHOLD_LOG", "debug"),
        ]));
        let sidecar = spawn_leasehold(
            "sidecar",
            &[
                "sidecar",
                "--listen",
                "127.0.0.1:0",
                "--telemetry-addr",
                "127.0.0.1:0",
            ],
            &sidecar_env,
        );
        let line = sidecar.wait_line("sidecar: metrics on http://", Duration::from_secs(20));
        let addr = line
            .split_once("http://")
            .and_then(|(_, rest)| rest.split_once("/metrics"))
            .map(|(addr, _)| addr.to_owned())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, _, body) = leasehold_testkit::http_get(&addr, "/metrics")
                .await
                .unwrap();
            if body.contains(r#"leasehold_pool_workers{state="claimed"} 1"#) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the sidecar never published the pool gauges\n{}",
                sidecar.output()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        outputs.push(sidecar.output());

        // The stream worker process under its user: it owns a stream of the
        // feed simulator, raises the sink's fence and appends.
        let (_feed, feed_url) = spawn_feed(&["--rate", "50"]);
        let stream_id = unique_name("s");
        let mut stream_env = envs(&aws);
        stream_env.extend(envs(&[
            ("SINK_URL", &redis.url("stream-worker")),
            ("UPSTREAM_URL", &feed_url),
            ("STREAM_IDS", &stream_id),
            ("OWNER_ID", "acl-stream"),
            ("LEASE_SECONDS", "3"),
            ("DISCOVERY_INTERVAL_MS", "1000"),
            ("DRAIN_TIMEOUT_MS", "2000"),
            ("LEASEHOLD_LOG", "debug"),
        ]));
        let mut stream_worker = spawn_leasehold("stream-worker", &["stream-worker"], &stream_env);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let len: u64 = redis
                .admin
                .xlen(leasehold_sink::keys::sink_stream(&stream_id))
                .await
                .unwrap();
            if len >= 10 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the stream worker appended nothing\n{}",
                stream_worker.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Layout v2: the fence is the last id's token, no fence key.
        let info: std::collections::HashMap<String, ::redis::Value> = ::redis::cmd("XINFO")
            .arg("STREAM")
            .arg(leasehold_sink::keys::sink_stream(&stream_id))
            .query_async(&mut redis.admin.clone())
            .await
            .unwrap();
        let last: String = ::redis::from_redis_value(info["last-generated-id"].clone()).unwrap();
        let token: u64 = last.split('-').next().unwrap().parse().unwrap();
        assert!((1..1_000_000_000_000).contains(&token), "last id {last}");
        let fence: Option<u64> = redis
            .admin
            .get(leasehold_sink::keys::sink_fence(&stream_id))
            .await
            .unwrap();
        assert_eq!(fence, None, "layout v2 writes no fence key");
        stream_worker.signal("TERM");
        let status = stream_worker.wait_exit(Duration::from_secs(15));
        assert!(status.success(), "{status}\n{}", stream_worker.output());
        outputs.push(stream_worker.output());
    }

    // Dashboard and sidecar: the pool read model over their own users (the
    // same `RedisPoolBus` their processes build from REDIS_URL).
    let dashboard = RedisPoolBus::connect(&redis.url("dashboard"))
        .await
        .unwrap();
    let view = dashboard.pool().await.expect("dashboard pool view");
    assert!(view.claimed.iter().any(|c| c.user_id == user), "{view:?}");
    assert!(dashboard.anomalies().await.unwrap().report.is_some());
    let sidecar = RedisPoolBus::connect(&redis.url("sidecar")).await.unwrap();
    let counts = sidecar.counts().await.expect("sidecar counts");
    assert_eq!(counts.claimed, 1, "{counts:?}");
    assert!(sidecar.anomalies().await.unwrap().report.is_some());

    // Stream worker: the sink opens (fence raised), appends, and fences a
    // lower token, under its own user.
    let sink = leasehold_sink::open(&redis.url("stream-worker"), SinkOptions::default())
        .await
        .unwrap();
    let stream = unique_name("s");
    let opened = sink.open(&stream, 5).await.expect("sink open");
    assert!(!opened.fenced);
    let events = [SinkEvent::data(1, "e1", "{}")];
    let written = sink
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 5,
            events: &events,
        })
        .await
        .expect("sink write");
    assert_eq!(written.accepted, 1);
    let zombie = sink
        .write(SinkBatch {
            stream_id: &stream,
            fence_token: 4,
            events: &events,
        })
        .await
        .expect("sink write");
    assert_eq!(zombie.fenced, 1);
    // SINK_WAIT_REPLICAS: the user may send WAIT. With no replica here the
    // batch is appended and reported unconfirmed, not refused (NOPERM).
    let waiting = leasehold_sink::open(
        &redis.url("stream-worker"),
        SinkOptions {
            wait_replicas: 1,
            wait_timeout: Duration::from_millis(50),
            ..SinkOptions::default()
        },
    )
    .await
    .unwrap();
    let waited = unique_name("s");
    waiting.open(&waited, 5).await.expect("sink open");
    let unconfirmed = waiting
        .write(SinkBatch {
            stream_id: &waited,
            fence_token: 5,
            events: &events,
        })
        .await;
    assert!(
        matches!(&unconfirmed, Err(leasehold_sink::SinkError::Unavailable(why)) if why.contains("0 of 1")),
        "{unconfirmed:?}"
    );

    // Dashboard: a stream page's "sink last seq", through the reader the
    // `leasehold dashboard` process builds from DASHBOARD_SINK_URL.
    let sink_reader = leasehold_sink::reader::RedisSinkReader::lazy(redis.url("dashboard"));
    assert_eq!(
        leasehold_dashboard::sources::sink::SinkReader::last_seq(&sink_reader, &stream).await,
        Ok(Some(1)),
        "the dashboard reads the sink's last seq under its own user"
    );
    assert_eq!(
        leasehold_dashboard::sources::sink::SinkReader::last_seq(
            &sink_reader,
            &unique_name("none")
        )
        .await,
        Ok(None)
    );

    // The claimed worker stops cleanly: release script, marks gone.
    worker.signal("TERM");
    let status = worker.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}\n{}", worker.output());
    let mark: Option<String> = redis.admin.get(keys::worker_active(&user)).await.unwrap();
    assert_eq!(mark, None, "the worker left its mark");
    outputs.push(worker.output());
    let sealer_output = sealer.output();
    assert!(
        sealer_output.contains("credentials sealed to the user's worker"),
        "the worker did not get its credentials from the sealer:\n{sealer_output}"
    );
    outputs.push(sealer_output);
    // The sealer counts what it did on its own /metrics, every result from 0.
    let metrics = crate::support::sealer_metrics(&sealer_metrics).await;
    assert!(
        metrics.contains(r#"leasehold_credential_seals_total{result="sealed"} 1"#),
        "{metrics}"
    );
    for result in leasehold_broker::sealer::SEAL_RESULTS {
        assert!(
            metrics.contains(&format!(
                r#"leasehold_credential_seals_total{{result="{result}"}}"#
            )),
            "{result} missing:\n{metrics}"
        );
    }
    // With its user unserved and no grant left, the sealer deletes the claim user.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _: () = redis
            .admin
            .del(keys::credentials_grant(&user))
            .await
            .unwrap();
        let users: Vec<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async(&mut redis.admin)
            .await
            .unwrap();
        if !users.contains(&claim_user) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{claim_user} outlived its worker\n{}",
            sealer.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let denials = redis.denials().await;
    assert!(
        denials.is_empty(),
        "Redis refused a role's real work:\n{}",
        denials.join("\n")
    );

    // ---- Forbidden: what each role must not do is refused. ----
    // Through the code the dashboard and the sidecar run.
    assert_refused(
        "dashboard reads credentials",
        dashboard.credentials(&user).await,
    );
    assert_refused(
        "sidecar reads credentials",
        sidecar.credentials(&user).await,
    );
    assert_refused(
        "dashboard GET credentials",
        dashboard.get(&keys::credentials(&user)).await,
    );
    for role in ["dashboard", "sidecar"] {
        refused(&redis, role, &["GET", &keys::credentials(&user)]).await;
        refused(&redis, role, &["SET", keys::MAINTENANCE_LAST_REPORT, "x"]).await;
        refused(&redis, role, &["LPUSH", keys::POOL_CLAIMS, "x"]).await;
        refused(
            &redis,
            role,
            &["LRANGE", &keys::user_requests(&user), "0", "-1"],
        )
        .await;
    }
    // The dashboard reads the sink, never writes it or raises its fence.
    let sink_key = leasehold_sink::keys::sink_stream(&stream);
    refused(
        &redis,
        "dashboard",
        &[
            "XADD",
            &sink_key,
            "*",
            "seq",
            "2",
            "event_id",
            "x",
            "fence_token",
            "9",
            "payload",
            "{}",
        ],
    )
    .await;
    refused(&redis, "dashboard", &["XSETID", &sink_key, "99-0"]).await;
    refused(&redis, "dashboard", &["DEL", &sink_key]).await;
    refused(&redis, "dashboard", &["XTRIM", &sink_key, "MAXLEN", "0"]).await;
    // The sidecar has no business with the sink at all.
    refused(
        &redis,
        "sidecar",
        &["XREVRANGE", &sink_key, "+", "-", "COUNT", "1"],
    )
    .await;
    // The stream worker cannot touch the pool (as a bus, or raw).
    let stream_as_bus = RedisPoolBus::connect(&redis.url("stream-worker"))
        .await
        .unwrap();
    assert_refused(
        "stream-worker pushes a claim",
        stream_as_bus.push_claim("{}").await,
    );
    assert_refused(
        "stream-worker reads credentials",
        stream_as_bus.credentials(&user).await,
    );
    refused(
        &redis,
        "stream-worker",
        &["GET", &keys::worker_active(&user)],
    )
    .await;
    refused(
        &redis,
        "stream-worker",
        &["LPUSH", &keys::user_requests(&user), "x"],
    )
    .await;
    // The broker worker can neither read nor write credentials, nor grant
    // them to itself, nor write the sink or the sweep report.
    let broker_as_bus = RedisPoolBus::connect(&redis.url("broker-worker"))
        .await
        .unwrap();
    assert_refused(
        "broker-worker reads credentials",
        broker_as_bus.credentials(&user).await,
    );
    refused(&redis, "broker-worker", &["GET", &keys::credentials(&user)]).await;
    // Nor, with per-claim users, any user's queues, records or responses.
    for args in [
        vec!["LLEN", &keys::user_requests(&user)],
        vec!["LRANGE", &keys::user_processing(&user), "0", "-1"],
        vec!["GET", &keys::response(&user, &request_id)],
        vec!["HGETALL", &keys::request_record(&user, &request_id)],
        vec!["LLEN", &keys::worker_control(&user)],
        // Nor list keys: SCAN is not filtered by key patterns, and would
        // list every newly claimed user to harvest.
        vec!["SCAN", "0"],
        vec!["KEYS", "*"],
    ] {
        refused(&redis, "broker-worker", &args).await;
    }
    for args in [vec!["SCAN", "0"], vec!["KEYS", "*"]] {
        refused(&redis, "broker-worker-shared", &args).await;
    }
    assert_refused(
        "broker-worker grants credentials",
        broker_as_bus
            .grant_credentials(&user, "{}", Duration::from_secs(60))
            .await,
    );
    // Nor make itself a user's holder: user marks and the sealer's holder
    // record are not its to write (its own pool mark is).
    for args in [
        vec!["SET", &keys::worker_active(&user), "x"],
        vec!["DEL", &keys::worker_active(&user)],
        vec!["SET", &keys::seal_holder(&user), "x"],
        vec!["SET", &keys::credentials_grant(&user), "x"],
        vec!["ZADD", keys::SEAL_HOLDERS, "0", &user],
    ] {
        refused(&redis, "broker-worker", &args).await;
    }
    // The sealer writes only grants, user marks and holder records (its
    // assign step): no credentials, claims or queues.
    for args in [
        vec!["SET", &keys::credentials(&user), "x"],
        vec!["DEL", &keys::credentials(&user)],
        vec!["LPUSH", keys::POOL_CLAIMS, "x"],
        vec!["LPUSH", &keys::claims_processing("w9"), "x"],
        vec!["LRANGE", &keys::user_requests(&user), "0", "-1"],
        vec!["GET", &keys::response(&user, &request_id)],
        vec!["SCAN", "0"],
    ] {
        refused(&redis, "credential-sealer", &args).await;
    }
    assert_refused(
        "broker-worker writes credentials",
        broker_as_bus.put_credentials(&user, "x").await,
    );
    let broker_as_sink = leasehold_sink::open(&redis.url("broker-worker"), SinkOptions::default())
        .await
        .unwrap();
    assert_refused(
        "broker-worker opens a sink stream",
        broker_as_sink.open(&stream, 9).await,
    );
    refused(
        &redis,
        "broker-worker",
        &["SET", keys::MAINTENANCE_LAST_REPORT, "x"],
    )
    .await;
    // The API cannot read request records or the paper ledger, nor delete
    // a worker's mark.
    refused(
        &redis,
        "api",
        &["HGETALL", &keys::request_record(&user, &request_id)],
    )
    .await;
    refused(&redis, "api", &["HGETALL", &keys::paper_orders("A1")]).await;
    refused(&redis, "api", &["DEL", &keys::worker_active(&user)]).await;
    refused(&redis, "api", &["SET", &keys::worker_active(&user), "x"]).await;
    // The pool manager only reads pool marks.
    refused(
        &redis,
        "pool-manager",
        &["SET", &keys::pool_worker_active("w9"), "x"],
    )
    .await;
    refused(&redis, "pool-manager", &["GET", &keys::credentials(&user)]).await;
    refused(&redis, "pool-manager", &["LPUSH", keys::POOL_CLAIMS, "x"]).await;
    // Maintenance reads credentials (to forward them in a claim) but cannot
    // write them, nor requests or responses.
    refused(
        &redis,
        "maintenance",
        &["SET", &keys::credentials(&user), "x"],
    )
    .await;
    refused(
        &redis,
        "maintenance",
        &["LPUSH", &keys::user_requests(&user), "x"],
    )
    .await;
    refused(
        &redis,
        "maintenance",
        &["GET", &keys::response(&user, &request_id)],
    )
    .await;
    // No role but admin may run server-wide commands, switch databases, or
    // send or load Lua of its own; a loaded function runs with the caller's
    // rights, so one that reads a key outside the role's patterns is refused.
    let reads_credentials = "return redis.call('GET', 'credentials:x')";
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(reads_credentials)
        .query_async(&mut redis.admin)
        .await
        .unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg("#!lua name=acl_probe\nredis.register_function('acl_probe_get', function(KEYS, ARGV) return redis.call('GET', KEYS[1]) end)")
        .query_async(&mut redis.admin)
        .await
        .unwrap();
    for role in redis.roles.iter().filter(|r| *r != "admin") {
        refused(&redis, role, &["KEYS", "*"]).await;
        refused(&redis, role, &["FLUSHALL"]).await;
        refused(&redis, role, &["CONFIG", "GET", "maxmemory"]).await;
        refused(&redis, role, &["ACL", "LIST"]).await;
        refused(&redis, role, &["SELECT", "1"]).await;
        refused(&redis, role, &["SCRIPT", "LOAD", reads_credentials]).await;
        refused(&redis, role, &["EVAL", reads_credentials, "0"]).await;
        refused(&redis, role, &["EVALSHA", &sha, "0"]).await;
        refused(
            &redis,
            role,
            &[
                "FUNCTION",
                "LOAD",
                "#!lua name=mine\nredis.register_function('mine', function() return 1 end)",
            ],
        )
        .await;
        refused(&redis, role, &["FUNCTION", "DELETE", "acl_probe"]).await;
        refused(&redis, role, &["FUNCTION", "FLUSH"]).await;
        refused(
            &redis,
            role,
            &["FCALL", "acl_probe_get", "1", "outside:probe"],
        )
        .await;
    }
    for role in ["stream-worker", "pool-manager"] {
        refused(
            &redis,
            role,
            &["FCALL", "acl_probe_get", "1", &keys::credentials(&user)],
        )
        .await;
    }
    // The default user (no AUTH) can do nothing.
    let anonymous = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port).as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await;
    if let Ok(mut anonymous) = anonymous {
        let result: redis::RedisResult<Option<String>> =
            anonymous.get(keys::credentials(&user)).await;
        let err = result.expect_err("an unauthenticated client read a key");
        assert!(err.to_string().contains("NOAUTH"), "{err}");
    }

    // ---- No password in any output, whatever the URL. ----
    let wrong = format!(
        "redis://api:wrong-{}@127.0.0.1:{}",
        password("x"),
        redis.port
    );
    let tls = format!("rediss://api:{}@127.0.0.1:{}", password("api"), redis.port);
    for url in [&wrong, &tls] {
        let env = envs(&[
            ("REDIS_URL", url),
            ("POOL_GROUP", &group),
            ("LEASEHOLD_LOG", "debug"),
        ]);
        let (status, output) = run_leasehold(&["claim", &user, "--timeout", "1s"], &env, None);
        assert!(
            !status.success(),
            "claim over {} succeeded",
            url.split('@').nth(1).unwrap()
        );
        outputs.push(output);
    }
    let logs = outputs.join("\n");
    for role in redis.roles.iter().chain(std::iter::once(&"x".to_string())) {
        assert!(
            !logs.contains(&password(role)),
            "a process printed the {role} password:\n{logs}"
        );
    }
}

/// A Redis that may evict keys is refused at start (exit 2, naming the
/// setting and the policy) by every role that writes the pool bus, and by the
/// stream worker's sink check, each under its own user; `noeviction` lets the
/// same commands run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pool_role_refuses_a_redis_that_evicts_keys() {
    let _serial = serial().await;
    let Some(redis) = AclRedis::start().await else {
        return;
    };
    run_ok(
        &["redis", "load-functions"],
        &envs(&[("REDIS_URL", &redis.url("admin"))]),
        None,
    );
    let set_policy = |policy: &'static str| {
        let mut admin = redis.admin.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(&mut admin)
                .await
                .unwrap();
        }
    };
    let group = unique_name("g").chars().rev().take(30).collect::<String>();
    let as_role = |role: &str| {
        envs(&[
            ("REDIS_URL", &redis.url(role)),
            ("POOL_GROUP", &group),
            ("POOL_TARGET_SIZE", "0"),
            ("CREDENTIALS_KEY", &AesGcmCipher::generate_key()),
        ])
    };
    let credentials = r#"{"api_key": "k", "account_id": "A1"}"#;
    let commands: [(&str, &[&str], Option<&str>); 3] = [
        ("maintenance", &["maintenance", "--dry-run"], None),
        ("pool-manager", &["pool-manager"], None),
        ("api", &["credentials", "put", "u-evict"], Some(credentials)),
    ];
    set_policy("allkeys-lru").await;
    // The stream worker's sink, under its own user, before it opens the sink.
    let refused_sink = leasehold_sink::require_noeviction(&redis.url("stream-worker")).await;
    assert!(
        matches!(&refused_sink, Err(leasehold_sink::SinkError::Config(problem))
            if problem.starts_with("SINK_URL: Redis runs with maxmemory-policy allkeys-lru")),
        "{refused_sink:?}"
    );
    for (role, args, stdin) in commands {
        let (status, output) = run_leasehold(args, &as_role(role), stdin);
        assert_eq!(status.code(), Some(2), "{role} {args:?}: {output}");
        assert!(
            output.contains("REDIS_URL: Redis runs with maxmemory-policy allkeys-lru"),
            "{role}: {output}"
        );
        assert!(!output.contains(&password(role)), "{output}");
    }
    set_policy("noeviction").await;
    leasehold_sink::require_noeviction(&redis.url("stream-worker"))
        .await
        .unwrap();
    for (role, args, stdin) in commands {
        let (status, output) = run_leasehold(args, &as_role(role), stdin);
        assert!(status.success(), "{role} {args:?}: {output}");
        assert!(!output.contains("maxmemory-policy"), "{role}: {output}");
    }
}

/// Every settings struct that holds a Redis URL prints it as `[redacted]` in
/// `Debug`, so no log line can show the password even if one formats the
/// whole struct.
#[test]
fn settings_never_show_a_redis_password_in_debug() {
    use leasehold_platform::settings::fixed_lookup;
    let secret = "pw-debug-canary-5b7e1f";
    let url = format!("rediss://dashboard:{secret}@cache.internal:6379/0");
    let url = url.as_str();
    let debug = [
        format!(
            "{:?}",
            leasehold_broker::settings::worker_settings(&fixed_lookup(&[
                ("REDIS_URL", url),
                ("CREDENTIALS_KEY", &AesGcmCipher::generate_key()),
            ]))
            .unwrap()
        ),
        format!(
            "{:?}",
            leasehold_sidecar::settings::parse(&fixed_lookup(&[
                ("OWNER_ID", "s1"),
                ("REDIS_URL", url)
            ]))
            .unwrap()
        ),
        format!(
            "{:?}",
            leasehold_dashboard::settings::parse(&fixed_lookup(&[("REDIS_URL", url)])).unwrap()
        ),
        format!(
            "{:?}",
            leasehold_stream::settings::parse(&fixed_lookup(&[
                ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
                ("SINK_URL", url),
                ("OWNER_ID", "w"),
            ]))
            .unwrap()
        ),
    ];
    for text in debug {
        assert!(!text.contains(secret), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
    }
}
