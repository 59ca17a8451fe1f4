//! Credentials sealed to one broker worker: the worker holds an ephemeral
//! X25519 key for its lifetime and publishes the public half in its marks
//! (`seal_key`); the credential sealer ([`crate::sealer`]), which alone may
//! decrypt blobs, seals the user's credentials to that key. A worker thus
//! never holds anything that opens a stored blob, only what was sealed to it.
//!
//! The box is HPKE (RFC 9180, the `hpke` crate) in base mode:
//! DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM. Its `info` binds
//! the box to what it is for ([`SealContext`]: purpose, user, worker, claim),
//! so a box sealed for one worker, user, claim or purpose does not open as
//! another; the user id is also the associated data, as for a stored blob.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hpke::{Deserializable, OpModeR, OpModeS, Serializable};
use serde::{Deserialize, Serialize};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroizing;

use crate::credentials::{CipherError, Credentials};

type Kem = hpke::kem::X25519HkdfSha256;
type Kdf = hpke::kdf::HkdfSha256;
type Aead = hpke::aead::AesGcm256;

/// The sealed form's version (`v`): 2 is HPKE (1 was a hand-assembled
/// X25519 + HKDF + AES-GCM box).
pub const SEALED_VERSION: u64 = 2;

/// What a sealed box is for: the user's credentials, or the per-claim Redis
/// login that comes with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The user's broker credentials.
    Credentials,
    /// The worker's per-claim Redis login.
    RedisLogin,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Credentials => "credentials",
            Purpose::RedisLogin => "redis-login",
        }
    }
}

/// Everything a box is bound to (HPKE `info`): a box opened under any other
/// context does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealContext<'a> {
    /// What the box holds.
    pub purpose: Purpose,
    /// The user whose secret it is.
    pub user_id: &'a str,
    /// The worker it is sealed to.
    pub worker_id: &'a str,
    /// What the grant behind it was bound to: the claim id, or the
    /// cold-started task (a reload keeps the holder's first binding).
    pub claim: &'a str,
}

impl SealContext<'_> {
    /// HPKE's `info`: a label, then each field length-prefixed, so no two
    /// contexts share an encoding.
    fn info(&self) -> Vec<u8> {
        let mut info = b"leasehold seal v2".to_vec();
        for field in [
            self.purpose.label(),
            self.user_id,
            self.worker_id,
            self.claim,
        ] {
            let len = u16::try_from(field.len()).unwrap_or(u16::MAX);
            info.extend_from_slice(&len.to_be_bytes());
            info.extend_from_slice(field.as_bytes());
        }
        info
    }
}

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
    /// The box did not open: sealed to another key, user, worker or
    /// purpose, or tampered.
    #[error(transparent)]
    Cipher(#[from] CipherError),
}

/// Credentials sealed to one worker's key for one user (JSON on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedCredentials {
    /// [`SEALED_VERSION`].
    pub v: u64,
    /// HPKE's encapsulated key (standard base64, 32 bytes).
    pub enc: String,
    /// HPKE's ciphertext and tag of the credentials JSON (standard base64).
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

    /// Opens a box sealed to this key under `context`.
    pub fn open(
        &self,
        context: &SealContext<'_>,
        sealed: &SealedCredentials,
    ) -> Result<Credentials, SealError> {
        if sealed.v != SEALED_VERSION {
            return Err(SealError::Malformed("v"));
        }
        let enc = STANDARD
            .decode(&sealed.enc)
            .ok()
            .and_then(|raw| <Kem as hpke::Kem>::EncappedKey::from_bytes(&raw).ok())
            .ok_or(SealError::Malformed("enc"))?;
        let ciphertext = STANDARD
            .decode(&sealed.ciphertext)
            .map_err(|_| SealError::Malformed("ciphertext"))?;
        let secret = Zeroizing::new(self.secret.to_bytes());
        let private = <Kem as hpke::Kem>::PrivateKey::from_bytes(secret.as_slice())
            .map_err(|_| SealError::Cipher(CipherError::DoesNotDecrypt))?;
        let plaintext = hpke::single_shot_open::<Aead, Kdf, Kem>(
            &OpModeR::Base,
            &private,
            &enc,
            &context.info(),
            &ciphertext,
            context.user_id.as_bytes(),
        )
        .map(Zeroizing::new)
        .map_err(|_| SealError::Cipher(CipherError::DoesNotDecrypt))?;
        Ok(Credentials::from_json(&plaintext)?)
    }
}

