//! Credentials blobs (docs/messages.md, docs/redis.md), two versions in one
//! key, `credentials:{user_id}`:
//!
//! - **version 2, KMS envelope** (production): standard base64 of the JSON
//!   object `{"v": 2, "key_id", "encrypted_data_key", "nonce", "ciphertext"}`.
//!   A fresh AES-256 data key per blob comes from KMS `GenerateDataKey` with the
//!   encryption context `{"user_id": USER_ID}`; only KMS `Decrypt` with that same
//!   context unwraps it again. The data key seals the plaintext with AES-256-GCM,
//!   associated data = the user id, and is zeroized right after use. A worker
//!   therefore holds no key that opens another user's blob: each blob needs its
//!   own call to KMS, bound to its user.
//! - **version 1, local key** (`dev`, tests): standard base64 of `nonce (12
//!   bytes) ‖ AES-256-GCM ciphertext+tag`, key `CREDENTIALS_KEY` (or
//!   `CREDENTIALS_KEY_FILE`), associated data = the user id.
//!
//! The plaintext is a JSON object of string fields the broker defines (paper:
//! `api_key`, `account_id`). Decrypted secrets live only in [`Credentials`]:
//! zeroized on drop, redacted in `Debug`, never part of an error. [`Keyring`]
//! reads both versions (each blob names its own KMS key, which is how a key
//! rotation needs no downtime) and writes version 2 when a KMS key is set.

use std::collections::BTreeMap;

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use async_trait::async_trait;
use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use leasehold_platform::aws::{RetryPolicy, sdk_config};
use leasehold_platform::iam::{self, IamAction, kms};
use serde::Serialize;
use zeroize::Zeroizing;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// The encryption context key KMS binds every data key to.
pub const CONTEXT_KEY: &str = "user_id";

/// Why a key or blob could not be used. Never carries key or plaintext bytes;
/// KMS failures carry the error code and the key id (not secret), never the
/// service's message text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CipherError {
    /// The configured key is not standard base64 of 32 bytes.
    #[error("CREDENTIALS_KEY must be standard base64 of 32 bytes")]
    InvalidKey,
    /// The blob is not standard base64.
    #[error("credentials blob is not standard base64")]
    NotBase64,
    /// The blob is shorter than nonce plus tag.
    #[error("credentials blob is too short")]
    TooShort,
    /// Authentication failed: wrong key, a blob for another user, or tampering.
    #[error("credentials do not decrypt (wrong key, another user's blob, or tampered)")]
    DoesNotDecrypt,
    /// Decrypted, but the plaintext is not a JSON object of strings.
    #[error("decrypted credentials are not a JSON object of string fields")]
    NotJsonObject,
    /// Encryption failed (not expected with a valid key).
    #[error("encryption failed")]
    Encrypt,
    /// A version 2 blob whose JSON lacks a field or has a malformed one.
    #[error("credentials blob version 2: field `{0}` is missing or malformed")]
    BadEnvelope(&'static str),
    /// A blob of a version this build does not know.
    #[error("credentials blob version {0} is not supported (1 and 2 are)")]
    UnsupportedVersion(u64),
    /// A version 1 blob, but this process has no local key.
    #[error(
        "credentials blob is version 1 (local key) but no CREDENTIALS_KEY or CREDENTIALS_KEY_FILE is configured"
    )]
    NoLocalKey,
    /// A version 2 blob, but this process has no KMS client.
    #[error("credentials blob is version 2 (KMS) but this process has no KMS access")]
    NoKms,
    /// Nothing to encrypt with: neither a KMS key id nor a local key.
    #[error("no CREDENTIALS_KMS_KEY_ID (or local key) to encrypt with")]
    NoEncryptionKey,
    /// KMS refused to unwrap the data key: the blob belongs to another user
    /// (encryption context mismatch), it was tampered with, or this role may
    /// not use the key. KMS says which only to CloudTrail.
    #[error(
        "KMS refused to decrypt the data key under key {key_id} ({code}): another user's blob, a tampered blob, or a key this role may not use"
    )]
    KmsRefused {
        /// The key id the blob names.
        key_id: String,
        /// KMS error code.
        code: String,
    },
    /// The data key was not encrypted under the key the blob names.
    #[error("the blob's data key was not encrypted under KMS key {key_id} (IncorrectKeyException)")]
    KmsWrongKey {
        /// The key id the blob (or the setting) names.
        key_id: String,
    },
    /// KMS does not know the key id.
    #[error("KMS key {key_id} does not exist (or this role cannot see it)")]
    KmsKeyNotFound {
        /// The key id.
        key_id: String,
    },
    /// The key exists but cannot be used now (disabled, pending deletion…).
    #[error("KMS key {key_id} cannot be used now ({code})")]
    KmsKeyUnusable {
        /// The key id.
        key_id: String,
        /// KMS error code.
        code: String,
    },
    /// KMS kept throttling after the SDK's retries.
    #[error("KMS throttled {operation} after retries (ThrottlingException); try again later")]
    KmsThrottled {
        /// `Decrypt` or `GenerateDataKey`.
        operation: &'static str,
    },
    /// The credential sealer could not be reached or could not answer now
    /// (Redis or KMS unavailable behind it).
    #[error("credential sealer unavailable: {0}")]
    SealerUnavailable(String),
    /// The credential sealer refused (no grant, not the user's worker, no
    /// blob, a blob that does not decrypt) or sealed something this worker
    /// cannot open.
    #[error("credential sealer refused ({status}): {reason}")]
    SealerRefused {
        /// HTTP status of the answer.
        status: u16,
        /// The sealer's reason (ids and causes, never a secret).
        reason: String,
    },
    /// KMS could not be reached, or answered with another error.
    #[error("KMS {operation} failed: {problem}")]
    KmsFailed {
        /// `Decrypt` or `GenerateDataKey`.
        operation: &'static str,
        /// An error code or the kind of transport failure (never a message body).
        problem: String,
    },
}

