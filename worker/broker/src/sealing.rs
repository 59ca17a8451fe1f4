//! Credentials sealed to one broker worker: the worker holds an ephemeral
//! X25519 key for its lifetime and publishes the public half in its marks
//! (`seal_key`); the credential sealer ([`crate::sealer`]), which alone may
//! decrypt blobs, seals the user's credentials to that key. A worker thus
//! never holds anything that opens a stored blob, only what was sealed to it.
//!
//! The construction is the usual one-shot ECIES (as HPKE's base mode): a
//! fresh sender key per seal, X25519 with the worker's key, HKDF-SHA256 over
//! the shared secret (salt: both public keys; info: a fixed label), and
//! AES-256-GCM with the user id as associated data, so a sealed box opened
//! for another user fails as a blob would.

use aes_gcm::{Aes256Gcm, KeyInit};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use crate::credentials::{self, CipherError, Credentials};

/// The sealed form's version (`v`).
pub const SEALED_VERSION: u64 = 1;

/// HKDF's `info`: binds the derived key to this use and version.
const KDF_INFO: &[u8] = b"leasehold credential seal v1";

/// Why a key or a sealed box could not be used. Never carries key or
/// plaintext bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// A public key that is not standard base64 of 32 bytes.
    #[error("seal_key must be standard base64 of a 32-byte X25519 public key")]
    BadPublicKey,
    /// A public key of small order: the shared secret would be known to anyone.
    #[error("seal_key is a low-order point and is refused")]
    WeakPublicKey,
    /// A sealed box with a missing or malformed field, or another version.
    #[error("sealed credentials: field `{0}` is missing or malformed")]
    Malformed(&'static str),
    /// The box did not open: sealed to another key or user, or tampered.
    #[error(transparent)]
    Cipher(#[from] CipherError),
}

/// Credentials sealed to one worker's key for one user (JSON on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedCredentials {
    /// [`SEALED_VERSION`].
    pub v: u64,
    /// The sender's one-time X25519 public key (standard base64).
    pub epk: String,
    /// AES-GCM nonce (standard base64, 12 bytes).
    pub nonce: String,
    /// AES-GCM ciphertext and tag of the credentials JSON (standard base64).
    pub ciphertext: String,
}

/// A broker worker's X25519 key: made at start, never stored, zeroized on drop.
pub struct SealingKey {
    secret: StaticSecret,
    public: PublicKey,
}

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealingKey")
            .field("public", &self.public_base64())
            .finish_non_exhaustive()
    }
}

impl SealingKey {
    /// A fresh key from the operating system's generator (through `rand`'s
    /// thread generator, a CSPRNG seeded from it).
    pub fn generate() -> Self {
        let bytes = Zeroizing::new(rand::random::<[u8; 32]>());
        let secret = StaticSecret::from(*bytes);
        let public = PublicKey::from(&secret);
        SealingKey { secret, public }
    }

    /// The public key as marks carry it (`seal_key`).
    pub fn public_base64(&self) -> String {
        STANDARD.encode(self.public.as_bytes())
    }

    /// Opens credentials sealed to this key for `user_id`.
    pub fn open(
        &self,
        user_id: &str,
        sealed: &SealedCredentials,
    ) -> Result<Credentials, SealError> {
        if sealed.v != SEALED_VERSION {
            return Err(SealError::Malformed("v"));
        }
        let epk = parse_public_key(&sealed.epk).map_err(|_| SealError::Malformed("epk"))?;
        let nonce = STANDARD
            .decode(&sealed.nonce)
            .map_err(|_| SealError::Malformed("nonce"))?;
        let ciphertext = STANDARD
            .decode(&sealed.ciphertext)
            .map_err(|_| SealError::Malformed("ciphertext"))?;
        let shared = self.secret.diffie_hellman(&epk);
        if !shared.was_contributory() {
            return Err(SealError::WeakPublicKey);
        }
        let cipher = box_cipher(shared.as_bytes(), &epk, &self.public);
        Ok(credentials::open(&cipher, user_id, &nonce, &ciphertext)?)
    }
}

