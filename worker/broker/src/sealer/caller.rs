//! Who is asking the sealer: a broker worker proves its AWS identity with a
//! signed `sts:GetCallerIdentity` request that the sealer sends to STS itself
//! (the pattern of Vault's AWS auth method and aws-iam-authenticator).
//!
//! The worker signs the request with its task role's credentials but does not
//! send it; it hands the signed request to the sealer in the
//! [`PROOF_HEADER`]. The sealer checks what it can without any I/O (the URL
//! is its own STS endpoint, the body is `GetCallerIdentity`, the audience
//! header names this sealer and is signed, the date is recent), sends the
//! request to STS, and reads the answer's ARN: STS, not the worker, says who
//! signed. On ECS a task role's session is named after the task, so the ARN
//! `arn:aws:sts::{account}:assumed-role/{role}/{task id}` names the role and
//! the task: the sealer admits only the configured broker roles, and only for
//! the worker and task the session names.
//!
//! An unauthenticated request is refused before the sealer reads Redis or
//! calls KMS. A verified proof is remembered until it is
//! [`PROOF_MAX_AGE`] old, and a worker makes a new one every
//! [`PROOF_REUSE`], so a warm claim costs no STS call.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use base64::Engine as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

/// The request header a worker's proof travels in.
pub const PROOF_HEADER: &str = "x-leasehold-caller-proof";

/// The signed header that names the sealer a proof is for, so a proof made
/// for this sealer cannot log in to another service that executes
/// `GetCallerIdentity` proofs, and the other way round.
pub const AUDIENCE_HEADER: &str = "x-leasehold-sealer-audience";

/// `SEALER_AUDIENCE` when unset.
pub const DEFAULT_AUDIENCE: &str = "leasehold-credential-sealer";

/// How old a proof may be when the sealer first sees it, and how long a
/// verified one is remembered (AWS accepts a signed request for 15 minutes).
pub const PROOF_MAX_AGE: Duration = Duration::from_secs(300);

/// How long a worker reuses one proof before it signs a new one.
pub const PROOF_REUSE: Duration = Duration::from_secs(60);

/// The only request a proof may carry.
const STS_BODY: &str = "Action=GetCallerIdentity&Version=2011-06-15";
const STS_CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// The headers a proof may carry; the sealer sends no other.
const PROOF_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "x-amz-date",
    "x-amz-security-token",
    AUDIENCE_HEADER,
];

/// How long the sealer waits for STS.
const STS_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest STS answer read (a `GetCallerIdentity` answer is ~500 bytes).
const MAX_STS_ANSWER: usize = 16 * 1024;
/// Verified proofs remembered at most (one per live worker and minute).
const MAX_REMEMBERED: usize = 50_000;

/// `SEALER_CALLER_AUTH`: how the sealer knows who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerAuth {
    /// Nobody is asked to prove anything (`leasehold dev`, tests; refused on
    /// ECS).
    None,
    /// A signed `sts:GetCallerIdentity` request ([`CallerProof`]).
    AwsIam,
}

impl CallerAuth {
    /// The setting's value as written.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "none" => Ok(CallerAuth::None),
            "aws-iam" => Ok(CallerAuth::AwsIam),
            _ => Err("must be `none` or `aws-iam`".into()),
        }
    }
}

/// The STS endpoint of `region` (what `SEALER_STS_ENDPOINT` defaults to).
pub fn regional_sts_endpoint(region: &str) -> String {
    format!("https://sts.{region}.amazonaws.com/")
}