impl CipherError {
    /// Whether trying again later may succeed: KMS throttled or could not be
    /// reached. Everything else is about the blob, the key or the role, and
    /// stays wrong until someone changes it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CipherError::KmsThrottled { .. }
                | CipherError::KmsFailed { .. }
                | CipherError::SealerUnavailable(_)
        )
    }
}

/// Most bytes `credentials put` accepts (a broker's credentials are a few
/// hundred bytes; the cap is what lets the buffer be sized once).
pub const PLAINTEXT_MAX_BYTES: usize = 65_536;

/// Why plaintext credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlaintextError {
    /// More than [`PLAINTEXT_MAX_BYTES`].
    #[error("credentials are larger than {PLAINTEXT_MAX_BYTES} bytes")]
    TooLarge,
    /// The reader failed.
    #[error("cannot read the credentials: {0}")]
    Read(std::io::Error),
}

/// Reads at most [`PLAINTEXT_MAX_BYTES`] of plaintext into one zeroizing
/// buffer allocated once, up front: no reallocation leaves a copy of the
/// secret behind in freed memory. Pass an unbuffered reader (the raw stdin
/// descriptor), or the reader's own buffer keeps a copy.
pub fn read_plaintext(
    mut reader: impl std::io::Read,
) -> Result<Zeroizing<Vec<u8>>, PlaintextError> {
    // One byte more than allowed, to tell "exactly the limit" from "over it".
    let mut buffer = Zeroizing::new(vec![0u8; PLAINTEXT_MAX_BYTES + 1]);
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(PlaintextError::Read(err)),
        }
    }
    if filled > PLAINTEXT_MAX_BYTES {
        return Err(PlaintextError::TooLarge);
    }
    // Truncating keeps the allocation (and zeroizes it all on drop).
    buffer.truncate(filled);
    Ok(buffer)
}

/// A secret string: zeroized on drop, `[redacted]` in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(Zeroizing<String>);

impl SecretString {
    /// Wraps a secret.
    pub fn new(value: String) -> Self {
        SecretString(Zeroizing::new(value))
    }

