use super::*;

#[test]
fn bad_values_are_all_reported_and_the_key_is_never_echoed() {
    let lookup = |name: &str| match name {
        "CREDENTIALS_KEY" => Some("CANARY-not-a-key".to_owned()),
        "WORKER_HEARTBEAT_MS" => Some("soon".to_owned()),
        "PAPER_FAILURE_RATE" => Some("2".to_owned()),
        _ => None,
    };
    let err = worker_settings(&lookup).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.problems.len(), 3, "{text}");
    assert!(!text.contains("CANARY"), "{text}");
}

#[test]
fn defaults_follow_the_seed() {
    let key = AesGcmCipher::generate_key();
    let lookup = move |name: &str| (name == "CREDENTIALS_KEY").then(|| key.clone());
    let settings = worker_settings(&lookup).unwrap();
    assert_eq!(settings.worker.user_id, None);
    assert_eq!(settings.worker.heartbeat, Duration::from_secs(5));
    assert_eq!(settings.worker.mark_ttl, Duration::from_secs(30));
    assert_eq!(settings.worker.block, Duration::from_secs(30));
    assert_eq!(settings.worker.idle_timeout, Duration::from_secs(1800));
    assert_eq!(settings.worker.health_check, Duration::from_secs(60));
    assert_eq!(settings.worker.connect.attempts, 3);
    let timeouts = settings.worker.connect.timeouts;
    assert_eq!(timeouts.connect, Duration::from_secs(15));
    assert_eq!(timeouts.order, Duration::from_secs(10));
    assert_eq!(timeouts.lookup, Duration::from_secs(5));
    assert_eq!(timeouts.ping, Duration::from_secs(5));
    assert_eq!(settings.worker.queue_max, 1_000);
    assert_eq!(settings.worker.bounds, RequestBounds::DEFAULT);
    assert_eq!(settings.paper, PaperConfig::default(), "no paper faults");
}

#[test]
fn the_paper_broker_behaviour_is_read() {
    let key = AesGcmCipher::generate_key();
    let lookup = move |name: &str| match name {
        "CREDENTIALS_KEY" => Some(key.clone()),
        "PAPER_LATE_BOOKING_MS" => Some("1500".to_owned()),
        "PAPER_HANG_RATE" => Some("0.5".to_owned()),
        _ => None,
    };
    let settings = worker_settings(&lookup).unwrap();
    assert_eq!(settings.paper.late_booking, Duration::from_millis(1500));
    assert_eq!(settings.paper.hang_rate, 0.5);
    let bad = |name: &str| (name == "PAPER_LATE_BOOKING_MS").then(|| "later".to_owned());
    let err = worker_settings(&bad).unwrap_err();
    assert!(
        err.problems
            .iter()
            .any(|p| p.starts_with("PAPER_LATE_BOOKING_MS")),
        "{err}"
    );
}

#[test]
fn timeouts_and_the_queue_cap_are_read_and_user_ids_checked() {
    let key = AesGcmCipher::generate_key();
    let lookup = move |name: &str| match name {
        "CREDENTIALS_KEY" => Some(key.clone()),
        "BROKER_ORDER_TIMEOUT_MS" => Some("2500".to_owned()),
        "BROKER_PING_TIMEOUT_MS" => Some("750".to_owned()),
        "USER_QUEUE_MAX" => Some("5".to_owned()),
        "USER_ID" => Some("alice@example.com".to_owned()),
        _ => None,
    };
    let settings = worker_settings(&lookup).unwrap();
    assert_eq!(
        settings.worker.connect.timeouts.order,
        Duration::from_millis(2500)
    );
    assert_eq!(
        settings.worker.connect.timeouts.ping,
        Duration::from_millis(750)
    );
    assert_eq!(settings.worker.queue_max, 5);
    assert_eq!(
        settings.worker.user_id.as_deref(),
        Some("alice@example.com")
    );

    let key = AesGcmCipher::generate_key();
    let bad = move |name: &str| match name {
        "CREDENTIALS_KEY" => Some(key.clone()),
        // Would be a pool worker's mark: worker:active:-1:w7.
        "USER_ID" => Some("-1:w7".to_owned()),
        "BROKER_ORDER_TIMEOUT_MS" => Some("0".to_owned()),
        "USER_QUEUE_MAX" => Some("0".to_owned()),
        _ => None,
    };
    let err = worker_settings(&bad).unwrap_err();
    assert_eq!(err.problems.len(), 3, "{err}");
    assert!(
        err.problems.iter().any(|p| p.starts_with("USER_ID")),
        "{err}"
    );
}

fn keyring_from(pairs: &[(&str, &str)]) -> Result<Keyring, ConfigError> {
    let lookup = leasehold_platform::settings::fixed_lookup(pairs);
    let mut env = Env::new(&lookup);
    let keyring = keyring(&mut env);
    env.finish(keyring)
}