/// Why a caller is not admitted (never quotes a signature or token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerError {
    /// The request carries no proof.
    #[error(
        "no caller proof (the {PROOF_HEADER} header): the sealer answers authenticated broker workers only"
    )]
    Missing,
    /// The proof does not decode, or is not a `GetCallerIdentity` request.
    #[error("the caller proof is malformed: {0}")]
    Malformed(String),
    /// The proof is signed for another endpoint than the sealer's STS.
    #[error("the caller proof is for another endpoint than this sealer's SEALER_STS_ENDPOINT")]
    WrongEndpoint,
    /// The audience header is missing, unsigned or names another sealer.
    #[error(
        "the caller proof is not signed for this sealer (the {AUDIENCE_HEADER} header must be signed and equal SEALER_AUDIENCE)"
    )]
    WrongAudience,
    /// Older than [`PROOF_MAX_AGE`] or dated in the future.
    #[error("the caller proof is dated {0}, outside the {PROOF_MAX_AGE:?} the sealer accepts")]
    Stale(String),
    /// STS refused the signed request: it is not a valid AWS signature.
    #[error("STS refused the caller proof ({0})")]
    Refused(String),
    /// STS could not be asked; try again.
    #[error("STS cannot verify the caller proof now: {0}")]
    StsUnavailable(String),
    /// The signer is not an assumed role (a user, a root account, a federated session).
    #[error("the caller {0} is not a role session: broker workers sign with their task role")]
    NotARole(String),
    /// The signer's role is not one of `SEALER_CALLER_ROLES`.
    #[error("the role {0} may not ask the sealer (SEALER_CALLER_ROLES)")]
    RoleNotAllowed(String),
    /// The proven task is not the worker or task the request names.
    #[error("the caller proved task {proven}, but asks as worker {worker_id} of task {task_id}")]
    NotTheTask {
        /// The role session's name (the ECS task id).
        proven: String,
        /// The worker id the request names.
        worker_id: String,
        /// The task the request names.
        task_id: String,
    },
    /// The worker cannot sign a proof (no AWS credentials or region).
    #[error("cannot sign a caller proof: {0}")]
    CannotSign(String),
}

impl CallerError {
    /// Worth asking again: STS or the worker's credentials may come back.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CallerError::StsUnavailable(_) | CallerError::CannotSign(_)
        )
    }
}

/// A signed `GetCallerIdentity` request, as a worker hands it over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerProof {
    /// The STS endpoint it is signed for.
    pub url: String,
    /// The signed request's headers, lower-case names ([`PROOF_HEADERS`]).
    pub headers: BTreeMap<String, String>,
}