    /// The secret itself, for the broker SDK call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Decrypted credentials: field name → secret. Only field names are ever shown.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    fields: BTreeMap<String, SecretString>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("fields", &self.fields.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Credentials {
    /// A field, if present.
    pub fn get(&self, name: &str) -> Option<&SecretString> {
        self.fields.get(name)
    }

    /// The plaintext JSON object again (for re-encryption), in a buffer sized
    /// up front so no partial copy is left behind unzeroized by a reallocation.
    pub fn to_json(&self) -> Zeroizing<Vec<u8>> {
        let fields: BTreeMap<&str, &str> = self
            .fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.expose()))
            .collect();
        let size: usize = self
            .fields
            .iter()
            .map(|(k, v)| k.len() + v.expose().len())
            .sum();
        let mut out = Zeroizing::new(Vec::with_capacity(size * 6 + 16 * self.fields.len() + 16));
        // Writing a map of strings into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &fields);
        out
    }

    /// Parses the plaintext JSON object (string values only).
    pub fn from_json(plaintext: &[u8]) -> Result<Self, CipherError> {
        let fields: BTreeMap<String, Zeroizing<String>> =
            serde_json::from_slice(plaintext).map_err(|_| CipherError::NotJsonObject)?;
        Ok(Credentials {
            fields: fields
                .into_iter()
                .map(|(name, value)| (name, SecretString(value)))
                .collect(),
        })
    }
}

/// Encrypts and decrypts credentials blobs bound to a user: [`AesGcmCipher`]
/// (version 1 only), [`KmsEnvelope`] (version 2 only), [`Keyring`] (both; what
/// the binary uses).
#[async_trait]
pub trait CredentialsCipher: Send + Sync {
    /// Encrypts a plaintext JSON object for `user_id`.
    async fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError>;
    /// Decrypts a blob for `user_id`; fails for any other user's blob.
    async fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError>;
}

/// AES-256-GCM with a random 96-bit nonce per blob (version 1).
#[derive(Clone)]
pub struct AesGcmCipher {
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for AesGcmCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesGcmCipher([redacted])")
    }
}

/// Seals `plaintext` with `cipher` under a fresh nonce: `(nonce, ciphertext‖tag)`.
pub(crate) fn seal(
    cipher: &Aes256Gcm,
    user_id: &str,
    plaintext: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), CipherError> {
    let nonce = Nonce::generate();
    let ciphertext = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad: user_id.as_bytes(),
            },
        )
        .map_err(|_| CipherError::Encrypt)?;
    Ok((nonce.as_slice().to_vec(), ciphertext))
}

/// Opens `ciphertext‖tag` sealed for `user_id`.
pub(crate) fn open(
    cipher: &Aes256Gcm,
    user_id: &str,
    nonce: &[u8],
    ciphertext: &[u8],
) -> Result<Credentials, CipherError> {
    if nonce.len() != NONCE_LEN || ciphertext.len() < TAG_LEN {
        return Err(CipherError::TooShort);
    }
    let nonce = Nonce::try_from(nonce).map_err(|_| CipherError::TooShort)?;
    let plaintext = Zeroizing::new(
        cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad: user_id.as_bytes(),
                },
            )
            .map_err(|_| CipherError::DoesNotDecrypt)?,
    );
    Credentials::from_json(&plaintext)
}

impl AesGcmCipher {
    /// From the `CREDENTIALS_KEY` value (standard base64 of 32 bytes).
    pub fn from_base64_key(key: &str) -> Result<Self, CipherError> {
        let bytes = Zeroizing::new(
            STANDARD
                .decode(key.trim())
                .map_err(|_| CipherError::InvalidKey)?,
        );
        let cipher = Aes256Gcm::new_from_slice(&bytes).map_err(|_| CipherError::InvalidKey)?;
        Ok(AesGcmCipher { cipher })
    }

    /// A fresh random key in `CREDENTIALS_KEY` form (tests, first set-up).
    pub fn generate_key() -> String {
        let key = Zeroizing::new(rand::random::<[u8; 32]>());
        STANDARD.encode(key.as_slice())
    }

