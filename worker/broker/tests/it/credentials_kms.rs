//! Version 2 credentials blobs (KMS envelope) against the KMS API of the moto
//! server the test command starts (the same one that serves DynamoDB), and
//! against a fake KMS that only throttles. Each test creates its own key.
//!
//! What is checked: the round trip and the blob's documented layout; a blob
//! replayed for another user is refused by KMS (encryption context) and, with
//! a data key legitimately unwrapped for that other user, still by AES-GCM
//! (associated data); tampering anywhere is refused; a wrong or unknown key id
//! gives a clear error naming the key; throttling is retried by the SDK, then
//! reported as such; no error text holds a secret or key material.

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use aws_sdk_kms::primitives::Blob;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use leasehold_broker::credentials::{
    AesGcmCipher, CipherError, CredentialsCipher, Keyring, KmsEnvelope, key_id_of, version_of,
};
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_testkit::dynamodb_endpoint;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CANARY: &str = "CANARY-kms-5e21-do-not-print";

fn plaintext() -> String {
    format!(r#"{{"api_key": "{CANARY}", "account_id": "A1"}}"#)
}

fn client(endpoint: &str) -> aws_sdk_kms::Client {
    aws_sdk_kms::Client::new(&local_sdk_config(RetryPolicy::Standard, endpoint))
}

/// A fresh symmetric key on the test server: its ARN.
async fn create_key(client: &aws_sdk_kms::Client) -> String {
    let key = client
        .create_key()
        .description("leasehold test")
        .send()
        .await
        .expect("CreateKey on the test server");
    key.key_metadata().unwrap().arn().unwrap().to_owned()
}

fn envelope(blob: &str) -> Value {
    serde_json::from_slice(&STANDARD.decode(blob).unwrap()).unwrap()
}

fn rewrap(mut envelope: Value, field: &str, value: Value) -> String {
    envelope[field] = value;
    STANDARD.encode(serde_json::to_vec(&envelope).unwrap())
}

/// No error text may hold the secret, nor (for good measure) anything that
/// looks like key material from the blob.
fn assert_clean(err: &CipherError, blob: &str) {
    let text = format!("{err} {err:?}");
    assert!(!text.contains(CANARY), "{text}");
    let envelope = envelope(blob);
    for field in ["encrypted_data_key", "nonce", "ciphertext"] {
        let value = envelope[field].as_str().unwrap();
        assert!(!text.contains(value), "{field} in {text}");
    }
}

#[tokio::test]
async fn round_trip_and_the_documented_layout() {
    let Some(endpoint) = dynamodb_endpoint() else {
        return;
    };
    let client = client(&endpoint);
    let arn = create_key(&client).await;
    let kms = KmsEnvelope::with_client(client.clone(), Some(arn.clone()));
    let blob = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap();
    assert!(!blob.contains(CANARY));
    assert_eq!(version_of(&blob), Ok(2));
    assert_eq!(key_id_of(&blob), Ok(Some(arn.clone())));
    let json = envelope(&blob);
    let fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        ["ciphertext", "encrypted_data_key", "key_id", "nonce", "v"],
        "{json}"
    );
    assert_eq!(json["v"], 2);
    assert_eq!(
        STANDARD
            .decode(json["nonce"].as_str().unwrap())
            .unwrap()
            .len(),
        12
    );
    // ciphertext ‖ 16-byte tag, no padding.
    assert_eq!(
        STANDARD
            .decode(json["ciphertext"].as_str().unwrap())
            .unwrap()
            .len(),
        plaintext().len() + 16
    );

    let credentials = kms.decrypt("u1", &blob).await.unwrap();
    assert_eq!(credentials.get("api_key").unwrap().expose(), CANARY);
    assert!(!format!("{credentials:?}").contains(CANARY));
    // A fresh data key per blob.
    let again = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap();
    assert_ne!(
        envelope(&again)["encrypted_data_key"],
        json["encrypted_data_key"]
    );

    // Decrypting needs no configured key id: the blob names its key.
    let reader = KmsEnvelope::with_client(client.clone(), None);
    assert!(reader.decrypt("u1", &blob).await.is_ok());
    // The keyring reads both versions; it writes version 2 when KMS has a key.
    let local = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let v1 = local.encrypt("u1", plaintext().as_bytes()).unwrap();
    let keyring = Keyring {
        local: Some(local),
        kms: Some(KmsEnvelope::with_client(client.clone(), Some(arn))),
    };
    assert!(keyring.decrypt("u1", &v1).await.is_ok());
    assert!(keyring.decrypt("u1", &blob).await.is_ok());
    let written = keyring.encrypt("u1", b"{}").await.unwrap();
    assert_eq!(version_of(&written), Ok(2));
    // A worker in KMS mode has no local key: a version 1 blob is refused clearly.
    assert_eq!(
        reader.decrypt("u1", &v1).await,
        Err(CipherError::NoLocalKey)
    );
    let kms_only = Keyring {
        local: None,
        kms: Some(reader),
    };
    assert_eq!(
        kms_only.decrypt("u1", &v1).await,
        Err(CipherError::NoLocalKey)
    );
    let local_only = Keyring {
        local: Some(AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap()),
        kms: None,
    };
    assert_eq!(
        local_only.decrypt("u1", &blob).await,
        Err(CipherError::NoKms)
    );
}

