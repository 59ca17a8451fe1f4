//! The claimed loop: control messages and requests of one user, answered once.

use std::sync::Arc;
use std::time::Duration;

use leasehold_pool::bus::UserMessage;
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, Action, ControlMessage, Response};
use leasehold_telemetry::{RequestResult, TelemetryEvent, TelemetrySink};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BrokerWorker, Claimed, Due, Handled, Schedule, WorkerError, WorkerExit};
use crate::connections::{ConnectError, ConnectionCache};
use crate::paper::BrokerError;

impl BrokerWorker {
    /// The claimed loop.
    pub(super) async fn serve(
        &mut self,
        mut claimed: Claimed,
        cache: &mut ConnectionCache,
        stop: &CancellationToken,
        shutdown: &CancellationToken,
        lost: &CancellationToken,
    ) -> Result<WorkerExit, WorkerError> {
        let user_id = claimed.user_id.clone();
        let mut schedule = Schedule::new(
            Instant::now(),
            self.config.idle_timeout,
            self.config.health_check,
        );
        loop {
            if lost.is_cancelled() {
                return Ok(WorkerExit::Lost);
            }
            if shutdown.is_cancelled() {
                return Ok(WorkerExit::Signal);
            }
            let wait = match schedule.due(Instant::now()) {
                Due::IdleTimeout => {
                    tracing::info!(user_id, "idle timeout; closing connections");
                    return Ok(WorkerExit::IdleTimeout);
                }
                Due::HealthCheck => {
                    cache.health_check().await;
                    schedule.health_checked(Instant::now());
                    continue;
                }
                Due::Wait(wait) => wait.min(self.config.block),
            };
            let popped = self.bus.pop_user_message(&user_id, wait, stop).await;
            let message = match popped {
                Ok(Some(message)) => message,
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(user_id, error = %err, "pop of requests and control messages failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            schedule.activity(Instant::now());
            let handled = match message {
                UserMessage::Control(body) => self.control(&mut claimed, cache, &body).await,
                UserMessage::Request(body) => self.request(&claimed, cache, &body).await?,
            };
            if let Handled::Exit(exit) = handled {
                return Ok(exit);
            }
        }
    }

    async fn control(
        &mut self,
        claimed: &mut Claimed,
        cache: &mut ConnectionCache,
        body: &str,
    ) -> Handled {
        let control_key = keys::worker_control(&claimed.user_id);
        match protocol::parse_control(body) {
            Ok(ControlMessage::Shutdown) => {
                tracing::info!(
                    user_id = claimed.user_id,
                    "shutdown requested by control message"
                );
                Handled::Exit(WorkerExit::ControlShutdown)
            }
            Ok(ControlMessage::ReloadCredentials) => {
                match self.load_credentials(&claimed.user_id.clone()).await {
                    Ok(credentials) => {
                        claimed.credentials = credentials;
                        cache.close_all("reload_credentials").await;
                        tracing::info!(
                            user_id = claimed.user_id,
                            "credentials reloaded; connections reopen on next use"
                        );
                    }
                    Err(err) => {
                        // Keep serving with the credentials that work.
                        self.dead_letter(&control_key, &format!("reload failed: {err}"), body)
                            .await;
                    }
                }
                Handled::Continue
            }
            Err(err) => {
                self.dead_letter(
                    &control_key,
                    &format!("invalid control message: {err}"),
                    body,
                )
                .await;
                Handled::Continue
            }
        }
    }

    async fn respond(&mut self, response: &Response) {
        let written = self
            .bus
            .put_response(&response.request_id, &response.to_json())
            .await;
        if let Err(err) = written {
            tracing::error!(request_id = response.request_id, error = %err, "cannot write the response");
        }
    }

    /// Handles one request; only exhausted broker connects are fatal (after the
    /// request is answered).
    async fn request(
        &mut self,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
        body: &str,
    ) -> Result<Handled, WorkerError> {
        let started = Instant::now();
        let user_id = claimed.user_id.clone();
        let report = |telemetry: &Arc<dyn TelemetrySink>, request_id: Option<&str>, result| {
            telemetry.emit(TelemetryEvent::BrokerRequest {
                user_id: user_id.clone(),
                request_id: request_id.map(str::to_owned),
                result,
                duration: started.elapsed(),
            });
        };
        let request = match protocol::parse_request(body) {
            Ok(request) => request,
            Err(invalid) => {
                let reason = format!("invalid request: {}", invalid.error);
                self.dead_letter(&keys::user_requests(&user_id), &reason, body)
                    .await;
                if let Some(request_id) = &invalid.request_id {
                    self.respond(&Response::error(request_id, &reason)).await;
                }
                report(
                    &self.telemetry,
                    invalid.request_id.as_deref(),
                    RequestResult::Invalid,
                );
                return Ok(Handled::Continue);
            }
        };
        let taken = self
            .bus
            .take_request(&request.request_id, &self.config.worker_id)
            .await?;
        if !taken {
            tracing::warn!(
                user_id,
                request_id = request.request_id,
                "request id already taken; not executed again"
            );
            report(
                &self.telemetry,
                Some(&request.request_id),
                RequestResult::Duplicate,
            );
            return Ok(Handled::Continue);
        }
        let Action::PlaceOrder(order) = &request.action;
        let outcome = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection.place_order(order).await.map_err(Some),
            Err(ConnectError::UnknownBroker(name)) => {
                self.respond(&Response::error(
                    &request.request_id,
                    format!("unknown broker {name:?}"),
                ))
                .await;
                report(
                    &self.telemetry,
                    Some(&request.request_id),
                    RequestResult::Error,
                );
                return Ok(Handled::Continue);
            }
            Err(err) => {
                self.respond(&Response::error(&request.request_id, err.to_string()))
                    .await;
                report(
                    &self.telemetry,
                    Some(&request.request_id),
                    RequestResult::Error,
                );
                return Err(err.into());
            }
        };
        match outcome {
            Ok(result) => {
                self.respond(&Response::ok(&request.request_id, result))
                    .await;
                report(
                    &self.telemetry,
                    Some(&request.request_id),
                    RequestResult::Ok,
                );
            }
            Err(err) => {
                if matches!(err, Some(BrokerError::Connection(_))) {
                    cache.invalidate(&request.account).await;
                }
                let message = err.map(|e| e.to_string()).unwrap_or_default();
                self.respond(&Response::error(&request.request_id, message))
                    .await;
                report(
                    &self.telemetry,
                    Some(&request.request_id),
                    RequestResult::Error,
                );
            }
        }
        Ok(Handled::Continue)
    }
}