    /// Encrypts a version 1 blob (no I/O, so callable outside async code).
    pub fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        let (nonce, ciphertext) = seal(&self.cipher, user_id, plaintext)?;
        let mut blob = nonce;
        blob.extend_from_slice(&ciphertext);
        Ok(STANDARD.encode(blob))
    }

    /// Decrypts a version 1 blob.
    pub fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError> {
        let raw = STANDARD
            .decode(blob.trim())
            .map_err(|_| CipherError::NotBase64)?;
        if raw.len() < NONCE_LEN + TAG_LEN {
            return Err(CipherError::TooShort);
        }
        let (nonce, ciphertext) = raw.split_at(NONCE_LEN);
        open(&self.cipher, user_id, nonce, ciphertext)
    }
}

#[async_trait]
impl CredentialsCipher for AesGcmCipher {
    async fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        AesGcmCipher::encrypt(self, user_id, plaintext)
    }

    async fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError> {
        AesGcmCipher::decrypt(self, user_id, blob)
    }
}

/// The JSON inside a version 2 blob (before the outer base64).
#[derive(Debug, Serialize)]
struct EnvelopeV2 {
    v: u64,
    key_id: String,
    encrypted_data_key: String,
    nonce: String,
    ciphertext: String,
}

impl EnvelopeV2 {
    /// The KMS-wrapped data key, decoded.
    fn wrapped_key(&self) -> Result<Vec<u8>, CipherError> {
        STANDARD
            .decode(&self.encrypted_data_key)
            .map_err(|_| CipherError::BadEnvelope("encrypted_data_key"))
    }

    /// The stored form: standard base64 of the JSON object.
    fn to_blob(&self) -> Result<String, CipherError> {
        let json = serde_json::to_vec(self).map_err(|_| CipherError::Encrypt)?;
        Ok(STANDARD.encode(json))
    }
}

/// Which version a blob is, found without any key.
#[derive(Debug)]
enum Blob2OrNot {
    V1,
    V2(EnvelopeV2),
}

/// A version 2 blob is base64 of a JSON object with `"v"`; anything else that
/// is base64 is a version 1 blob (whose first byte is a random nonce byte).
fn blob_version(blob: &str) -> Result<Blob2OrNot, CipherError> {
    let raw = STANDARD
        .decode(blob.trim())
        .map_err(|_| CipherError::NotBase64)?;
    if raw.first() != Some(&b'{') {
        return Ok(Blob2OrNot::V1);
    }
    let Ok(serde_json::Value::Object(object)) = serde_json::from_slice(&raw) else {
        return Ok(Blob2OrNot::V1);
    };
    match object.get("v").map(serde_json::Value::as_u64) {
        None => Ok(Blob2OrNot::V1),
        Some(Some(2)) => {
            let field = |name: &'static str| {
                object
                    .get(name)
                    .and_then(serde_json::Value::as_str)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .ok_or(CipherError::BadEnvelope(name))
            };
            Ok(Blob2OrNot::V2(EnvelopeV2 {
                v: 2,
                key_id: field("key_id")?,
                encrypted_data_key: field("encrypted_data_key")?,
                nonce: field("nonce")?,
                ciphertext: field("ciphertext")?,
            }))
        }
        Some(Some(other)) => Err(CipherError::UnsupportedVersion(other)),
        Some(None) => Err(CipherError::BadEnvelope("v")),
    }
}

/// The blob version (1 or 2) of a stored blob; for `credentials rotate` reports.
pub fn version_of(blob: &str) -> Result<u64, CipherError> {
    Ok(match blob_version(blob)? {
        Blob2OrNot::V1 => 1,
        Blob2OrNot::V2(_) => 2,
    })
}

/// The KMS key id a version 2 blob names (`None` for version 1).
pub fn key_id_of(blob: &str) -> Result<Option<String>, CipherError> {
    Ok(match blob_version(blob)? {
        Blob2OrNot::V1 => None,
        Blob2OrNot::V2(envelope) => Some(envelope.key_id),
    })
}