#[tokio::test]
async fn a_blob_replayed_for_another_user_is_refused_by_kms_and_by_aad() {
    let Some(endpoint) = dynamodb_endpoint() else {
        return;
    };
    let client = client(&endpoint);
    let arn = create_key(&client).await;
    let kms = KmsEnvelope::with_client(client.clone(), Some(arn.clone()));
    let blob = kms.encrypt("alice", plaintext().as_bytes()).await.unwrap();

    // KMS: the data key was wrapped with {"user_id": "alice"}.
    let err = kms.decrypt("bob", &blob).await.unwrap_err();
    assert!(
        matches!(&err, CipherError::KmsRefused { code, .. } if code == "InvalidCiphertextException"),
        "{err:?}"
    );
    assert_clean(&err, &blob);

    // AAD: a data key genuinely wrapped for bob, sealing a ciphertext made
    // for alice. KMS unwraps it for bob; AES-GCM still refuses.
    let data_key = client
        .generate_data_key()
        .key_id(&arn)
        .key_spec(aws_sdk_kms::types::DataKeySpec::Aes256)
        .encryption_context("user_id", "bob")
        .send()
        .await
        .unwrap();
    let cipher = Aes256Gcm::new_from_slice(data_key.plaintext().unwrap().as_ref()).unwrap();
    let nonce = Nonce::generate();
    let sealed = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext().as_bytes(),
                aad: b"alice",
            },
        )
        .unwrap();
    let mixed = serde_json::json!({
        "v": 2,
        "key_id": arn,
        "encrypted_data_key": STANDARD.encode(data_key.ciphertext_blob().unwrap().as_ref()),
        "nonce": STANDARD.encode(nonce.as_slice()),
        "ciphertext": STANDARD.encode(&sealed),
    });
    let mixed = STANDARD.encode(serde_json::to_vec(&mixed).unwrap());
    assert_eq!(
        kms.decrypt("bob", &mixed).await,
        Err(CipherError::DoesNotDecrypt)
    );
    // …and for alice, KMS refuses bob's data key.
    assert!(matches!(
        kms.decrypt("alice", &mixed).await,
        Err(CipherError::KmsRefused { .. })
    ));
}

#[tokio::test]
async fn tampered_blobs_are_refused() {
    let Some(endpoint) = dynamodb_endpoint() else {
        return;
    };
    let client = client(&endpoint);
    let arn = create_key(&client).await;
    let kms = KmsEnvelope::with_client(client, Some(arn));
    let blob = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap();
    let json = envelope(&blob);
    let flip = |field: &str| {
        let mut bytes = STANDARD.decode(json[field].as_str().unwrap()).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        rewrap(json.clone(), field, Value::from(STANDARD.encode(bytes)))
    };
    for (field, expected) in [
        ("ciphertext", "aes"),
        ("nonce", "aes"),
        ("encrypted_data_key", "kms"),
    ] {
        let tampered = flip(field);
        let err = kms.decrypt("u1", &tampered).await.unwrap_err();
        match expected {
            "aes" => assert_eq!(err, CipherError::DoesNotDecrypt, "{field}"),
            _ => assert!(
                matches!(err, CipherError::KmsRefused { .. }),
                "{field}: {err:?}"
            ),
        }
        assert_clean(&err, &tampered);
    }
    // Structure: each field missing, a wrong version, not base64.
    for field in ["key_id", "encrypted_data_key", "nonce", "ciphertext"] {
        let mut broken = json.clone();
        broken.as_object_mut().unwrap().remove(field);
        let broken = STANDARD.encode(serde_json::to_vec(&broken).unwrap());
        let err = kms.decrypt("u1", &broken).await.unwrap_err();
        assert_eq!(err, CipherError::BadEnvelope(field));
        assert!(err.to_string().contains(field), "{err}");
    }
    assert_eq!(
        kms.decrypt("u1", &rewrap(json.clone(), "v", Value::from(3)))
            .await,
        Err(CipherError::UnsupportedVersion(3))
    );
    assert_eq!(
        kms.decrypt("u1", &rewrap(json.clone(), "nonce", Value::from("%%")))
            .await,
        Err(CipherError::BadEnvelope("nonce"))
    );
    assert_eq!(
        kms.decrypt("u1", "not base64!").await,
        Err(CipherError::NotBase64)
    );
}

