//! Credentials in KMS mode with real processes, a private moto (KMS and IAM,
//! with IAM enforcement on) and a real `redis-server` running the deployed ACL
//! file: `credentials put` writes version 2 blobs, the credential sealer (its
//! own Redis user, its own AWS identity) seals alice's credentials to her
//! broker worker, which runs with its own environment, Redis user and AWS
//! identity (the policies `deploy/iam` ships); `credentials rotate` moves every
//! blob to a new key while the worker keeps serving; planted canary secrets
//! appear in no process output.
//!
//! The same test inspects the running worker from outside:
//! - **no core dumps**: `/proc/<pid>/limits` says `Max core file size 0 0`;
//! - **not dumpable**: the kernel hands a non-dumpable process's `/proc/<pid>/*`
//!   files to root. The worker runs as an unprivileged uid (`nobody` when the
//!   test runs as root, else the test's own uid), so `/proc/<pid>/environ` owned
//!   by root while `/proc/<pid>/status` says the process runs as another uid is
//!   the kernel's own record of `PR_SET_DUMPABLE 0`;
//! - **everything the worker holds cannot open bob's credentials**: its
//!   environment has no local key; its AWS identity may not `kms:Decrypt`
//!   bob's data key even with bob's encryption context; its Redis user may not
//!   `GET credentials:bob`; the sealer refuses it bob (no grant, and with one
//!   it is not bob's worker); and its memory (every anonymous mapping) holds
//!   neither bob's secret nor bob's data key, while alice's secret is found
//!   there (the scan's positive control).
//!
//! moto checks a KMS action against the resource `*` only, evaluates no
//! policy condition and names `ReEncrypt`'s permission after the API, so the
//! shipped policies are applied with their resources widened to `*`, their
//! conditions dropped and `kms:ReEncrypt` beside `kms:ReEncryptFrom`. For the worker that
//! loses nothing: the old worker policy's condition only asked for *a*
//! `user_id` context, which an attacker supplies (bob's).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::acl::{AclRedis, assert_refused, envs, refused, run_ok};
use crate::support::iam::{Identity, iam_users, kms_as, shipped_policy};
use crate::support::{free_port, private_moto, serial, spawn_command, spawn_leasehold};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use leasehold_broker::credentials::{key_id_of, version_of};
use leasehold_broker::sealer::SEAL_PATH;
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_pool::keys;
use leasehold_testkit::{http_post_json, unique_name};
use redis::AsyncCommands;

const CANARY_A: &str = "CANARY-alice-0b7d-never-print";
const CANARY_B: &str = "CANARY-bob-93e1-never-print";
const NOBODY: u32 = 65534;

fn kms_client(endpoint: &str) -> aws_sdk_kms::Client {
    aws_sdk_kms::Client::new(&local_sdk_config(RetryPolicy::Standard, endpoint))
}

async fn create_key(client: &aws_sdk_kms::Client) -> String {
    let key = client.create_key().send().await.expect("CreateKey");
    key.key_metadata().unwrap().arn().unwrap().to_owned()
}

/// `Uid:` of a process: real, effective, saved, filesystem.
fn uids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

/// The leasehold binary where an unprivileged uid can execute it: the target
/// directory may sit under a home directory only root can enter. A hard link
/// (same file system) or a copy in a fresh world-readable directory.
fn binary_for(uid: u32) -> (std::path::PathBuf, Option<std::path::PathBuf>) {
    let program = std::path::PathBuf::from(env!("CARGO_BIN_EXE_leasehold"));
    if uid != NOBODY {
        return (program, None);
    }
    let dir = std::env::temp_dir().join(unique_name("leasehold-bin"));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let linked = dir.join("leasehold");
    if std::fs::hard_link(&program, &linked).is_err() {
        std::fs::copy(&program, &linked).unwrap();
    }
    (linked, Some(dir))
}