/// Turns a KMS SDK error into a [`CipherError`] by its code alone.
/// The IAM actions a KMS call is about to need, declared by the running
/// subcommand ([`leasehold_platform::iam`]).
fn may(operation: &'static str, needs: &[IamAction]) -> Result<(), CipherError> {
    iam::authorize(needs).map_err(|err| CipherError::KmsFailed {
        operation,
        problem: err.to_string(),
    })
}

fn kms_error<E: ProvideErrorMetadata + std::error::Error + 'static, R>(
    operation: &'static str,
    key_id: &str,
    err: SdkError<E, R>,
) -> CipherError {
    let problem = match &err {
        SdkError::ConstructionFailure(_) => {
            "the request could not be built (is a region configured?)"
        }
        SdkError::TimeoutError(_) => "timed out",
        SdkError::DispatchFailure(_) => "cannot reach KMS",
        SdkError::ResponseError(_) => "unreadable response",
        _ => "",
    };
    if !problem.is_empty() {
        return CipherError::KmsFailed {
            operation,
            problem: problem.to_owned(),
        };
    }
    let code = err.code().unwrap_or("unknown error").to_owned();
    match code.as_str() {
        "ThrottlingException" => CipherError::KmsThrottled { operation },
        "IncorrectKeyException" => CipherError::KmsWrongKey {
            key_id: key_id.to_owned(),
        },
        "NotFoundException" => CipherError::KmsKeyNotFound {
            key_id: key_id.to_owned(),
        },
        "DisabledException" | "KMSInvalidStateException" | "KeyUnavailableException" => {
            CipherError::KmsKeyUnusable {
                key_id: key_id.to_owned(),
                code,
            }
        }
        "InvalidCiphertextException" | "AccessDeniedException" | "InvalidKeyUsageException" => {
            CipherError::KmsRefused {
                key_id: key_id.to_owned(),
                code,
            }
        }
        _ => CipherError::KmsFailed {
            operation,
            problem: code,
        },
    }
}

/// KMS envelope encryption (version 2). Encrypting needs a key id; decrypting
/// uses the key the blob names, so it keeps working across a rotation.
pub struct KmsEnvelope {
    key_id: Option<String>,
    client: tokio::sync::OnceCell<aws_sdk_kms::Client>,
}