impl CallerProof {
    /// The header value: URL-safe base64 of the JSON.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("a proof always serialises");
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    /// The proof in a header value.
    pub fn decode(text: &str) -> Result<Self, CallerError> {
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|_| CallerError::Malformed("not URL-safe base64".into()))?;
        serde_json::from_slice(&json)
            .map_err(|_| CallerError::Malformed("not a {url, headers} object".into()))
    }

    /// Signs a `GetCallerIdentity` request to `endpoint` for `audience` with
    /// `credentials` at `now`: what a worker sends.
    pub fn sign(
        credentials: &aws_credential_types::Credentials,
        region: &str,
        endpoint: &str,
        audience: &str,
        now: SystemTime,
    ) -> Result<Self, CallerError> {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        let identity = credentials.clone().into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("sts")
            .time(now)
            .settings(SigningSettings::default())
            .build()
            .map_err(|err| CallerError::CannotSign(err.to_string()))?
            .into();
        let unsigned = [
            ("content-type", STS_CONTENT_TYPE),
            (AUDIENCE_HEADER, audience),
        ];
        let request = SignableRequest::new(
            "POST",
            endpoint,
            unsigned.iter().copied(),
            SignableBody::Bytes(STS_BODY.as_bytes()),
        )
        .map_err(|err| CallerError::CannotSign(err.to_string()))?;
        let (instructions, _) = sign(request, &params)
            .map_err(|err| CallerError::CannotSign(err.to_string()))?
            .into_parts();
        let mut headers: BTreeMap<String, String> = unsigned
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        for (name, value) in instructions.headers() {
            headers.insert(name.to_ascii_lowercase(), value.to_owned());
        }
        Ok(CallerProof {
            url: endpoint.to_owned(),
            headers,
        })
    }

    /// What the sealer checks before it sends anything: the endpoint, the
    /// headers, the signed audience and the date.
    pub fn check(
        &self,
        endpoint: &str,
        audience: &str,
        now: SystemTime,
    ) -> Result<(), CallerError> {
        if self.url != endpoint {
            return Err(CallerError::WrongEndpoint);
        }
        if let Some(name) = self
            .headers
            .keys()
            .find(|name| !PROOF_HEADERS.contains(&name.as_str()))
        {
            return Err(CallerError::Malformed(format!(
                "header {name} is not allowed"
            )));
        }
        let authorization = self
            .headers
            .get("authorization")
            .ok_or_else(|| CallerError::Malformed("no authorization header".into()))?;
        let signed = authorization
            .split("SignedHeaders=")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .ok_or_else(|| CallerError::Malformed("not a SigV4 authorization".into()))?;
        let audience_signed = signed.split(';').any(|name| name == AUDIENCE_HEADER);
        if !audience_signed
            || self.headers.get(AUDIENCE_HEADER).map(String::as_str) != Some(audience)
        {
            return Err(CallerError::WrongAudience);
        }
        let date = self
            .headers
            .get("x-amz-date")
            .ok_or_else(|| CallerError::Malformed("no x-amz-date header".into()))?;
        let signed_at = parse_amz_date(date)
            .ok_or_else(|| CallerError::Malformed("x-amz-date is not YYYYMMDDTHHMMSSZ".into()))?;
        let age = match now.duration_since(signed_at) {
            Ok(age) => age,
            // A clock a little ahead of the sealer's is fine; a proof from
            // the future is not.
            Err(ahead) if ahead.duration() <= Duration::from_secs(60) => Duration::ZERO,
            Err(_) => return Err(CallerError::Stale(date.clone())),
        };
        if age > PROOF_MAX_AGE {
            return Err(CallerError::Stale(date.clone()));
        }
        Ok(())
    }

    fn signed_at(&self) -> Option<SystemTime> {
        self.headers
            .get("x-amz-date")
            .and_then(|d| parse_amz_date(d))
    }
}

/// `YYYYMMDDTHHMMSSZ` as SigV4 writes it (the basic form of RFC 3339).
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' || !text.is_ascii() {
        return None;
    }
    let extended = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &text[0..4],
        &text[4..6],
        &text[6..8],
        &text[9..11],
        &text[11..13],
        &text[13..15]
    );
    humantime::parse_rfc3339(&extended).ok()
}

/// Who STS says signed a proof.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerIdentity {
    /// `aws`, `aws-cn`, `aws-us-gov`.
    pub partition: String,
    /// The AWS account.
    pub account: String,
    /// The role's name (without its path).
    pub role: String,
    /// The role session's name: the task id on ECS.
    pub session: String,
}

impl CallerIdentity {
    /// From the `Arn` of a `GetCallerIdentity` answer; only role sessions
    /// (`arn:{partition}:sts::{account}:assumed-role/{role}/{session}`).
    pub fn from_arn(arn: &str) -> Result<Self, CallerError> {
        let not_a_role = || CallerError::NotARole(arn.to_owned());
        let mut parts = arn.splitn(6, ':');
        let (Some("arn"), Some(partition), Some("sts"), Some(""), Some(account), Some(resource)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(not_a_role());
        };
        let mut resource = resource.splitn(3, '/');
        let (Some("assumed-role"), Some(role), Some(session)) =
            (resource.next(), resource.next(), resource.next())
        else {
            return Err(not_a_role());
        };
        if role.is_empty() || session.is_empty() || account.is_empty() {
            return Err(not_a_role());
        }
        Ok(CallerIdentity {
            partition: partition.to_owned(),
            account: account.to_owned(),
            role: role.to_owned(),
            session: session.to_owned(),
        })
    }