/// Seals `plaintext` (a credentials JSON object) for `user_id` to the worker
/// key `seal_key` (standard base64), with a one-time sender key.
pub fn seal_to(
    seal_key: &str,
    user_id: &str,
    plaintext: &[u8],
) -> Result<SealedCredentials, SealError> {
    let recipient = parse_public_key(seal_key)?;
    let sender = SealingKey::generate();
    let shared = sender.secret.diffie_hellman(&recipient);
    if !shared.was_contributory() {
        return Err(SealError::WeakPublicKey);
    }
    let cipher = box_cipher(shared.as_bytes(), &sender.public, &recipient);
    let (nonce, ciphertext) = credentials::seal(&cipher, user_id, plaintext)?;
    Ok(SealedCredentials {
        v: SEALED_VERSION,
        epk: sender.public_base64(),
        nonce: STANDARD.encode(nonce),
        ciphertext: STANDARD.encode(ciphertext),
    })
}

/// A public key from its standard base64 form.
pub fn parse_public_key(text: &str) -> Result<PublicKey, SealError> {
    let bytes: [u8; 32] = STANDARD
        .decode(text)
        .ok()
        .and_then(|raw| raw.try_into().ok())
        .ok_or(SealError::BadPublicKey)?;
    Ok(PublicKey::from(bytes))
}

/// The box's AES key: HKDF-SHA256 over the shared secret, salted with both
/// public keys (sender first) so a box is bound to exactly this pair.
fn box_cipher(shared: &[u8; 32], sender: &PublicKey, recipient: &PublicKey) -> Aes256Gcm {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(sender.as_bytes());
    salt[32..].copy_from_slice(recipient.as_bytes());
    let kdf = Hkdf::<Sha256>::new(Some(&salt), shared);
    let mut key = Zeroizing::new([0u8; 32]);
    kdf.expand(KDF_INFO, key.as_mut_slice())
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    Aes256Gcm::new_from_slice(key.as_slice()).expect("a 32-byte key")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = br#"{"api_key": "CANARY-sealed", "account_id": "A1"}"#;

    #[test]
    fn a_sealed_box_opens_with_its_key_for_its_user_only() {
        let worker = SealingKey::generate();
        let sealed = seal_to(&worker.public_base64(), "alice", SECRET).unwrap();
        let credentials = worker.open("alice", &sealed).unwrap();
        assert_eq!(
            credentials.get("api_key").unwrap().expose(),
            "CANARY-sealed"
        );
        // Another user's name (the associated data) or another worker's key: refused.
        assert_eq!(
            worker.open("bob", &sealed),
            Err(SealError::Cipher(CipherError::DoesNotDecrypt))
        );
        let other = SealingKey::generate();
        assert_eq!(
            other.open("alice", &sealed),
            Err(SealError::Cipher(CipherError::DoesNotDecrypt))
        );
        // A fresh sender key and nonce per seal.
        let again = seal_to(&worker.public_base64(), "alice", SECRET).unwrap();
        assert_ne!(again.epk, sealed.epk);
        assert!(!sealed.ciphertext.contains("CANARY"));
    }

    #[test]
    fn a_tampered_or_malformed_box_is_refused_without_echo() {
        let worker = SealingKey::generate();
        let mut sealed = seal_to(&worker.public_base64(), "alice", SECRET).unwrap();
        // A swapped sender key changes the derived key.
        sealed.epk = SealingKey::generate().public_base64();
        assert_eq!(
            worker.open("alice", &sealed),
            Err(SealError::Cipher(CipherError::DoesNotDecrypt))
        );
        sealed.epk = "not base64".into();
        assert_eq!(
            worker.open("alice", &sealed),
            Err(SealError::Malformed("epk"))
        );
        assert_eq!(
            seal_to("c2hvcnQ=", "alice", SECRET),
            Err(SealError::BadPublicKey)
        );
        // The all-zero point makes a known shared secret.
        assert_eq!(
            seal_to(&STANDARD.encode([0u8; 32]), "alice", SECRET),
            Err(SealError::WeakPublicKey)
        );
        assert!(!format!("{worker:?}").contains(&STANDARD.encode(worker.secret.as_bytes())));
    }
}