impl std::fmt::Debug for KmsEnvelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmsEnvelope")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl KmsEnvelope {
    /// With this client (tests, a local KMS-compatible server).
    pub fn with_client(client: aws_sdk_kms::Client, key_id: Option<String>) -> Self {
        KmsEnvelope {
            key_id,
            client: tokio::sync::OnceCell::new_with(Some(client)),
        }
    }

    /// With a client from the AWS SDK's standard chain (region, credentials,
    /// `AWS_ENDPOINT_URL`), built on first use so a process that never meets a
    /// version 2 blob never looks for AWS configuration. The SDK's standard
    /// retries (3 attempts, backoff and jitter) ride out throttling.
    pub fn from_environment(key_id: Option<String>) -> Self {
        KmsEnvelope {
            key_id,
            client: tokio::sync::OnceCell::new(),
        }
    }

    /// The key new blobs are encrypted under, if any.
    pub fn key_id(&self) -> Option<&str> {
        self.key_id.as_deref()
    }

    async fn client(&self) -> &aws_sdk_kms::Client {
        self.client
            .get_or_init(|| async {
                aws_sdk_kms::Client::new(&sdk_config(RetryPolicy::Standard).await)
            })
            .await
    }

    /// Unwraps a blob's data key through KMS, bound to `user_id`.
    async fn data_key(
        &self,
        user_id: &str,
        envelope: &EnvelopeV2,
    ) -> Result<Zeroizing<Vec<u8>>, CipherError> {
        let wrapped = envelope.wrapped_key()?;
        may("Decrypt", &[kms::DECRYPT])?;
        let output = self
            .client()
            .await
            .decrypt()
            .key_id(&envelope.key_id)
            .ciphertext_blob(Blob::new(wrapped))
            .encryption_context(CONTEXT_KEY, user_id)
            .send()
            .await
            .map_err(|err| kms_error("Decrypt", &envelope.key_id, err))?;
        let key = output
            .plaintext
            .map(Blob::into_inner)
            .map(Zeroizing::new)
            .ok_or(CipherError::KmsFailed {
                operation: "Decrypt",
                problem: "no plaintext in the answer".into(),
            })?;
        Ok(key)
    }

    /// The same blob with its data key re-wrapped under this envelope's key
    /// (KMS `ReEncrypt`, source and destination both bound to `user_id`): the
    /// data key and the plaintext never reach this process, so rotating needs
    /// no right to read anyone's credentials. The nonce and ciphertext stay.
    async fn rewrap(&self, user_id: &str, envelope: &EnvelopeV2) -> Result<String, CipherError> {
        let key_id = self.key_id.as_deref().ok_or(CipherError::NoEncryptionKey)?;
        let wrapped = envelope.wrapped_key()?;
        may("ReEncrypt", &[kms::RE_ENCRYPT_FROM, kms::RE_ENCRYPT_TO])?;
        let output = self
            .client()
            .await
            .re_encrypt()
            .ciphertext_blob(Blob::new(wrapped))
            .source_key_id(&envelope.key_id)
            .source_encryption_context(CONTEXT_KEY, user_id)
            .destination_key_id(key_id)
            .destination_encryption_context(CONTEXT_KEY, user_id)
            .send()
            .await
            .map_err(|err| kms_error("ReEncrypt", &envelope.key_id, err))?;
        let rewrapped = output.ciphertext_blob.ok_or(CipherError::KmsFailed {
            operation: "ReEncrypt",
            problem: "no CiphertextBlob in the answer".into(),
        })?;
        let rotated = EnvelopeV2 {
            v: 2,
            // The key's ARN, as `encrypt` stores it.
            key_id: output.key_id.unwrap_or_else(|| key_id.to_owned()),
            encrypted_data_key: STANDARD.encode(rewrapped.as_ref()),
            nonce: envelope.nonce.clone(),
            ciphertext: envelope.ciphertext.clone(),
        };
        rotated.to_blob()
    }

    /// Decrypts a parsed version 2 blob.
    async fn open_envelope(
        &self,
        user_id: &str,
        envelope: &EnvelopeV2,
    ) -> Result<Credentials, CipherError> {
        let nonce = STANDARD
            .decode(&envelope.nonce)
            .map_err(|_| CipherError::BadEnvelope("nonce"))?;
        let ciphertext = STANDARD
            .decode(&envelope.ciphertext)
            .map_err(|_| CipherError::BadEnvelope("ciphertext"))?;
        if nonce.len() != NONCE_LEN {
            return Err(CipherError::BadEnvelope("nonce"));
        }
        let key = self.data_key(user_id, envelope).await?;
        // The AES key schedule is zeroized on drop (aes-gcm's `zeroize`
        // feature), the data key bytes by `Zeroizing`: both go at the end of
        // this function.
        let cipher = Aes256Gcm::new_from_slice(&key).map_err(|_| CipherError::KmsFailed {
            operation: "Decrypt",
            problem: "the data key is not 32 bytes".into(),
        })?;
        open(&cipher, user_id, &nonce, &ciphertext)
    }
}