#[test]
fn a_kms_key_id_or_a_local_key_is_required() {
    let err = keyring_from(&[]).unwrap_err();
    assert!(
        err.problems[0].starts_with("CREDENTIALS_KMS_KEY_ID"),
        "{err}"
    );
    let keyring = keyring_from(&[("CREDENTIALS_KMS_KEY_ID", "alias/leasehold")]).unwrap();
    assert!(keyring.local.is_none());
    assert_eq!(keyring.kms.unwrap().key_id(), Some("alias/leasehold"));
}

#[test]
fn a_local_key_is_refused_on_ecs_unless_allowed() {
    let key = AesGcmCipher::generate_key();
    let ecs = ("ECS_CONTAINER_METADATA_URI_V4", "http://169.254.170.2/v4/x");
    assert!(
        keyring_from(&[("CREDENTIALS_KEY", &key)])
            .unwrap()
            .local
            .is_some()
    );
    let err = keyring_from(&[("CREDENTIALS_KEY", &key), ecs]).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert!(err.problems[0].contains("refused in production"), "{err}");
    assert!(!err.to_string().contains(&key));
    let allowed = keyring_from(&[
        ("CREDENTIALS_KEY", &key),
        ecs,
        ("CREDENTIALS_ALLOW_LOCAL_KEY", "true"),
    ]);
    assert!(allowed.unwrap().local.is_some());
    // KMS on ECS is what production looks like.
    assert!(keyring_from(&[("CREDENTIALS_KMS_KEY_ID", "k"), ecs]).is_ok());
}