/// Seals `plaintext` (a JSON object of strings) to the worker key `seal_key`
/// (standard base64) under `context`, with a fresh encapsulation per seal.
pub fn seal_to(
    seal_key: &str,
    context: &SealContext<'_>,
    plaintext: &[u8],
) -> Result<SealedCredentials, SealError> {
    let recipient = parse_public_key(seal_key)?;
    if recipient.as_bytes().iter().all(|b| *b == 0) {
        return Err(SealError::WeakPublicKey);
    }
    let recipient = <Kem as hpke::Kem>::PublicKey::from_bytes(recipient.as_bytes())
        .map_err(|_| SealError::BadPublicKey)?;
    // A low-order recipient key makes the DH output all zero, which HPKE's
    // encapsulation refuses.
    let (enc, ciphertext) = hpke::single_shot_seal::<Aead, Kdf, Kem>(
        &OpModeS::Base,
        &recipient,
        &context.info(),
        plaintext,
        context.user_id.as_bytes(),
    )
    .map_err(|err| match err {
        hpke::HpkeError::EncapError => SealError::WeakPublicKey,
        _ => SealError::Cipher(CipherError::Encrypt),
    })?;
    Ok(SealedCredentials {
        v: SEALED_VERSION,
        enc: STANDARD.encode(enc.to_bytes()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = br#"{"api_key": "CANARY-sealed", "account_id": "A1"}"#;

    fn for_alice(worker_id: &str) -> SealContext<'_> {
        SealContext {
            purpose: Purpose::Credentials,
            user_id: "alice",
            worker_id,
            claim: "claim-1",
        }
    }

    #[test]
    fn a_sealed_box_opens_with_its_key_for_its_user_worker_and_purpose_only() {
        let worker = SealingKey::generate();
        let context = for_alice("w1");
        let sealed = seal_to(&worker.public_base64(), &context, SECRET).unwrap();
        let credentials = worker.open(&context, &sealed).unwrap();
        assert_eq!(
            credentials.get("api_key").unwrap().expose(),
            "CANARY-sealed"
        );
        let refused = Err(SealError::Cipher(CipherError::DoesNotDecrypt));
        // Another user, worker or purpose in the context, or another key.
        for other in [
            SealContext {
                user_id: "bob",
                ..context
            },
            SealContext {
                worker_id: "w2",
                ..context
            },
            SealContext {
                purpose: Purpose::RedisLogin,
                ..context
            },
            SealContext {
                claim: "claim-2",
                ..context
            },
        ] {
            assert_eq!(worker.open(&other, &sealed), refused, "{other:?}");
        }
        assert_eq!(SealingKey::generate().open(&context, &sealed), refused);
        // A fresh encapsulation per seal.
        let again = seal_to(&worker.public_base64(), &context, SECRET).unwrap();
        assert_ne!(again.enc, sealed.enc);
        assert!(!sealed.ciphertext.contains("CANARY"));
    }

    #[test]
    fn a_tampered_or_malformed_box_is_refused_without_echo() {
        let worker = SealingKey::generate();
        let context = for_alice("w1");
        let mut sealed = seal_to(&worker.public_base64(), &context, SECRET).unwrap();
        // Another encapsulated key derives another key.
        sealed.enc = SealingKey::generate().public_base64();
        assert_eq!(
            worker.open(&context, &sealed),
            Err(SealError::Cipher(CipherError::DoesNotDecrypt))
        );
        sealed.enc = "not base64".into();
        assert_eq!(
            worker.open(&context, &sealed),
            Err(SealError::Malformed("enc"))
        );
        assert_eq!(
            seal_to("c2hvcnQ=", &context, SECRET),
            Err(SealError::BadPublicKey)
        );
        // The all-zero point makes a known shared secret.
        assert_eq!(
            seal_to(&STANDARD.encode([0u8; 32]), &context, SECRET),
            Err(SealError::WeakPublicKey)
        );
        assert!(!format!("{worker:?}").contains(&STANDARD.encode(worker.secret.as_bytes())));
    }
}