#[async_trait]
impl CredentialsCipher for KmsEnvelope {
    async fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        let key_id = self.key_id.as_deref().ok_or(CipherError::NoEncryptionKey)?;
        may("GenerateDataKey", &[kms::GENERATE_DATA_KEY])?;
        let output = self
            .client()
            .await
            .generate_data_key()
            .key_id(key_id)
            .key_spec(DataKeySpec::Aes256)
            .encryption_context(CONTEXT_KEY, user_id)
            .send()
            .await
            .map_err(|err| kms_error("GenerateDataKey", key_id, err))?;
        let missing = |what: &str| CipherError::KmsFailed {
            operation: "GenerateDataKey",
            problem: format!("no {what} in the answer"),
        };
        // The key's ARN, not an alias: the blob must name the key that wrapped
        // it even after an alias moves to a new key.
        let arn = output.key_id.clone().unwrap_or_else(|| key_id.to_owned());
        let wrapped = output
            .ciphertext_blob
            .clone()
            .ok_or_else(|| missing("CiphertextBlob"))?;
        let data_key = output
            .plaintext
            .map(Blob::into_inner)
            .map(Zeroizing::new)
            .ok_or_else(|| missing("Plaintext"))?;
        let cipher = Aes256Gcm::new_from_slice(&data_key).map_err(|_| missing("32-byte key"))?;
        let (nonce, ciphertext) = seal(&cipher, user_id, plaintext)?;
        let envelope = EnvelopeV2 {
            v: 2,
            key_id: arn,
            encrypted_data_key: STANDARD.encode(wrapped.as_ref()),
            nonce: STANDARD.encode(nonce),
            ciphertext: STANDARD.encode(ciphertext),
        };
        envelope.to_blob()
    }

    async fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError> {
        match blob_version(blob)? {
            Blob2OrNot::V2(envelope) => self.open_envelope(user_id, &envelope).await,
            Blob2OrNot::V1 => Err(CipherError::NoLocalKey),
        }
    }
}

/// How `credentials rotate` moved one blob to the current KMS key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrapped {
    /// A version 2 blob whose data key KMS re-wrapped: no plaintext and no
    /// data key were in this process.
    KeyOnly(String),
    /// A version 1 blob, decrypted with the local key and encrypted anew as
    /// version 2 (the only way off a local key; the plaintext was in
    /// zeroized buffers for this step).
    Migrated(String),
}

impl Rewrapped {
    /// The new blob.
    pub fn blob(&self) -> &str {
        match self {
            Rewrapped::KeyOnly(blob) | Rewrapped::Migrated(blob) => blob,
        }
    }
}

/// Both blob versions: version 2 through KMS, version 1 with the local key
/// when one is configured. Encrypts version 2 when a KMS key id is set, else
/// version 1.
#[derive(Debug, Default)]
pub struct Keyring {
    /// Version 1 key (`dev`, or explicitly allowed in production).
    pub local: Option<AesGcmCipher>,
    /// Version 2.
    pub kms: Option<KmsEnvelope>,
}

impl Keyring {
    /// `blob` under the configured KMS key, for `user_id`: a version 2 blob
    /// by `ReEncrypt` alone, a version 1 blob by decrypting it locally.
    pub async fn rotate(&self, user_id: &str, blob: &str) -> Result<Rewrapped, CipherError> {
        let kms = self
            .kms
            .as_ref()
            .filter(|kms| kms.key_id().is_some())
            .ok_or(CipherError::NoEncryptionKey)?;
        match blob_version(blob)? {
            Blob2OrNot::V2(envelope) => {
                Ok(Rewrapped::KeyOnly(kms.rewrap(user_id, &envelope).await?))
            }
            Blob2OrNot::V1 => {
                let local = self.local.as_ref().ok_or(CipherError::NoLocalKey)?;
                let plaintext = local.decrypt(user_id, blob)?.to_json();
                Ok(Rewrapped::Migrated(kms.encrypt(user_id, &plaintext).await?))
            }
        }
    }
}

#[async_trait]
impl CredentialsCipher for Keyring {
    async fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        match (&self.kms, &self.local) {
            (Some(kms), _) if kms.key_id().is_some() => kms.encrypt(user_id, plaintext).await,
            (_, Some(local)) => local.encrypt(user_id, plaintext),
            _ => Err(CipherError::NoEncryptionKey),
        }
    }

    async fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError> {
        match blob_version(blob)? {
            Blob2OrNot::V2(envelope) => {
                let kms = self.kms.as_ref().ok_or(CipherError::NoKms)?;
                kms.open_envelope(user_id, &envelope).await
            }
            Blob2OrNot::V1 => self
                .local
                .as_ref()
                .ok_or(CipherError::NoLocalKey)?
                .decrypt(user_id, blob),
        }
    }
}

#[cfg(test)]
mod tests;
