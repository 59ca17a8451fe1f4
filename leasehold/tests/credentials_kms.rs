//! Credentials in KMS mode with real processes, moto's KMS API and the real
//! `redis-server`: `credentials put` writes version 2 blobs, a broker worker
//! cold-started for alice serves her requests, `credentials rotate` moves every
//! blob to a new key while the worker keeps serving, and planted canary secrets
//! appear in no process output.
//!
//! The same test inspects the running worker from outside:
//! - **no core dumps**: `/proc/<pid>/limits` says `Max core file size 0 0`;
//! - **not dumpable**: the kernel hands a non-dumpable process's `/proc/<pid>/*`
//!   files to root. The worker runs as an unprivileged uid (`nobody` when the
//!   test runs as root, else the test's own uid), so `/proc/<pid>/environ` owned
//!   by root while `/proc/<pid>/status` says the process runs as another uid is
//!   the kernel's own record of `PR_SET_DUMPABLE 0` (a dumpable process's files
//!   belong to its uid);
//! - **what the worker holds cannot open bob's blob**: its environment (read
//!   from `/proc/<pid>/environ`) has no local key, so the settings it runs with
//!   build a keyring without one; with its KMS access and its user's
//!   encryption context, bob's blob is refused by KMS; and its memory (every
//!   anonymous mapping, read from `/proc/<pid>/mem` as root) contains neither
//!   bob's secret nor bob's data key, while alice's secret is found there (the
//!   scan's positive control).

mod support;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use leasehold_broker::credentials::{
    CipherError, CredentialsCipher, KmsEnvelope, key_id_of, version_of,
};
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_platform::settings::Env;
use leasehold_pool::keys;
use leasehold_testkit::{dynamodb_endpoint, redis_url, unique_name};
use redis::AsyncCommands;
use support::{run_leasehold, serial, spawn_command};

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
        let value: Option<String> = redis.get(keys::response(&request_id)).await.unwrap();
        if let Some(value) = value {
            return serde_json::from_str(&value).unwrap();
        }
        assert!(Instant::now() < deadline, "no response to {request_id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kms_mode_worker_is_hardened_serves_its_user_and_cannot_open_another_users_blob() {
    let _serial = serial().await;
    let (Some(endpoint), Some(base)) = (dynamodb_endpoint(), redis_url()) else {
        return;
    };
    let url = format!("{}/11", base.trim_end_matches('/'));
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut redis).await.unwrap();
    let client = kms_client(&endpoint);
    let old_key = create_key(&client).await;
    let new_key = create_key(&client).await;
    let (alice, bob) = (unique_name("alice"), unique_name("bob"));
    let home = std::env::temp_dir().join(unique_name("home"));
    std::fs::create_dir_all(&home).unwrap();
    let mut envs: Vec<(String, String)> = [
        ("REDIS_URL", url.as_str()),
        ("CREDENTIALS_KMS_KEY_ID", old_key.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "local"),
        ("AWS_SECRET_ACCESS_KEY", "local"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", home.to_str().unwrap()),
        ("WORKER_HEARTBEAT_MS", "300"),
        ("WORKER_MARK_TTL_SECONDS", "5"),
        ("LEASEHOLD_LOG", "debug"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut output = Vec::new();
    let mut run = |args: &[&str], envs: &[(String, String)], stdin: Option<&str>| {
        let (status, text) = run_leasehold(args, envs, stdin);
        assert!(status.success(), "leasehold {args:?}: {status}\n{text}");
        output.push(text.clone());
        text
    };
    for (user, canary) in [(&alice, CANARY_A), (&bob, CANARY_B)] {
        let text = run(
            &["credentials", "put", user],
            &envs,
            Some(&format!(r#"{{"api_key": "{canary}", "account_id": "A1"}}"#)),
        );
        assert!(text.contains("(version 2)"), "{text}");
    }
    let blob_b: String = redis.get(keys::credentials(&bob)).await.unwrap();
    assert_eq!(version_of(&blob_b), Ok(2));
    assert_eq!(key_id_of(&blob_b), Ok(Some(old_key.clone())));

    // The worker for alice, as an unprivileged uid.
    let test_uid = uids(std::process::id())[1];
    let worker_uid = if test_uid == 0 { NOBODY } else { test_uid };
    let (program, bin_dir) = binary_for(worker_uid);
    let mut command = Command::new(&program);
    command
        .arg("broker-worker")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("USER_ID", &alice);
    if test_uid == 0 {
        use std::os::unix::process::CommandExt;
        command.uid(NOBODY).gid(NOBODY);
    }
    let worker = spawn_command("worker-alice", command);
    let pid = worker.pid();
    worker.wait_line("started", Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !redis
        .exists::<_, bool>(keys::worker_active(&alice))
        .await
        .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "the worker never claimed alice\n{}",
            worker.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = round_trip(&mut redis, &alice).await;
    assert_eq!(response["status"], "ok", "{response}");

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

    // What the worker holds. Its environment first (root may read it).
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
    let lookup = |name: &str| environ.get(name).cloned();
    let mut env = Env::new(&lookup);
    let keyring = leasehold_broker::settings::keyring(&mut env);
    env.finish(()).expect("the worker's own settings");
    assert!(
        keyring.local.is_none(),
        "the worker's settings give it a local key"
    );
    // Its KMS access (endpoint and identity from its environment), asked to
    // open bob's blob as the user it serves: KMS refuses (encryption context).
    let its_kms = KmsEnvelope::with_client(kms_client(&environ["AWS_ENDPOINT_URL"]), None);
    let err = its_kms.decrypt(&alice, &blob_b).await.unwrap_err();
    assert!(
        matches!(&err, CipherError::KmsRefused { code, .. } if code == "InvalidCiphertextException"),
        "{err:?}"
    );
    // Its memory: alice's secret is there (the control), bob's secret and
    // bob's data key are not.
    let bob_data_key = {
        let envelope: serde_json::Value =
            serde_json::from_slice(&STANDARD.decode(&blob_b).unwrap()).unwrap();
        let wrapped = STANDARD
            .decode(envelope["encrypted_data_key"].as_str().unwrap())
            .unwrap();
        client
            .decrypt()
            .ciphertext_blob(aws_sdk_kms::primitives::Blob::new(wrapped))
            .encryption_context("user_id", &bob)
            .send()
            .await
            .unwrap()
            .plaintext
            .unwrap()
            .into_inner()
    };
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
    envs.retain(|(k, _)| k != "CREDENTIALS_KMS_KEY_ID");
    envs.push(("CREDENTIALS_KMS_KEY_ID".into(), new_key.clone()));
    let text = run(&["credentials", "rotate"], &envs, None);
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
    // The old key still opens nothing new: blobs name the new key now.
    let blob_a: String = redis.get(keys::credentials(&alice)).await.unwrap();
    assert!(its_kms.decrypt(&alice, &blob_a).await.is_ok());

    worker.signal("TERM");
    let mut worker = worker;
    worker.wait_exit(Duration::from_secs(15));
    let mut everything = output.join("\n");
    everything.push_str(&worker.output());
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