    /// The request names this identity's task: its worker id is the session
    /// (the task id), and its task is the session or an ECS task ARN ending
    /// in it. This is what binds a cold-start grant, which names the task, to
    /// the task that was launched.
    pub fn check_asks_as(&self, worker_id: &str, task_id: &str) -> Result<(), CallerError> {
        let task_named = task_id.rsplit('/').next() == Some(self.session.as_str());
        if worker_id == self.session && task_named {
            return Ok(());
        }
        Err(CallerError::NotTheTask {
            proven: self.session.clone(),
            worker_id: worker_id.to_owned(),
            task_id: task_id.to_owned(),
        })
    }
}

/// One of `SEALER_CALLER_ROLES`: a role ARN
/// (`arn:{partition}:iam::{account}:role/{path/}{name}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRole {
    partition: String,
    account: String,
    name: String,
}

impl AllowedRole {
    /// Parses a role ARN.
    pub fn parse(arn: &str) -> Result<Self, String> {
        let bad = || format!("{arn} is not a role ARN (arn:aws:iam::<account>:role/<name>)");
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let ["arn", partition, "iam", "", account, resource] = parts.as_slice() else {
            return Err(bad());
        };
        let name = resource
            .strip_prefix("role/")
            .and_then(|path| path.rsplit('/').next())
            .filter(|name| !name.is_empty())
            .ok_or_else(bad)?;
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(AllowedRole {
            partition: (*partition).to_owned(),
            account: (*account).to_owned(),
            name: name.to_owned(),
        })
    }

    /// The identity is a session of this role. The account matters: anyone
    /// can make a role of the same name in an account of their own.
    pub fn admits(&self, identity: &CallerIdentity) -> bool {
        self.partition == identity.partition
            && self.account == identity.account
            && self.name == identity.role
    }
}

