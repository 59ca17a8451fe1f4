//! The sealer's caller authentication (`SEALER_CALLER_AUTH=aws-iam`) against
//! the STS of the test command's moto server: a worker signs
//! `sts:GetCallerIdentity` with its role session's credentials, the sealer
//! has STS say who signed. Only a session of the broker role, named after
//! the task the request names, is answered; every other caller is refused
//! before the sealer decrypts anything or touches the bus.
//!
//! moto does not check SigV4 signatures unless its IAM enforcement is on, so
//! a forged signature is not refused here as real STS refuses it; what the
//! sealer itself checks (endpoint, audience, date, role, account, task) is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use http_body_util::{BodyExt, Full};
use leasehold_broker::credentials::{self, AesGcmCipher, CipherError, CredentialsCipher};
use leasehold_broker::sealer::caller::{
    AllowedRole, CallerPolicy, CallerProver, CallerVerifier, DEFAULT_AUDIENCE,
};
use leasehold_broker::sealer::{self, CredentialSealer, SealerClient};
use leasehold_pool::bus::PoolBus;
use leasehold_pool::bus::memory::MemoryPoolBus;
use leasehold_pool::keys;
use leasehold_pool::protocol::GrantReason;
use leasehold_pool::state::PoolState;
use leasehold_testkit::dynamodb_endpoint;
use tokio_util::sync::CancellationToken;

const ACCOUNT: &str = "123456789012";
const BROKER_ROLE: &str = "leasehold-broker-worker";
const TASK: &str = "local-777";
const SECRET: &str = "CANARY-alice-authenticated";

/// Counts decrypts: an unauthenticated caller must cause none (in
/// production each is a KMS call).
struct CountingCipher {
    inner: AesGcmCipher,
    decrypts: AtomicUsize,
}

#[async_trait::async_trait]
impl CredentialsCipher for CountingCipher {
    async fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        CredentialsCipher::encrypt(&self.inner, user_id, plaintext).await
    }
    async fn decrypt(
        &self,
        user_id: &str,
        blob: &str,
    ) -> Result<credentials::Credentials, CipherError> {
        self.decrypts.fetch_add(1, Ordering::SeqCst);
        CredentialsCipher::decrypt(&self.inner, user_id, blob).await
    }
}