/// Every readable anonymous mapping of `pid` (heap, stacks, anonymous
/// regions: where a process keeps what it computed), concatenated.
fn anonymous_memory(pid: u32) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut out = Vec::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let path = fields.get(5).copied().unwrap_or("");
        if !fields[1].starts_with('r')
            || !(path.is_empty() || path == "[heap]" || path.starts_with("[stack"))
        {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let mut region = vec![0u8; (end - start) as usize];
        if mem.seek(SeekFrom::Start(start)).is_ok() && mem.read_exact(&mut region).is_ok() {
            out.extend_from_slice(&region);
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn round_trip(
    redis: &mut redis::aio::MultiplexedConnection,
    user: &str,
) -> serde_json::Value {
    let request_id = unique_name("r");
    let body = serde_json::json!({
        "request_id": request_id, "action": "place_order",
        "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
        "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}
    });
    let _: () = redis
        .lpush(keys::user_requests(user), body.to_string())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let value: Option<String> = redis.get(keys::response(user, &request_id)).await.unwrap();
        if let Some(value) = value {
            return serde_json::from_str(&value).unwrap();
        }
        assert!(Instant::now() < deadline, "no response to {request_id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The environment of a process signing as this identity.
fn aws_env(endpoint: &str, (key, secret): &Identity) -> Vec<(String, String)> {
    envs(&[
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", key),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kms_mode_worker_is_hardened_serves_its_user_and_holds_nothing_that_opens_another_users_credentials()
 {
    let _serial = serial().await;
    let Some(acl) = AclRedis::start().await else {
        return;
    };
    let (_moto, endpoint) = private_moto();
    run_ok(
        &["redis", "load-functions"],
        &envs(&[("REDIS_URL", &acl.url("admin"))]),
        None,
    );
    let mut redis = acl.admin.clone();
    let setup = kms_client(&endpoint);
    let old_key = create_key(&setup).await;
    let new_key = create_key(&setup).await;
    // Each process gets the AWS identity its task role would give it.
    let identities = iam_users(
        &endpoint,
        serde_json::json!({
            "broker-worker": shipped_policy("broker-worker-task-policy.json"),
            "credential-sealer": shipped_policy("credential-sealer-task-policy.json"),
            "operator": shipped_policy("credentials-operator-policy.json"),
            "test": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }),
    );
    let (alice, bob) = (unique_name("alice"), unique_name("bob"));
    let home = std::env::temp_dir().join(unique_name("home"));
    std::fs::create_dir_all(&home).unwrap();
    let common = envs(&[
        ("HOME", home.to_str().unwrap()),
        ("WORKER_HEARTBEAT_MS", "300"),
        ("WORKER_MARK_TTL_SECONDS", "5"),
        ("LEASEHOLD_LOG", "debug"),
    ]);
    let with = |parts: &[Vec<(String, String)>]| -> Vec<(String, String)> {
        parts.iter().flatten().cloned().collect()
    };
    let mut operator_env = with(&[
        common.clone(),
        aws_env(&endpoint, &identities["operator"]),
        envs(&[
            ("REDIS_URL", &acl.url("api")),
            ("CREDENTIALS_KMS_KEY_ID", &old_key),
        ]),
    ]);
    let mut output = Vec::new();
    let mut run = |args: &[&str], envs: &[(String, String)], stdin: Option<&str>| {
        let text = run_ok(args, envs, stdin);
        output.push(text.clone());
        text
    };
    for (user, canary) in [(&alice, CANARY_A), (&bob, CANARY_B)] {
        let text = run(
            &["credentials", "put", user],
            &operator_env,
            Some(&format!(r#"{{"api_key": "{canary}", "account_id": "A1"}}"#)),
        );
        assert!(text.contains("(version 2)"), "{text}");
    }
    let blob_b: String = redis.get(keys::credentials(&bob)).await.unwrap();
    assert_eq!(version_of(&blob_b), Ok(2));
    assert_eq!(key_id_of(&blob_b), Ok(Some(old_key.clone())));

    // The credential sealer: the one process that may decrypt.
    let sealer_addr = format!("127.0.0.1:{}", free_port());
    let sealer = spawn_leasehold(
        "credential-sealer",
        &["credential-sealer"],
        &with(&[
            common.clone(),
            aws_env(&endpoint, &identities["credential-sealer"]),
            envs(&[
                ("REDIS_URL", &acl.url("credential-sealer")),
                ("CREDENTIALS_KMS_KEY_ID", &old_key),
                ("SEALER_LISTEN", &sealer_addr),
                // Self-managed Redis: the claimed worker serves through a
                // user confined to alice's keys (the pool-wide
                // `broker-worker` user reaches no user's queues).
                ("SEALER_CLAIM_REDIS_USERS", "true"),
                ("SEALER_SWEEP_INTERVAL_MS", "300"),
            ]),
        ]),
    );
    sealer.wait_line("credential sealer listening", Duration::from_secs(15));

    // A pool worker, as an unprivileged uid, with the broker task's identity.
    let test_uid = uids(std::process::id())[1];
    let worker_uid = if test_uid == 0 { NOBODY } else { test_uid };
    let (program, bin_dir) = binary_for(worker_uid);
    let worker_env = with(&[
        common.clone(),
        aws_env(&endpoint, &identities["broker-worker"]),
        envs(&[
            ("REDIS_URL", &acl.url("broker-worker")),
            ("CREDENTIALS_SEALER_URL", &format!("http://{sealer_addr}")),
            ("USER_ID", keys::POOL_USER_ID),
        ]),
    ]);
    let mut command = Command::new(&program);
    command
        .arg("broker-worker")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(worker_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if test_uid == 0 {
        use std::os::unix::process::CommandExt;
        command.uid(NOBODY).gid(NOBODY);
    }
    let worker = spawn_command("worker", command);
    let pid = worker.pid();
    worker.wait_line("started", Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(15);
    let worker_id = loop {
        let idle =
            leasehold_pool::bus::redis::scan_keys(&mut redis, keys::POOL_WORKER_ACTIVE_PATTERN)
                .await
                .unwrap();
        if let Some(key) = idle.first() {
            break key
                .trim_start_matches(keys::WORKER_ACTIVE_PREFIX)
                .trim_start_matches("-1:")
                .to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the worker never joined the pool\n{}",
            worker.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The API's claim: a grant, then the claim; the worker asks the sealer.
    let api_env = with(&[common.clone(), envs(&[("REDIS_URL", &acl.url("api"))])]);
    let text = run(&["claim", &alice, "--timeout", "15s"], &api_env, None);
    assert!(
        text.contains(r#""status":"claimed""#),
        "{text}\n{}",
        worker.output()
    );
    let response = round_trip(&mut redis, &alice).await;
    assert_eq!(response["status"], "ok", "{response}");
    // Redis does not replicate users: a failover or an `ACL LOAD` drops the
    // claim user and ends the worker's connections. The sealer makes it again
    // from its holder record, and the worker serves on with the login it has.
    let claim_user = leasehold_pool::claim_users::claim_user_name(&alice);
    let _: u64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&claim_user)
        .query_async(&mut redis)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names: Vec<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async(&mut redis)
            .await
            .unwrap();
        if names.contains(&claim_user) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{claim_user} never came back\n{}",
            sealer.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response = round_trip(&mut redis, &alice).await;
    assert_eq!(response["status"], "ok", "{response}\n{}", worker.output());

    // No core dumps: soft and hard limit 0.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    let values: Vec<&str> = core.split_whitespace().skip(4).take(2).collect();
    assert_eq!(values, ["0", "0"], "{core}");
    // Not dumpable: its /proc files belong to root although it runs as another uid.
    let running_as = uids(pid);
    assert!(
        running_as.iter().all(|&u| u == worker_uid && u != 0),
        "{running_as:?}"
    );
    let owner = std::fs::metadata(format!("/proc/{pid}/environ"))
        .unwrap()
        .uid();
    assert_eq!(
        owner, 0,
        "a dumpable process's /proc files belong to its uid ({worker_uid})"
    );

    // Everything the worker holds. Its environment first (root may read it).
    let environ: HashMap<String, String> = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap()
        .split(|&b| b == 0)
        .filter_map(|kv| {
            std::str::from_utf8(kv)
                .ok()?
                .split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    for name in ["CREDENTIALS_KEY", "CREDENTIALS_KEY_FILE"] {
        assert!(
            !environ.contains_key(name),
            "{name} in the worker's environment"
        );
    }
    // Its AWS identity, asked to unwrap bob's data key with bob's own
    // context: refused (moto answers 403 AccessDenied, in a body the SDK
    // cannot parse for KMS, hence the status).
    let bob_wrapped = {
        let envelope: serde_json::Value =
            serde_json::from_slice(&STANDARD.decode(&blob_b).unwrap()).unwrap();
        STANDARD
            .decode(envelope["encrypted_data_key"].as_str().unwrap())
            .unwrap()
    };
    let identity = (
        environ["AWS_ACCESS_KEY_ID"].clone(),
        environ["AWS_SECRET_ACCESS_KEY"].clone(),
    );
    let denied = kms_as(&environ["AWS_ENDPOINT_URL"], &identity)
        .decrypt()
        .ciphertext_blob(aws_sdk_kms::primitives::Blob::new(bob_wrapped.clone()))
        .encryption_context("user_id", &bob)
        .send()
        .await
        .expect_err("the broker worker's AWS identity unwrapped bob's data key");
    assert_eq!(
        denied.raw_response().map(|r| r.status().as_u16()),
        Some(403),
        "{denied:?}"
    );
    // Its Redis user: bob's blob is not readable, and no grant can be written.
    refused(&acl, "broker-worker", &["GET", &keys::credentials(&bob)]).await;
    let its_redis = redis::Client::open(environ["REDIS_URL"].as_str()).unwrap();
    let mut its_redis = its_redis.get_multiplexed_async_connection().await.unwrap();
    let read: redis::RedisResult<Option<String>> = its_redis.get(keys::credentials(&bob)).await;
    assert_refused("the worker's own Redis user reads bob's blob", read);
    // Its seal key, as published in alice's mark: the sealer gives it no bob,
    // neither without a grant nor with one (it is not bob's worker).
    let mark_text: String = redis.get(keys::worker_active(&alice)).await.unwrap();
    let mark = leasehold_pool::protocol::MarkValue::parse(&mark_text).unwrap();
    assert_eq!(mark.worker_id, worker_id);
    let ask_for_bob = serde_json::json!({
        "user_id": bob, "worker_id": worker_id, "seal_key": mark.seal_key.clone().unwrap(),
    })
    .to_string();
    let (status, _, body) = http_post_json(&sealer_addr, SEAL_PATH, &ask_for_bob)
        .await
        .unwrap();
    assert_eq!(status, 403, "{body}");
    let _: () = redis
        .set_ex(
            keys::credentials_grant(&bob),
            leasehold_pool::protocol::CredentialsGrant::new(
                leasehold_pool::protocol::GrantReason::Claim,
                1,
            )
            .for_claim("claim-bob")
            .to_json(),
            60,
        )
        .await
        .unwrap();
    let (status, _, body) = http_post_json(&sealer_addr, SEAL_PATH, &ask_for_bob)
        .await
        .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("is not the worker of user"), "{body}");
    // Nor can it forge bob's mark to become his worker in the sealer's eyes:
    // its Redis user writes no user's mark, nor the sealer's holder record.
    for args in [
        vec!["SET", &keys::worker_active(&bob), &mark_text],
        vec!["DEL", &keys::worker_active(&alice)],
        vec!["SET", &keys::seal_holder(&bob), "{}"],
    ] {
        refused(&acl, "broker-worker", &args).await;
    }
    // A second seal on alice's grant, by her own worker with its own key: the
    // grant was used by the claim's seal.
    let ask_for_alice = serde_json::json!({
        "user_id": alice, "worker_id": worker_id, "seal_key": mark.seal_key.clone().unwrap(),
    })
    .to_string();
    let (status, _, body) = http_post_json(&sealer_addr, SEAL_PATH, &ask_for_alice)
        .await
        .unwrap();
    assert_eq!(status, 409, "{body}");
    // Every refusal is counted where an alert sees it.
    let metrics = crate::support::sealer_metrics(&sealer_addr).await;
    for result in ["no_grant", "not_the_holder", "grant_used"] {
        assert!(
            metrics.contains(&format!(
                r#"leasehold_credential_seals_total{{result="{result}"}} 1"#
            )),
            "{metrics}"
        );
    }
    // Its memory: alice's secret is there (the control), bob's secret and
    // bob's data key are not.
    let bob_data_key = kms_as(&endpoint, &identities["test"])
        .decrypt()
        .ciphertext_blob(aws_sdk_kms::primitives::Blob::new(bob_wrapped))
        .encryption_context("user_id", &bob)
        .send()
        .await
        .unwrap()
        .plaintext
        .unwrap()
        .into_inner();
    let memory = anonymous_memory(pid);
    assert!(memory.len() > 1 << 20, "read only {} bytes", memory.len());
    assert!(
        contains(&memory, CANARY_A.as_bytes()),
        "control: alice's secret not found in the scan"
    );
    assert!(
        !contains(&memory, CANARY_B.as_bytes()),
        "bob's secret is in alice's worker"
    );
    assert!(
        !contains(&memory, &bob_data_key),
        "bob's data key is in alice's worker"
    );
    drop(memory);

    // Rotation to a new key while the worker runs: KMS re-wraps each data
    // key (ReEncrypt), so nonce and ciphertext stay and no plaintext is made.
    let field = |blob: &str, name: &str| -> String {
        let envelope: serde_json::Value =
            serde_json::from_slice(&STANDARD.decode(blob).unwrap()).unwrap();
        envelope[name].as_str().unwrap().to_owned()
    };
    let before: String = redis.get(keys::credentials(&bob)).await.unwrap();
    operator_env.retain(|(k, _)| k != "CREDENTIALS_KMS_KEY_ID");
    operator_env.push(("CREDENTIALS_KMS_KEY_ID".into(), new_key.clone()));
    let text = run(&["credentials", "rotate"], &operator_env, None);
    assert!(
        text.contains(
            "rotated 2 of 2 blobs (0 from the local key); reload_credentials sent to 1 active workers"
        ),
        "{text}"
    );
    let after: String = redis.get(keys::credentials(&bob)).await.unwrap();
    assert_eq!(field(&after, "ciphertext"), field(&before, "ciphertext"));
    assert_eq!(field(&after, "nonce"), field(&before, "nonce"));
    assert_ne!(
        field(&after, "encrypted_data_key"),
        field(&before, "encrypted_data_key")
    );
    for user in [&alice, &bob] {
        let blob: String = redis.get(keys::credentials(user)).await.unwrap();
        assert_eq!(key_id_of(&blob), Ok(Some(new_key.clone())), "{user}");
    }
    worker.wait_line("credentials reloaded", Duration::from_secs(15));
    let dead: u64 = redis
        .llen(keys::dead_letter(&keys::worker_control(&alice)))
        .await
        .unwrap();
    assert_eq!(dead, 0, "the reload failed:\n{}", worker.output());
    assert_eq!(round_trip(&mut redis, &alice).await["status"], "ok");
    // The reload went through the sealer, under the new key.
    assert!(
        sealer
            .output()
            .matches("credentials sealed to the user's worker")
            .count()
            >= 2,
        "{}",
        sealer.output()
    );

    worker.signal("TERM");
    let mut worker = worker;
    worker.wait_exit(Duration::from_secs(15));
    let mut everything = output.join("\n");
    everything.push_str(&worker.output());
    everything.push_str(&sealer.output());
    assert!(everything.contains("broker worker"), "{everything}");
    for canary in [CANARY_A, CANARY_B] {
        assert!(
            !everything.contains(canary),
            "a secret leaked:\n{everything}"
        );
    }
    if let Some(dir) = bin_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_dir_all(home);
}
