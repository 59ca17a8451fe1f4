//! Credentials blobs (docs/redis.md): standard base64 of `nonce (12 bytes) ‖
//! AES-256-GCM ciphertext+tag`, key `CREDENTIALS_KEY`, associated data = the user
//! id, so a blob cannot be replayed for another user. The plaintext is a JSON
//! object of string fields the broker defines (paper: `api_key`, `account_id`).
//!
//! Decrypted secrets live only in [`Credentials`]: zeroized on drop, redacted in
//! `Debug`, never part of an error. [`CredentialsCipher`] is the seam for a KMS
//! envelope implementation (a data key per blob, wrapped by KMS).

use std::collections::BTreeMap;

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Why a key or blob could not be used. Never carries key or plaintext bytes.
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

/// Encrypts and decrypts credentials blobs bound to a user. Implementations:
/// [`AesGcmCipher`] (a key from `CREDENTIALS_KEY`); a KMS envelope cipher can
/// implement the same trait without touching the worker.
pub trait CredentialsCipher: Send + Sync {
    /// Encrypts a plaintext JSON object for `user_id`.
    fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError>;
    /// Decrypts a blob for `user_id`; fails for any other user's blob.
    fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError>;
}

/// AES-256-GCM with a random 96-bit nonce per blob.
#[derive(Clone)]
pub struct AesGcmCipher {
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for AesGcmCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesGcmCipher([redacted])")
    }
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
}

impl CredentialsCipher for AesGcmCipher {
    fn encrypt(&self, user_id: &str, plaintext: &[u8]) -> Result<String, CipherError> {
        let nonce = Nonce::generate();
        let ciphertext = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: user_id.as_bytes(),
                },
            )
            .map_err(|_| CipherError::Encrypt)?;
        let mut blob = Vec::with_capacity(NONCE_LEN + ciphertext.len());
        blob.extend_from_slice(nonce.as_slice());
        blob.extend_from_slice(&ciphertext);
        Ok(STANDARD.encode(blob))
    }

    fn decrypt(&self, user_id: &str, blob: &str) -> Result<Credentials, CipherError> {
        let raw = STANDARD
            .decode(blob.trim())
            .map_err(|_| CipherError::NotBase64)?;
        if raw.len() < NONCE_LEN + TAG_LEN {
            return Err(CipherError::TooShort);
        }
        let (nonce, ciphertext) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_from(nonce).map_err(|_| CipherError::TooShort)?;
        let plaintext = Zeroizing::new(
            self.cipher
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
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "CANARY-7d1f-secret";

    fn plaintext() -> String {
        format!(r#"{{"api_key": "{CANARY}", "account_id": "A1"}}"#)
    }

    #[test]
    fn round_trip() {
        let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        let blob = cipher.encrypt("u1", plaintext().as_bytes()).unwrap();
        assert!(!blob.contains(CANARY));
        let credentials = cipher.decrypt("u1", &blob).unwrap();
        assert_eq!(credentials.get("api_key").unwrap().expose(), CANARY);
        assert_eq!(credentials.get("account_id").unwrap().expose(), "A1");
        // Fresh nonce per blob.
        assert_ne!(blob, cipher.encrypt("u1", plaintext().as_bytes()).unwrap());
    }

    #[test]
    fn wrong_key_and_other_users_blob_fail() {
        let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        let other = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        let blob = cipher.encrypt("u1", plaintext().as_bytes()).unwrap();
        assert_eq!(other.decrypt("u1", &blob), Err(CipherError::DoesNotDecrypt));
        assert_eq!(
            cipher.decrypt("u2", &blob),
            Err(CipherError::DoesNotDecrypt)
        );
        assert_eq!(cipher.decrypt("u1", "!!"), Err(CipherError::NotBase64));
        assert_eq!(cipher.decrypt("u1", "AAAA"), Err(CipherError::TooShort));
        let not_json = cipher.encrypt("u1", b"[1, 2]").unwrap();
        assert_eq!(
            cipher.decrypt("u1", &not_json),
            Err(CipherError::NotJsonObject)
        );
    }

    #[test]
    fn keys_are_validated_without_echo() {
        let err = AesGcmCipher::from_base64_key("c2hvcnQ=").unwrap_err();
        assert_eq!(err, CipherError::InvalidKey);
        let err = AesGcmCipher::from_base64_key("CANARY not base64").unwrap_err();
        assert!(!err.to_string().contains("CANARY"));
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        let credentials = cipher
            .decrypt("u1", &cipher.encrypt("u1", plaintext().as_bytes()).unwrap())
            .unwrap();
        let shown = format!(
            "{credentials:?} {:?} {cipher:?}",
            credentials.get("api_key")
        );
        assert!(!shown.contains(CANARY), "{shown}");
        assert!(shown.contains("api_key"), "{shown}");
    }

    /// The blob format is documented for other languages: check it by hand.
    #[test]
    fn blob_layout_is_nonce_then_ciphertext_and_tag() {
        let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        let blob = cipher.encrypt("u1", b"{}").unwrap();
        let raw = STANDARD.decode(blob).unwrap();
        assert_eq!(raw.len(), NONCE_LEN + 2 + TAG_LEN);
    }
}