/// `sts:AssumeRole` on moto: a session of `role` named `session`. Signed
/// with placeholder keys only so moto routes it to STS.
async fn assume_role(sts: &str, role: &str, session: &str) -> Credentials {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let body = format!(
        "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A{ACCOUNT}%3Arole%2F{role}&RoleSessionName={session}"
    );
    let identity = Credentials::new("AKIDLOCAL", "local", None, None, "test").into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("sts")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    let content_type = "application/x-www-form-urlencoded; charset=utf-8";
    let signable = SignableRequest::new(
        "POST",
        sts,
        [("content-type", content_type)].into_iter(),
        SignableBody::Bytes(body.as_bytes()),
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut request = hyper::Request::post(sts).header("content-type", content_type);
    for (name, value) in instructions.headers() {
        request = request.header(name, value);
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<hyper::body::Bytes>>();
    let response = client
        .request(request.body(Full::new(body.into())).unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let field = |name: &str| {
        let open = format!("<{name}>");
        let start = text
            .find(&open)
            .unwrap_or_else(|| panic!("{name} in {text}"))
            + open.len();
        text[start..start + text[start..].find('<').unwrap()].to_owned()
    };
    Credentials::new(
        field("AccessKeyId"),
        field("SecretAccessKey"),
        Some(field("SessionToken")),
        None,
        "moto-assume-role",
    )
}

fn refusal(err: CipherError) -> (u16, String) {
    match err {
        CipherError::SealerRefused { status, reason } => (status, reason),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_broker_role_session_of_the_named_task_is_answered() {
    let Some(moto) = dynamodb_endpoint() else {
        return;
    };
    let sts = format!("{}/", moto.trim_end_matches('/'));
    let bus: Arc<dyn PoolBus> = Arc::new(MemoryPoolBus::new());
    let key = AesGcmCipher::generate_key();
    let cipher = Arc::new(CountingCipher {
        inner: AesGcmCipher::from_base64_key(&key).unwrap(),
        decrypts: AtomicUsize::new(0),
    });
    let blob = cipher
        .encrypt("alice", format!(r#"{{"api_key": "{SECRET}"}}"#).as_bytes())
        .await
        .unwrap();
    bus.put_credentials("alice", &blob).await.unwrap();
    // A cold start of task local-777 for alice, as supervision grants it.
    let grant = sealer::new_grant(GrantReason::ColdStart).for_task(TASK);
    sealer::grant_credentials(bus.as_ref(), "alice", &grant)
        .await
        .unwrap();

    let policy = CallerPolicy {
        sts_endpoint: sts.clone(),
        audience: DEFAULT_AUDIENCE.into(),
        roles: vec![
            AllowedRole::parse(&format!("arn:aws:iam::{ACCOUNT}:role/{BROKER_ROLE}")).unwrap(),
        ],
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let sealer = CredentialSealer::new(bus.clone(), cipher.clone())
        .with_callers(CallerVerifier::new(policy));
    tokio::spawn(sealer::serve(
        listener,
        Arc::new(sealer),
        sealer::CLAIM_USER_SWEEP,
        None,
        None,
        stop.clone(),
    ));
    let ask = sealer::SealAsk {
        user_id: "alice",
        worker_id: TASK,
        task_id: TASK,
        binding: TASK,
        mark_ttl: Duration::from_secs(5),
    };
    let client = |credentials: Credentials, endpoint: &str| {
        SealerClient::new(&url, Duration::from_secs(10)).proving(CallerProver::with_credentials(
            SharedCredentialsProvider::new(credentials),
            "us-east-1",
            endpoint,
            DEFAULT_AUDIENCE,
        ))
    };
    let untouched = |what: &str| {
        let (bus, cipher) = (bus.clone(), cipher.clone());
        let what = what.to_owned();
        async move {
            assert_eq!(
                cipher.decrypts.load(Ordering::SeqCst),
                0,
                "{what}: a decrypt"
            );
            let grant = bus
                .credentials_grant("alice")
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(grant.used_by.is_none(), "{what}: the grant was used");
            assert!(
                bus.get(&keys::worker_active("alice"))
                    .await
                    .unwrap()
                    .is_none(),
                "{what}: a mark was set"
            );
        }
    };

    // No proof at all.
    let anonymous = SealerClient::new(&url, Duration::from_secs(10));
    let (status, reason) = refusal(anonymous.fetch(&ask).await.unwrap_err());
    assert_eq!(status, 401, "{reason}");
    assert!(reason.contains("no caller proof"), "{reason}");
    untouched("no proof").await;

    // A proof for another "STS" (one the caller runs, which would vouch for
    // anyone): the sealer never sends it there.
    let fake_sts = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_url = format!("http://{}/", fake_sts.local_addr().unwrap());
    let fake_hits = Arc::new(AtomicUsize::new(0));
    let hits = fake_hits.clone();
    tokio::spawn(async move {
        while let Ok((_socket, _)) = fake_sts.accept().await {
            hits.fetch_add(1, Ordering::SeqCst);
        }
    });
    let broker_session = assume_role(&sts, BROKER_ROLE, TASK).await;
    let (status, reason) = refusal(
        client(broker_session.clone(), &fake_url)
            .fetch(&ask)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 401, "{reason}");
    assert!(reason.contains("another endpoint"), "{reason}");
    assert_eq!(
        fake_hits.load(Ordering::SeqCst),
        0,
        "the sealer called the caller's STS"
    );
    untouched("foreign STS").await;

    // A session of another role (the stream workers', say) named after the task.
    let stream_session = assume_role(&sts, "leasehold-stream-worker", TASK).await;
    let (status, reason) = refusal(client(stream_session, &sts).fetch(&ask).await.unwrap_err());
    assert_eq!(status, 401, "{reason}");
    assert!(reason.contains("may not ask the sealer"), "{reason}");
    untouched("other role").await;

    // The broker role, but another task's session asking as local-777.
    let other_task = assume_role(&sts, BROKER_ROLE, "local-999").await;
    let (status, reason) = refusal(client(other_task, &sts).fetch(&ask).await.unwrap_err());
    assert_eq!(status, 401, "{reason}");
    assert!(reason.contains("proved task local-999"), "{reason}");
    untouched("other task").await;

    // STS unreachable: try again later, nothing done.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/", listener.local_addr().unwrap())
    };
    let unreachable_sealer = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let policy = CallerPolicy {
            sts_endpoint: closed.clone(),
            audience: DEFAULT_AUDIENCE.into(),
            roles: vec![
                AllowedRole::parse(&format!("arn:aws:iam::{ACCOUNT}:role/{BROKER_ROLE}")).unwrap(),
            ],
        };
        let sealer = CredentialSealer::new(bus.clone(), cipher.clone())
            .with_callers(CallerVerifier::new(policy));
        tokio::spawn(sealer::serve(
            listener,
            Arc::new(sealer),
            sealer::CLAIM_USER_SWEEP,
            None,
            None,
            stop.clone(),
        ));
        url
    };
    let err = SealerClient::new(&unreachable_sealer, Duration::from_secs(10))
        .proving(CallerProver::with_credentials(
            SharedCredentialsProvider::new(broker_session.clone()),
            "us-east-1",
            &closed,
            DEFAULT_AUDIENCE,
        ))
        .fetch(&ask)
        .await
        .unwrap_err();
    assert!(matches!(err, CipherError::SealerUnavailable(_)), "{err:?}");
    untouched("STS down").await;

    // The launched task's own session: answered, and the box opens.
    let unsealed = client(broker_session, &sts).fetch(&ask).await.unwrap();
    assert_eq!(
        unsealed.credentials.get("api_key").unwrap().expose(),
        SECRET
    );
    assert_eq!(cipher.decrypts.load(Ordering::SeqCst), 1);
    stop.cancel();
}
