//! `credentials rotate`: every stored blob moved to the configured KMS key,
//! one at a time. A version 2 blob only has its data key re-wrapped by KMS
//! (`ReEncrypt`: no data key or plaintext in this process); a version 1 blob
//! is migrated through the local key ([`Keyring::rotate`]). Each blob is
//! replaced by compare-and-set, so a `put` that lands meanwhile wins, and a
//! user with an active worker is sent `reload_credentials`.

use leasehold_pool::bus::{BusError, PoolBus};
use leasehold_pool::keys;
use leasehold_pool::state::PoolState;

use crate::credentials::{CipherError, Keyring, Rewrapped};

/// What one rotation pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RotationReport {
    /// `credentials:*` keys found.
    pub found: usize,
    /// Blobs now under the configured key.
    pub rotated: usize,
    /// Of those, version 1 blobs migrated through the local key.
    pub migrated: usize,
    /// Active workers sent `reload_credentials`.
    pub reloaded: usize,
    /// Keys changed or deleted while being rotated (left as they are).
    pub changed: Vec<String>,
    /// Keys not rotated, with why (no secret in the text).
    pub failed: Vec<(String, String)>,
}

impl RotationReport {
    /// What `credentials rotate` prints: each blob left alone or not rotated,
    /// then one summary line.
    pub fn lines(&self) -> Vec<String> {
        let changed = self
            .changed
            .iter()
            .map(|name| format!("{name}: changed while rotating; left as it is"));
        let failed = self
            .failed
            .iter()
            .map(|(name, err)| format!("{name}: not rotated: {err}"));
        let summary = format!(
            "rotated {} of {} blobs ({} from the local key); reload_credentials sent to {} active workers; {} changed meanwhile; {} failed",
            self.rotated,
            self.found,
            self.migrated,
            self.reloaded,
            self.changed.len(),
            self.failed.len()
        );
        changed.chain(failed).chain([summary]).collect()
    }
}

/// Why one blob was not rotated.
#[derive(Debug, thiserror::Error)]
enum BlobError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Cipher(#[from] CipherError),
}

/// Why the pass could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// The keys could not be listed.
    #[error("cannot list credentials keys: {0}")]
    List(BusError),
}

/// How one blob ended.
enum Rotated {
    Done { reloaded: bool, migrated: bool },
    Changed,
}

/// Rotates every `credentials:*` blob; a blob that fails is reported and
/// the pass goes on.
pub async fn rotate_all(
    bus: &dyn PoolBus,
    keyring: &Keyring,
) -> Result<RotationReport, RotationError> {
    let users = bus
        .users_with_credentials()
        .await
        .map_err(RotationError::List)?;
    let mut report = RotationReport {
        found: users.len(),
        ..RotationReport::default()
    };
    for user_id in users {
        // The report names blobs by key, as the operator finds them in Redis.
        let name = keys::credentials(&user_id);
        match rotate_one(bus, keyring, &user_id).await {
            Ok(Rotated::Done { reloaded, migrated }) => {
                report.rotated += 1;
                report.migrated += usize::from(migrated);
                report.reloaded += usize::from(reloaded);
            }
            Ok(Rotated::Changed) => report.changed.push(name),
            Err(err) => report.failed.push((name, err.to_string())),
        }
    }
    Ok(report)
}

async fn rotate_one(
    bus: &dyn PoolBus,
    keyring: &Keyring,
    user_id: &str,
) -> Result<Rotated, BlobError> {
    let Some(blob) = bus.credentials(user_id).await? else {
        return Ok(Rotated::Changed);
    };
    let rotated = keyring.rotate(user_id, &blob).await?;
    if !bus
        .replace_credentials(user_id, &blob, rotated.blob())
        .await?
    {
        return Ok(Rotated::Changed);
    }
    // The worker asks the sealer for the new blob's credentials, with a
    // fresh reload grant.
    let reloaded = crate::manager::reload_credentials(bus, user_id).await?;
    Ok(Rotated::Done {
        reloaded,
        migrated: matches!(rotated, Rewrapped::Migrated(_)),
    })
}

#[cfg(test)]
mod tests {
    use leasehold_pool::bus::memory::MemoryPoolBus;

    use super::*;
    use crate::credentials::AesGcmCipher;
    use leasehold_pool::bus::CredentialBus;

    #[tokio::test]
    async fn a_blob_that_cannot_be_rotated_is_reported_and_the_pass_goes_on() {
        let bus = MemoryPoolBus::new();
        let local = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
        for user in ["alice", "bob"] {
            let blob = local.encrypt(user, br#"{"api_key": "k"}"#).unwrap();
            bus.put_credentials(user, &blob).await.unwrap();
        }
        // No KMS key to rotate to: each blob fails on its own, nothing is written.
        let keyring = Keyring {
            local: Some(local),
            kms: None,
        };
        let before = bus.credentials("alice").await.unwrap();
        let report = rotate_all(&bus, &keyring).await.unwrap();
        assert_eq!(report.found, 2);
        assert_eq!(report.rotated, 0);
        let failed: Vec<&str> = report.failed.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            failed,
            [keys::credentials("alice"), keys::credentials("bob")]
        );
        assert!(
            report.failed[0].1.contains("CREDENTIALS_KMS_KEY_ID"),
            "{report:?}"
        );
        assert_eq!(bus.credentials("alice").await.unwrap(), before);
    }
}