/// What the sealer admits: proofs for its STS endpoint and audience, from
/// the broker roles.
#[derive(Debug, Clone)]
pub struct CallerPolicy {
    /// `SEALER_STS_ENDPOINT`: the only URL a proof may name.
    pub sts_endpoint: String,
    /// `SEALER_AUDIENCE`.
    pub audience: String,
    /// `SEALER_CALLER_ROLES`.
    pub roles: Vec<AllowedRole>,
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<hyper::body::Bytes>>;

fn client() -> HttpsClient {
    let tls = super::tls::public_client_config()
        .expect("the public roots and the default provider always make a configuration");
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        // http:// only for a local STS (tests); the policy pins the URL.
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The sealer's side: verifies proofs with STS and remembers verified ones.
pub struct CallerVerifier {
    policy: CallerPolicy,
    client: HttpsClient,
    verified: Mutex<HashMap<String, (CallerIdentity, SystemTime)>>,
}

impl std::fmt::Debug for CallerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerVerifier")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl CallerVerifier {
    /// A verifier admitting what `policy` says.
    pub fn new(policy: CallerPolicy) -> Self {
        CallerVerifier {
            policy,
            client: client(),
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The identity behind `proof` (the [`PROOF_HEADER`] value), admitted to
    /// ask as `worker_id` of `task_id`, or why not. Only a proof that passes
    /// [`CallerProof::check`] is sent to STS.
    pub async fn verify(
        &self,
        proof: Option<&str>,
        worker_id: &str,
        task_id: &str,
    ) -> Result<CallerIdentity, CallerError> {
        let proof = CallerProof::decode(proof.ok_or(CallerError::Missing)?)?;
        let now = SystemTime::now();
        proof.check(&self.policy.sts_endpoint, &self.policy.audience, now)?;
        // The authorization header holds the signature: one entry per proof.
        let key = proof.headers["authorization"].clone();
        let remembered = self
            .verified
            .lock()
            .expect("the verified-proof map is never poisoned")
            .get(&key)
            .filter(|(_, until)| *until > now)
            .map(|(identity, _)| identity.clone());
        let identity = match remembered {
            Some(identity) => identity,
            None => {
                let identity = self.ask_sts(&proof).await?;
                let until = proof.signed_at().unwrap_or(now) + PROOF_MAX_AGE;
                let mut verified = self
                    .verified
                    .lock()
                    .expect("the verified-proof map is never poisoned");
                verified.retain(|_, (_, until)| *until > now);
                if verified.len() < MAX_REMEMBERED {
                    verified.insert(key, (identity.clone(), until));
                }
                identity
            }
        };
        if !self.policy.roles.iter().any(|role| role.admits(&identity)) {
            return Err(CallerError::RoleNotAllowed(format!(
                "arn:{}:iam::{}:role/{}",
                identity.partition, identity.account, identity.role
            )));
        }
        identity.check_asks_as(worker_id, task_id)?;
        Ok(identity)
    }

    async fn ask_sts(&self, proof: &CallerProof) -> Result<CallerIdentity, CallerError> {
        let mut request = hyper::Request::post(proof.url.as_str());
        for (name, value) in &proof.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request
            .body(Full::new(hyper::body::Bytes::from_static(
                STS_BODY.as_bytes(),
            )))
            .map_err(|_| CallerError::Malformed("a header is not valid HTTP".into()))?;
        let unavailable = CallerError::StsUnavailable;
        let response = tokio::time::timeout(STS_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| unavailable(format!("no answer within {STS_TIMEOUT:?}")))?
            .map_err(|err| unavailable(format!("request failed: {err}")))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_STS_ANSWER)
            .collect()
            .await
            .map_err(|err| unavailable(format!("reading the answer failed: {err}")))?
            .to_bytes();
        let body = String::from_utf8_lossy(&body);
        if status.is_server_error() || status == hyper::StatusCode::TOO_MANY_REQUESTS {
            return Err(unavailable(format!("STS answered {status}")));
        }
        if !status.is_success() {
            let code = element(&body, "Code").unwrap_or("no error code");
            return Err(CallerError::Refused(format!("{status}, {code}")));
        }
        let arn =
            element(&body, "Arn").ok_or_else(|| unavailable("the answer has no Arn".into()))?;
        CallerIdentity::from_arn(arn)
    }
}

/// The text of the first `<name>` element. STS's Query-protocol answers are
/// small and fixed in shape, and an ARN or error code holds no markup, so no
/// XML parser is needed to read these two values.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    Some(xml[start..end].trim())
}

/// A worker's side: signs proofs with the AWS SDK's credentials (the task
/// role on ECS) and reuses each for [`PROOF_REUSE`].
pub struct CallerProver {
    sts_endpoint: Option<String>,
    audience: String,
    source: tokio::sync::OnceCell<(Option<SharedCredentialsProvider>, Option<String>)>,
    fixed: Option<(SharedCredentialsProvider, String)>,
    current: Mutex<Option<(String, SystemTime)>>,
}

impl std::fmt::Debug for CallerProver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerProver")
            .field("sts_endpoint", &self.sts_endpoint)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl CallerProver {
    /// Signs with the SDK's default chain, loaded on first use; the endpoint
    /// is `SEALER_STS_ENDPOINT` or the region's.
    pub fn from_environment(sts_endpoint: Option<String>, audience: String) -> Self {
        CallerProver {
            sts_endpoint,
            audience,
            source: tokio::sync::OnceCell::new(),
            fixed: None,
            current: Mutex::new(None),
        }
    }

    /// Signs with these credentials in `region` (tests, tools).
    pub fn with_credentials(
        credentials: SharedCredentialsProvider,
        region: &str,
        sts_endpoint: &str,
        audience: &str,
    ) -> Self {
        CallerProver {
            sts_endpoint: Some(sts_endpoint.to_owned()),
            audience: audience.to_owned(),
            source: tokio::sync::OnceCell::new(),
            fixed: Some((credentials, region.to_owned())),
            current: Mutex::new(None),
        }
    }

    /// The proof to send now (the [`PROOF_HEADER`] value).
    pub async fn proof(&self) -> Result<String, CallerError> {
        let now = SystemTime::now();
        if let Some((proof, made)) = self
            .current
            .lock()
            .expect("the current proof is never poisoned")
            .as_ref()
            && now.duration_since(*made).unwrap_or_default() < PROOF_REUSE
        {
            return Ok(proof.clone());
        }
        let (provider, region) = match &self.fixed {
            Some((provider, region)) => (provider.clone(), region.clone()),
            None => {
                let (provider, region) = self
                    .source
                    .get_or_init(|| async {
                        let config = leasehold_platform::aws::sdk_config(
                            leasehold_platform::aws::RetryPolicy::Standard,
                        )
                        .await;
                        (
                            config.credentials_provider(),
                            config.region().map(|r| r.to_string()),
                        )
                    })
                    .await;
                let provider = provider.clone().ok_or_else(|| {
                    CallerError::CannotSign("no AWS credentials (the task role on ECS)".into())
                })?;
                let region = region
                    .clone()
                    .ok_or_else(|| CallerError::CannotSign("AWS_REGION is not set".into()))?;
                (provider, region)
            }
        };
        let credentials = provider
            .provide_credentials()
            .await
            .map_err(|err| CallerError::CannotSign(format!("no AWS credentials: {err}")))?;
        let endpoint = self
            .sts_endpoint
            .clone()
            .unwrap_or_else(|| regional_sts_endpoint(&region));
        let proof =
            CallerProof::sign(&credentials, &region, &endpoint, &self.audience, now)?.encode();
        *self
            .current
            .lock()
            .expect("the current proof is never poisoned") = Some((proof.clone(), now));
        Ok(proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENDPOINT: &str = "https://sts.eu-west-1.amazonaws.com/";

    fn credentials() -> aws_credential_types::Credentials {
        aws_credential_types::Credentials::new(
            "ASIAEXAMPLE",
            "secret",
            Some("token".into()),
            None,
            "test",
        )
    }

    fn signed(at: SystemTime) -> CallerProof {
        CallerProof::sign(&credentials(), "eu-west-1", ENDPOINT, DEFAULT_AUDIENCE, at).unwrap()
    }

    #[test]
    fn a_fresh_proof_for_this_sealer_passes_the_checks() {
        let now = SystemTime::now();
        let proof = signed(now);
        assert_eq!(CallerProof::decode(&proof.encode()).unwrap(), proof);
        proof.check(ENDPOINT, DEFAULT_AUDIENCE, now).unwrap();
        assert!(proof.headers.contains_key("x-amz-security-token"));
        let secret_shown = format!("{proof:?}").contains("secret");
        assert!(!secret_shown, "a proof never carries the secret key");
    }

    #[test]
    fn proofs_for_another_endpoint_audience_or_time_are_refused_before_sending() {
        let now = SystemTime::now();
        let proof = signed(now);
        assert_eq!(
            proof.check("https://sts.attacker.example/", DEFAULT_AUDIENCE, now),
            Err(CallerError::WrongEndpoint)
        );
        assert_eq!(
            proof.check(ENDPOINT, "another-sealer", now),
            Err(CallerError::WrongAudience)
        );
        let old = signed(now - PROOF_MAX_AGE - Duration::from_secs(1));
        assert!(matches!(
            old.check(ENDPOINT, DEFAULT_AUDIENCE, now),
            Err(CallerError::Stale(_))
        ));
        let future = signed(now + Duration::from_secs(600));
        assert!(matches!(
            future.check(ENDPOINT, DEFAULT_AUDIENCE, now),
            Err(CallerError::Stale(_))
        ));
        // The audience header present but not signed: copied onto a proof
        // made for something else.
        let mut unsigned = signed(now);
        let authorization = unsigned.headers["authorization"].replace(AUDIENCE_HEADER, "x-other");
        unsigned
            .headers
            .insert("authorization".into(), authorization);
        assert_eq!(
            unsigned.check(ENDPOINT, DEFAULT_AUDIENCE, now),
            Err(CallerError::WrongAudience)
        );
        let mut extra = signed(now);
        extra
            .headers
            .insert("x-forwarded-for".into(), "1.2.3.4".into());
        assert!(matches!(
            extra.check(ENDPOINT, DEFAULT_AUDIENCE, now),
            Err(CallerError::Malformed(_))
        ));
    }

    #[test]
    fn sigv4_dates_parse_exactly() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_601_600);
        assert_eq!(parse_amz_date("20261207T000000Z"), Some(at));
        assert_eq!(
            parse_amz_date("19700101T000000Z"),
            Some(SystemTime::UNIX_EPOCH)
        );
        for bad in [
            "2026-12-07T00:00:00Z",
            "20261307T000000Z",
            "20261207T000000",
            "",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_role_sessions_of_the_allowed_roles_in_the_allowed_account_are_admitted() {
        let identity = CallerIdentity::from_arn(
            "arn:aws:sts::123456789012:assumed-role/leasehold-broker-worker/0a1b2c",
        )
        .unwrap();
        assert_eq!(identity.session, "0a1b2c");
        let allowed =
            AllowedRole::parse("arn:aws:iam::123456789012:role/service/leasehold-broker-worker")
                .unwrap();
        assert!(allowed.admits(&identity));
        let elsewhere = CallerIdentity::from_arn(
            "arn:aws:sts::999999999999:assumed-role/leasehold-broker-worker/0a1b2c",
        )
        .unwrap();
        assert!(
            !allowed.admits(&elsewhere),
            "same role name, another account"
        );
        let other_role = CallerIdentity::from_arn(
            "arn:aws:sts::123456789012:assumed-role/leasehold-stream-worker/0a1b2c",
        )
        .unwrap();
        assert!(!allowed.admits(&other_role));
        for arn in [
            "arn:aws:iam::123456789012:user/alice",
            "arn:aws:iam::123456789012:root",
            "arn:aws:sts::123456789012:federated-user/bob",
            "arn:aws:sts::123456789012:assumed-role/r/",
        ] {
            assert!(
                matches!(CallerIdentity::from_arn(arn), Err(CallerError::NotARole(_))),
                "{arn}"
            );
        }
        assert!(AllowedRole::parse("arn:aws:iam::123:role/x").is_err());
        assert!(AllowedRole::parse("leasehold-broker-worker").is_err());
    }

    #[test]
    fn a_caller_asks_only_as_its_own_task() {
        let identity =
            CallerIdentity::from_arn("arn:aws:sts::123456789012:assumed-role/broker/0a1b2c")
                .unwrap();
        identity
            .check_asks_as(
                "0a1b2c",
                "arn:aws:ecs:eu-west-1:123456789012:task/leasehold/0a1b2c",
            )
            .unwrap();
        identity.check_asks_as("0a1b2c", "0a1b2c").unwrap();
        assert!(
            identity
                .check_asks_as("9z9z9z", "arn:aws:ecs:eu-west-1:1:task/c/0a1b2c")
                .is_err()
        );
        assert!(
            identity
                .check_asks_as("0a1b2c", "arn:aws:ecs:eu-west-1:1:task/c/9z9z9z")
                .is_err()
        );
    }

    #[test]
    fn the_sts_answer_is_read_for_its_arn_and_error_code() {
        let answer = "<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>arn:aws:sts::1:assumed-role/r/s</Arn><UserId>X</UserId></GetCallerIdentityResult></GetCallerIdentityResponse>";
        assert_eq!(
            element(answer, "Arn"),
            Some("arn:aws:sts::1:assumed-role/r/s")
        );
        assert_eq!(
            element("<Error><Code>SignatureDoesNotMatch</Code></Error>", "Code"),
            Some("SignatureDoesNotMatch")
        );
        assert_eq!(element("<Arn>unterminated", "Arn"), None);
    }
}