#[tokio::test]
async fn a_wrong_key_id_is_a_clear_error() {
    let Some(endpoint) = dynamodb_endpoint() else {
        return;
    };
    let client = client(&endpoint);
    let arn = create_key(&client).await;
    let other = create_key(&client).await;

    // Encrypting under a key that does not exist names it.
    let missing = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000";
    let err = KmsEnvelope::with_client(client.clone(), Some(missing.to_owned()))
        .encrypt("u1", plaintext().as_bytes())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CipherError::KmsKeyNotFound {
            key_id: missing.to_owned()
        }
    );
    assert!(err.to_string().contains(missing), "{err}");

    // A blob naming another existing key than the one that wrapped its data key.
    let kms = KmsEnvelope::with_client(client.clone(), Some(arn));
    let blob = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap();
    let swapped = rewrap(envelope(&blob), "key_id", Value::from(other.clone()));
    let err = kms.decrypt("u1", &swapped).await.unwrap_err();
    // Real KMS answers IncorrectKeyException, moto AccessDeniedException:
    // either way the error names the key the blob named.
    assert!(
        matches!(&err, CipherError::KmsWrongKey { key_id } if *key_id == other)
            || matches!(&err, CipherError::KmsRefused { key_id, .. } if *key_id == other),
        "{err:?}"
    );
    assert!(err.to_string().contains(&other), "{err}");
    assert_clean(&err, &swapped);
    // A blob naming a key that does not exist.
    let gone = rewrap(envelope(&blob), "key_id", Value::from(missing));
    let err = kms.decrypt("u1", &gone).await.unwrap_err();
    assert!(err.to_string().contains(missing), "{err}");
    assert_clean(&err, &gone);
    // (moto does not refuse Decrypt under a disabled key, so `KmsKeyUnusable`
    // is not exercised here.)
}

/// A KMS that answers every request with HTTP 400 `ThrottlingException`;
/// returns its endpoint and a request counter.
async fn throttling_kms() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                // Keep-alive: answer every request on the connection.
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buffer.len() < head_end + 4 + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buffer.drain(..head_end + 4 + length);
                    seen.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"__type":"ThrottlingException","message":"Rate exceeded"}"#;
                    let response = format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/x-amz-json-1.1\r\nx-amzn-requestid: t\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, count)
}

#[tokio::test]
async fn throttling_is_retried_by_the_sdk_then_reported_without_secrets() {
    let (endpoint, count) = throttling_kms().await;
    let kms = KmsEnvelope::with_client(client(&endpoint), Some("alias/leasehold".into()));
    // A well-formed blob (its data key is random bytes: it never reaches a KMS
    // that would unwrap it).
    let blob = STANDARD.encode(
        serde_json::to_vec(&serde_json::json!({
            "v": 2, "key_id": "alias/leasehold",
            "encrypted_data_key": STANDARD.encode([7u8; 64]),
            "nonce": STANDARD.encode([1u8; 12]),
            "ciphertext": STANDARD.encode(CANARY.as_bytes().iter().chain(&[0u8; 16]).copied().collect::<Vec<u8>>()),
        }))
        .unwrap(),
    );
    let started = std::time::Instant::now();
    let err = kms.decrypt("u1", &blob).await.unwrap_err();
    assert_eq!(
        err,
        CipherError::KmsThrottled {
            operation: "Decrypt"
        }
    );
    assert_clean(&err, &blob);
    assert!(err.to_string().contains("ThrottlingException"), "{err}");
    // The standard retry policy: 3 attempts, with backoff between them.
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
    eprintln!("3 throttled attempts took {:?}", started.elapsed());
    let err = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap_err();
    assert_eq!(
        err,
        CipherError::KmsThrottled {
            operation: "GenerateDataKey"
        }
    );
    assert!(!err.to_string().contains(CANARY));
}

#[tokio::test]
async fn kms_errors_carry_codes_not_service_messages() {
    // A KMS that is not there at all.
    let kms = KmsEnvelope::with_client(client("http://127.0.0.1:9"), Some("k".into()));
    let err = kms.encrypt("u1", plaintext().as_bytes()).await.unwrap_err();
    assert!(
        matches!(&err, CipherError::KmsFailed { operation: "GenerateDataKey", problem } if problem == "cannot reach KMS"),
        "{err:?}"
    );
    let _ = Blob::new(Vec::new());
}