#[test]
fn on_ecs_a_broker_worker_needs_the_sealer_and_then_holds_no_cipher() {
    let ecs = |extra: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            [("ECS_CONTAINER_METADATA_URI_V4", "http://169.254.170.2/v4/x")]
                .iter()
                .chain(extra)
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    // KMS alone: the worker would need kms:Decrypt, which its role lacks.
    let err = worker_settings(&ecs(&[("CREDENTIALS_KMS_KEY_ID", "alias/k")])).unwrap_err();
    assert!(
        err.problems
            .iter()
            .any(|p| p.contains("CREDENTIALS_SEALER_URL") && p.contains("required on ECS")),
        "{err}"
    );
    // Plain HTTP to the sealer is refused on ECS, and HTTPS needs the CA.
    let err =
        worker_settings(&ecs(&[("CREDENTIALS_SEALER_URL", "http://sealer:9480")])).unwrap_err();
    assert!(err.to_string().contains("must be https:// on ECS"), "{err}");
    let err =
        worker_settings(&ecs(&[("CREDENTIALS_SEALER_URL", "https://sealer:9480")])).unwrap_err();
    assert!(err.to_string().contains("CREDENTIALS_SEALER_CA"), "{err}");
    let err = worker_settings(&ecs(&[
        ("CREDENTIALS_SEALER_URL", "https://sealer:9480"),
        ("CREDENTIALS_SEALER_CA", "not a certificate"),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("CREDENTIALS_SEALER_CA"), "{err}");
    let settings = worker_settings(&ecs(&[
        ("CREDENTIALS_SEALER_URL", "https://sealer:9480"),
        ("CREDENTIALS_SEALER_CA", leasehold_testkit::sealer_tls::CA),
        ("SEALER_CALLER_AUTH", "aws-iam"),
    ]))
    .unwrap();
    let proof = settings.caller_proof.as_ref().expect("signs caller proofs");
    assert_eq!(proof.sts_endpoint, None, "the region's endpoint");
    assert_eq!(proof.audience, "leasehold-credential-sealer");
    assert_eq!(settings.sealer_url.as_deref(), Some("https://sealer:9480"));
    assert!(settings.cipher.local.is_none() && settings.cipher.kms.is_none());
    let err = worker_settings(&ecs(&[("CREDENTIALS_SEALER_URL", "sealer:9480")])).unwrap_err();
    assert!(err.to_string().contains("http://"), "{err}");
}

#[test]
fn the_local_key_can_come_from_a_file() {
    let key = AesGcmCipher::generate_key();
    let dir = std::env::temp_dir().join(format!("leasehold-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("key");
    std::fs::write(&file, format!("{key}\n")).unwrap();
    let path = file.to_str().unwrap();
    let keyring = keyring_from(&[("CREDENTIALS_KEY_FILE", path)]).unwrap();
    let blob = AesGcmCipher::from_base64_key(&key)
        .unwrap()
        .encrypt("u1", b"{}")
        .unwrap();
    assert!(keyring.local.unwrap().decrypt("u1", &blob).is_ok());
    let err =
        keyring_from(&[("CREDENTIALS_KEY_FILE", path), ("CREDENTIALS_KEY", &key)]).unwrap_err();
    assert!(err.problems[0].contains("not both"), "{err}");
    std::fs::write(&file, "CANARY-file-not-a-key").unwrap();
    let err = keyring_from(&[("CREDENTIALS_KEY_FILE", path)]).unwrap_err();
    assert!(!err.to_string().contains("CANARY"), "{err}");
    let missing = dir.join("missing");
    let err = keyring_from(&[("CREDENTIALS_KEY_FILE", missing.to_str().unwrap())]).unwrap_err();
    assert!(err.problems[0].contains("cannot read"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ecs_launcher_needs_a_task_definition() {
    let lookup = |name: &str| (name == "TASK_LAUNCHER").then(|| "ecs".to_owned());
    let mut env = Env::new(&lookup);
    launcher_settings(&mut env);
    let err = env.finish(()).unwrap_err();
    assert!(err.problems[0].starts_with("ECS_TASK_DEFINITION"), "{err}");
}

#[test]
fn on_ecs_the_sealer_serves_https_with_a_matching_key() {
    use leasehold_testkit::sealer_tls::{CERT, KEY};
    let ecs = |extra: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            [
                ("ECS_CONTAINER_METADATA_URI_V4", "http://169.254.170.2/v4/x"),
                ("CREDENTIALS_KMS_KEY_ID", "alias/k"),
                ("SEALER_CALLER_AUTH", "aws-iam"),
                ("AWS_REGION", "eu-west-1"),
                (
                    "SEALER_CALLER_ROLES",
                    "arn:aws:iam::123456789012:role/leasehold-broker-worker",
                ),
            ]
            .iter()
            .chain(extra)
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
        }
    };
    let err = sealer_settings(&ecs(&[])).unwrap_err();
    assert!(err.to_string().contains("required on ECS"), "{err}");
    let err = sealer_settings(&ecs(&[("SEALER_TLS_CERT", CERT)])).unwrap_err();
    assert!(
        err.to_string().contains("SEALER_TLS_KEY: is required"),
        "{err}"
    );
    let settings =
        sealer_settings(&ecs(&[("SEALER_TLS_CERT", CERT), ("SEALER_TLS_KEY", KEY)])).unwrap();
    assert!(settings.tls.is_some());
    // The key's text never shows in an error or in the settings' Debug.
    let secret_line = KEY.lines().nth(1).unwrap();
    let err =
        sealer_settings(&ecs(&[("SEALER_TLS_CERT", KEY), ("SEALER_TLS_KEY", KEY)])).unwrap_err();
    assert!(!err.to_string().contains(secret_line), "{err}");
    assert!(!format!("{settings:?}").contains(secret_line));
}

#[test]
fn on_ecs_callers_must_prove_their_role_and_the_sealer_must_know_which() {
    let with = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    const ECS: (&str, &str) = ("ECS_CONTAINER_METADATA_URI_V4", "http://169.254.170.2/v4/x");
    // `none` (the default) is refused on ECS, for the worker and the sealer.
    let err = worker_settings(&with(&[
        ECS,
        ("CREDENTIALS_SEALER_URL", "https://sealer:9480"),
        ("CREDENTIALS_SEALER_CA", leasehold_testkit::sealer_tls::CA),
    ]))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("SEALER_CALLER_AUTH: must be aws-iam on ECS"),
        "{err}"
    );
    let err = sealer_settings(&with(&[ECS, ("CREDENTIALS_KMS_KEY_ID", "k")])).unwrap_err();
    assert!(err.to_string().contains("SEALER_CALLER_AUTH"), "{err}");
    // aws-iam needs the roles, as ARNs with their account, and an endpoint.
    let err = sealer_settings(&with(&[
        (
            "CREDENTIALS_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ),
        ("SEALER_CALLER_AUTH", "aws-iam"),
    ]))
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("SEALER_CALLER_ROLES: is required"), "{text}");
    assert!(text.contains("SEALER_STS_ENDPOINT: is required"), "{text}");
    let err = sealer_settings(&with(&[
        (
            "CREDENTIALS_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ),
        ("SEALER_CALLER_AUTH", "aws-iam"),
        ("AWS_REGION", "eu-west-1"),
        ("SEALER_CALLER_ROLES", "leasehold-broker-worker"),
    ]))
    .unwrap_err();
    assert!(err.to_string().contains("is not a role ARN"), "{err}");
    let settings = sealer_settings(&with(&[
        (
            "CREDENTIALS_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ),
        ("SEALER_CALLER_AUTH", "aws-iam"),
        ("AWS_REGION", "eu-west-1"),
        (
            "SEALER_CALLER_ROLES",
            "arn:aws:iam::123456789012:role/leasehold-broker-worker",
        ),
    ]))
    .unwrap();
    let policy = settings.callers.expect("callers are checked");
    assert_eq!(policy.sts_endpoint, "https://sts.eu-west-1.amazonaws.com/");
    assert_eq!(policy.roles.len(), 1);
    let err = sealer_settings(&with(&[
        (
            "CREDENTIALS_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ),
        ("SEALER_CALLER_AUTH", "sometimes"),
    ]))
    .unwrap_err();
    assert!(
        err.to_string().contains("must be `none` or `aws-iam`"),
        "{err}"
    );
}
