//! The claim step of a pool worker: check a taken claim, obtain the user's
//! credentials (from the sealer or by decrypting), log in as the claim's own
//! Redis user, and settle the claim on the bus, or reject it. The lifecycle
//! in the parent module calls it; apart because it is the one step where a
//! worker becomes a user's.

use std::sync::Arc;
use std::time::Duration;

use leasehold_platform::backoff::Backoff;
use leasehold_pool::keys;
use leasehold_pool::state::PoolState;
use leasehold_telemetry::{ClaimResult, PoolWorkerStateKind, TelemetryEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::credentials::{CipherError, Credentials};
use crate::sealer::{SealAsk, Unsealed};
use leasehold_pool::bus::redis::RedisPoolBus;
use leasehold_pool::bus::{BusError, ClaimSettle, Settled};
use leasehold_pool::claim_users::{RedisLogin, login_url};
use leasehold_pool::protocol::{self, ClaimMessage, ClaimOutcome};

use super::{
    ALREADY_SERVED, BrokerWorker, Claimed, TRANSIENT_CREDENTIALS_PAUSE, WorkerError, WorkerExit,
    now_ms,
};

impl BrokerWorker {
    /// Moves the bus onto the per-claim Redis user the sealer made: from here
    /// on this worker reaches only its user's keys. A login that does not
    /// work gives the user back and ends the worker (the pool-wide user may
    /// not reach the user's queues at all).
    pub(super) async fn log_in_as_claim_user(
        &mut self,
        user_id: &str,
        login: &RedisLogin,
    ) -> Result<(), WorkerError> {
        let Some(base) = &self.claim_redis_url else {
            tracing::debug!(
                user_id,
                "a claim login from the sealer, but the bus is not Redis"
            );
            return Ok(());
        };
        let bus = match login_url(base.expose(), login) {
            Ok(url) => RedisPoolBus::connect(&url).await,
            Err(err) => Err(err),
        };
        match bus {
            Ok(bus) => {
                tracing::info!(
                    user_id,
                    redis_user = login.user,
                    "serving as the per-claim Redis user"
                );
                self.bus = Arc::new(bus);
                Ok(())
            }
            Err(err) => {
                self.give_user_back(user_id).await;
                Err(WorkerError::Bus(err))
            }
        }
    }

    /// Releases a user this worker claimed but cannot serve (no credentials,
    /// no login), so the next claim need not wait for the mark to expire.
    pub(super) async fn give_user_back(&self, user_id: &str) {
        if let Err(err) = self
            .bus
            .release_user_mark(user_id, &self.config.worker_id)
            .await
        {
            tracing::warn!(user_id, error = %err, "cannot give the user back; the mark expires");
        }
    }

    /// The claim step for a parsed claim; `true` when this worker now holds
    /// the user. A Redis error leaves the outcome unknown (the script may have
    /// run), so it is never taken for a failure: the step is repeated (it
    /// only acts while the claim is in this worker's list), and when the
    /// claim has left the list the user's mark says whether it is this
    /// worker's. Stopping meanwhile leaves the claim in the list, where the
    /// re-queue of a dead worker's claims finds it.
    pub(super) async fn settle_claim(
        &mut self,
        claim: &ClaimMessage,
        raw: &[u8],
        shutdown: &CancellationToken,
    ) -> bool {
        let worker_id = self.config.worker_id.clone();
        let value = self.mark(&claim.user_id).to_json();
        let claimed = ClaimOutcome::claimed(&worker_id).to_json();
        let refused = ClaimOutcome::failed(&worker_id, ALREADY_SERVED).to_json();
        let settle = ClaimSettle {
            raw,
            claim_id: &claim.claim_id,
            claimed: &claimed,
            refused: &refused,
        };
        let retry = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        };
        let mut attempt = 0;
        loop {
            let settled = self
                .bus
                .settle_claim(&self.mark_write(&claim.user_id, &value), &settle)
                .await;
            let problem = match settled {
                Ok(Settled::Claimed) => return true,
                Ok(Settled::Refused) => {
                    self.claim_event(Some(&claim.user_id), ClaimResult::Error, ALREADY_SERVED);
                    return false;
                }
                Ok(Settled::NotHeld) => match self.bus.user_mark(&claim.user_id).await {
                    Ok(mark) => {
                        let mine = mark.is_some_and(|mark| mark.worker_id == worker_id);
                        if !mine {
                            tracing::info!(
                                user_id = claim.user_id,
                                claim_id = claim.claim_id,
                                "claim left this worker's list without this worker taking the user; back to the pool"
                            );
                        }
                        return mine;
                    }
                    Err(err) => err,
                },
                Err(err) => err,
            };
            tracing::warn!(user_id = claim.user_id, claim_id = claim.claim_id, error = %problem, "claim outcome unknown; asking the pool bus again");
            attempt += 1;
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(retry.delay(attempt)) => {}
            }
        }
    }

    /// Parses and decrypts a claim; a bad one is dead-lettered with a
    /// `failed` outcome (when its claim id is readable) and `None` returned.
    pub(super) async fn check_claim(
        &mut self,
        raw: &[u8],
    ) -> Option<(ClaimMessage, Credentials, Option<RedisLogin>)> {
        if raw.len() > self.config.bounds.max_bytes {
            // Never parsed: the claim id, if plain, is read from the head.
            let head = &raw[..raw.len().min(protocol::DEAD_LETTER_HEAD_BYTES)];
            let claim_id = protocol::sniff_id(head, "claim_id");
            tracing::warn!(
                length = raw.len(),
                max = self.config.bounds.max_bytes,
                "a claim over REQUEST_MAX_BYTES is dead-lettered unparsed"
            );
            self.reject_claim(
                raw,
                claim_id.as_deref(),
                None,
                ClaimResult::Invalid,
                protocol::dead_reason::TOO_LARGE,
            )
            .await;
            return None;
        }
        let body = String::from_utf8_lossy(raw);
        let claim = match protocol::parse_claim(&body) {
            Ok(claim) => claim,
            Err(err) => {
                let claim_id = protocol::claim_id_of(&body);
                self.reject_claim(
                    raw,
                    claim_id.as_deref(),
                    None,
                    ClaimResult::Invalid,
                    &format!("invalid claim: {err}"),
                )
                .await;
                return None;
            }
        };
        let credentials = match &self.sealer {
            // The sealer reads the stored blob; the one in the claim is not
            // needed (and this worker could not open it).
            Some(sealer) => {
                self.sealed_binding = claim.claim_id.clone();
                sealer
                    .fetch(&self.seal_ask(&claim.user_id))
                    .await
                    .map(|unsealed| (unsealed.credentials, unsealed.redis_login))
            }
            None => self
                .cipher
                .decrypt(&claim.user_id, &claim.encrypted_credentials)
                .await
                .map(|credentials| (credentials, None)),
        };
        match credentials {
            Ok((credentials, login)) => Some((claim, credentials, login)),
            Err(err) if err.is_transient() => {
                // KMS throttled or unreachable: the claim is fine, so it goes
                // back first in line rather than failing for good; this
                // worker waits before it takes one again.
                tracing::warn!(user_id = claim.user_id, error = %err, "credentials cannot be decrypted now; the claim is put back");
                if let Err(err) = self.bus.return_claim(&self.config.worker_id, raw).await {
                    tracing::warn!(error = %err, "cannot put the claim back; it is taken again from this worker's list");
                }
                tokio::time::sleep(TRANSIENT_CREDENTIALS_PAUSE).await;
                None
            }
            Err(err) => {
                self.reject_claim(
                    raw,
                    Some(&claim.claim_id),
                    Some(&claim.user_id),
                    ClaimResult::Invalid,
                    &err.to_string(),
                )
                .await;
                None
            }
        }
    }

    pub(super) fn claim_event(&self, user_id: Option<&str>, result: ClaimResult, reason: &str) {
        self.telemetry.emit(TelemetryEvent::PoolClaim {
            worker_id: self.config.worker_id.clone(),
            user_id: user_id.map(str::to_owned),
            result,
            duration: Duration::ZERO,
            reason: Some(reason.to_owned()),
        });
    }

    pub(super) async fn reject_claim(
        &mut self,
        raw: &[u8],
        claim_id: Option<&str>,
        user_id: Option<&str>,
        result: ClaimResult,
        reason: &str,
    ) {
        self.claim_event(user_id, result, reason);
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue: keys::POOL_CLAIMS.to_owned(),
            reason: reason.to_owned(),
        });
        let outcome = ClaimOutcome::failed(&self.config.worker_id, reason).to_json();
        let failed = self
            .bus
            .fail_claim(
                &self.config.worker_id,
                raw,
                claim_id.map(|id| (id, outcome.as_str())),
                reason,
                now_ms(),
            )
            .await;
        if let Err(err) = failed {
            // Still in this worker's list: handed out again by the next take.
            tracing::error!(queue = keys::dead_letter(keys::POOL_CLAIMS), error = %err, "cannot dead-letter a claim; retrying with the next take");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub(super) async fn dead_letter(&mut self, list: &str, reason: &str, body: &str) {
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue: list.to_owned(),
            reason: reason.to_owned(),
        });
        let pushed = self.bus.dead_letter(list, reason, body, now_ms()).await;
        if let Err(err) = pushed {
            let dead = keys::dead_letter(list);
            tracing::error!(queue = dead, error = %err, "cannot dead-letter a message; it is dropped");
        }
    }

    /// What this worker asks the sealer for `user_id`.
    fn seal_ask<'a>(&'a self, user_id: &'a str) -> SealAsk<'a> {
        SealAsk {
            user_id,
            worker_id: &self.config.worker_id,
            task_id: &self.config.task_id,
            binding: &self.sealed_binding,
            mark_ttl: self.config.mark_ttl,
        }
    }

    /// The exclusive claim script (cold start): true when this worker now holds the user.
    pub(super) async fn claim(&mut self, user_id: &str) -> Result<bool, BusError> {
        let value = self.mark(user_id).to_json();
        self.bus.claim_user(&self.mark_write(user_id, &value)).await
    }

    pub(super) async fn load_credentials(
        &mut self,
        user_id: &str,
    ) -> Result<Credentials, WorkerError> {
        Ok(self.obtain_credentials(user_id).await?.credentials)
    }

    /// The user's credentials (and, from a sealer, maybe a per-claim Redis
    /// login): sealed to this worker, or decrypted from the stored blob.
    pub(super) async fn obtain_credentials(
        &mut self,
        user_id: &str,
    ) -> Result<Unsealed, WorkerError> {
        let problem = |problem: String| WorkerError::Credentials {
            user_id: user_id.to_owned(),
            problem,
        };
        if let Some(sealer) = &self.sealer {
            return sealer
                .fetch(&self.seal_ask(user_id))
                .await
                .map_err(|err| problem(err.to_string()));
        }
        let blob = self.bus.credentials(user_id).await?;
        let blob =
            blob.ok_or_else(|| problem(format!("{} is not set", keys::credentials(user_id))))?;
        let credentials = self
            .cipher
            .decrypt(user_id, &blob)
            .await
            .map_err(|err: CipherError| problem(err.to_string()))?;
        Ok(Unsealed {
            credentials,
            redis_login: None,
        })
    }

    /// Cold start (`USER_ID` set). Without a sealer: read the credentials,
    /// then claim; while another worker holds the user, retry for one mark
    /// TTL (it may be dying). With a sealer, the sealer's assign step is the
    /// claim (it sets the user's mark for this worker, bound to this task's
    /// grant): ask it until it answers, for as long, then take the user on
    /// the bus (the mark is already this worker's).
    pub(super) async fn cold_start(
        &mut self,
        user_id: &str,
        shutdown: &CancellationToken,
    ) -> Result<Result<Claimed, WorkerExit>, WorkerError> {
        let give_up = Instant::now() + self.config.mark_ttl + self.config.heartbeat;
        let mut decrypted = match self.sealer {
            Some(_) => None,
            None => Some(self.obtain_credentials(user_id).await?),
        };
        loop {
            let ready = match &self.sealer {
                None => true,
                Some(sealer) => {
                    self.sealed_binding = self.config.task_id.clone();
                    match sealer.fetch(&self.seal_ask(user_id)).await {
                        Ok(unsealed) => {
                            decrypted = Some(unsealed);
                            true
                        }
                        // No grant yet (the launcher writes it once the task
                        // exists), another holder (it may be dying), or the
                        // sealer is briefly away: ask again.
                        Err(CipherError::SealerRefused {
                            status: 403,
                            reason,
                        })
                        | Err(CipherError::SealerUnavailable(reason)) => {
                            tracing::info!(
                                user_id,
                                reason,
                                "the sealer did not assign the user yet"
                            );
                            false
                        }
                        Err(err) => {
                            return Err(WorkerError::Credentials {
                                user_id: user_id.to_owned(),
                                problem: err.to_string(),
                            });
                        }
                    }
                }
            };
            if ready
                && self.claim(user_id).await?
                && let Some(unsealed) = decrypted
            {
                self.state(PoolWorkerStateKind::Claimed, Some(user_id));
                return Ok(Ok(Claimed {
                    user_id: user_id.to_owned(),
                    credentials: unsealed.credentials,
                    redis_login: unsealed.redis_login,
                }));
            }
            if Instant::now() >= give_up {
                tracing::warn!(user_id, "user already has an active worker; exiting");
                return Ok(Err(WorkerExit::AlreadyServed));
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(Err(WorkerExit::Signal)),
                _ = tokio::time::sleep(self.config.heartbeat) => {}
            }
        }
    }
}
