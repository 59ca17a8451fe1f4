//! The claimed loop: control messages first, then the user's requests oldest
//! first, each with exactly one final response.
//!
//! A request waits in the user's processing list until its final response is
//! stored, which removes it in the same bus step: a worker that dies
//! mid-request leaves it to its successor. Before the broker call the
//! request's record says `executing`; whoever finds it `executing` does not
//! know whether the order reached the broker, so it asks the broker by client
//! order id (= request id) and never sends it blindly again. A Redis error
//! leaves the request where it is, to be retried after a jittered backoff.

use std::time::Duration;

use leasehold_platform::backoff::Backoff;
use leasehold_pool::bus::{Answer, AnswerMode, Begun, BusError, UserMessage};
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, Action, ControlMessage, ErrorCode, Request, Response};
use leasehold_telemetry::{RequestResult, TelemetryEvent};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BrokerWorker, Claimed, Due, Handled, Schedule, WorkerError, WorkerExit, now_ms};
use crate::connections::{ConnectError, ConnectionCache};
use crate::paper::BrokerError;

/// Retries of a failed pop or bus step: quick at first (a blip), bounded (an
/// outage), jittered (many workers lose Redis at once).
const RETRY: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_secs(5),
};

/// Why a request was left in the processing list unanswered.
enum Unfinished {
    /// The bus failed; nothing is lost, the request is tried again.
    Bus(BusError),
    /// The worker is stopping; its successor finishes the request.
    Stopped,
    /// Answered, but the worker must exit non-zero (broker unreachable).
    Fatal(WorkerError),
}

/// What a request came to: its final response, how it is counted, and whether
/// the worker must give up afterwards.
struct Outcome {
    response: Response,
    result: RequestResult,
    fatal: Option<WorkerError>,
}

impl Outcome {
    fn ok(request_id: &str, result: Value) -> Self {
        Outcome {
            response: Response::ok(request_id, result),
            result: RequestResult::Ok,
            fatal: None,
        }
    }

    fn error(request_id: &str, code: ErrorCode, error: impl Into<String>) -> Self {
        Outcome {
            response: Response::error(request_id, code, error),
            result: match code {
                ErrorCode::InDoubt => RequestResult::InDoubt,
                ErrorCode::Expired => RequestResult::Expired,
                _ => RequestResult::Error,
            },
            fatal: None,
        }
    }

    fn in_doubt(request_id: &str, why: impl std::fmt::Display) -> Self {
        Outcome::error(
            request_id,
            ErrorCode::InDoubt,
            format!(
                "{why}; the order may have been executed: look it up at the broker by its \
                 client order id (the request id) before sending it again"
            ),
        )
    }

    fn fatal(mut self, err: impl Into<WorkerError>) -> Self {
        self.fatal = Some(err.into());
        self
    }
}

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
        let mut retries = 0;
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
                    pause(&mut retries, stop).await;
                    continue;
                }
            };
            schedule.activity(Instant::now());
            let handled = match message {
                UserMessage::Control(body) => {
                    // Control bodies are plain JSON; bytes that are not UTF-8
                    // fail to parse and are dead-lettered as such.
                    let body = String::from_utf8_lossy(&body);
                    self.control(&mut claimed, cache, &body).await
                }
                UserMessage::Request(raw) => {
                    match self.request(&claimed, cache, &raw, stop).await {
                        Ok(handled) => handled,
                        Err(Unfinished::Bus(err)) => {
                            tracing::warn!(user_id, error = %err, "pool bus failed mid-request; the request stays in processing and is retried");
                            pause(&mut retries, stop).await;
                            continue;
                        }
                        Err(Unfinished::Stopped) => continue,
                        Err(Unfinished::Fatal(err)) => return Err(err),
                    }
                }
            };
            retries = 0;
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

    fn report(
        &self,
        user_id: &str,
        request_id: Option<&str>,
        result: RequestResult,
        since: Instant,
    ) {
        self.telemetry.emit(TelemetryEvent::BrokerRequest {
            user_id: user_id.to_owned(),
            request_id: request_id.map(str::to_owned),
            result,
            duration: since.elapsed(),
        });
    }

    fn report_dead_letter(&self, user_id: &str, reason: &str) {
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue: keys::user_requests(user_id),
            reason: reason.to_owned(),
        });
    }

    /// Stores a request's final step, retrying bus failures until it holds or
    /// the worker stops (then the request stays in processing for the next).
    async fn answer(
        &self,
        answer: &Answer<'_>,
        stop: &CancellationToken,
    ) -> Result<bool, Unfinished> {
        let mut retries = 0;
        loop {
            match self.bus.answer_request(answer).await {
                Ok(answered) => return Ok(answered),
                Err(err) => {
                    tracing::warn!(user_id = answer.user_id, request_id = answer.request_id, error = %err,
                        "cannot store the response; retrying (the request stays in processing)");
                }
            }
            if !pause(&mut retries, stop).await {
                return Err(Unfinished::Stopped);
            }
        }
    }

    /// Dead-letters a request that cannot be answered and takes it out of
    /// processing, retrying like [`BrokerWorker::answer`].
    async fn drop_request(
        &self,
        user_id: &str,
        raw: &[u8],
        reason: &str,
        stop: &CancellationToken,
    ) -> Result<(), Unfinished> {
        self.report_dead_letter(user_id, reason);
        let mut retries = 0;
        loop {
            match self.bus.drop_request(user_id, raw, reason, now_ms()).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    tracing::warn!(user_id, error = %err, "cannot dead-letter a request; retrying (it stays in processing)");
                }
            }
            if !pause(&mut retries, stop).await {
                return Err(Unfinished::Stopped);
            }
        }
    }

    /// Handles the oldest request in processing: exactly one final response,
    /// at most one execution.
    async fn request(
        &mut self,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
        raw: &[u8],
        stop: &CancellationToken,
    ) -> Result<Handled, Unfinished> {
        let started = Instant::now();
        let user_id = claimed.user_id.as_str();
        let Ok(text) = std::str::from_utf8(raw) else {
            self.drop_request(user_id, raw, "invalid request: not UTF-8", stop)
                .await?;
            self.report(user_id, None, RequestResult::Invalid, started);
            return Ok(Handled::Continue);
        };
        let request = match protocol::parse_request(text) {
            Ok(request) => request,
            Err(invalid) => {
                let reason = format!("invalid request: {}", invalid.error);
                match invalid.request_id.as_deref() {
                    None => self.drop_request(user_id, raw, &reason, stop).await?,
                    Some(request_id) => {
                        self.report_dead_letter(user_id, &reason);
                        let response =
                            Response::error(request_id, ErrorCode::Invalid, &reason).to_json();
                        let answered = self
                            .answer(
                                &Answer {
                                    user_id,
                                    raw,
                                    request_id,
                                    response: &response,
                                    // The id may be a real request's: never overwrite its answer.
                                    mode: AnswerMode::FirstOnly,
                                    dead_letter: Some((&reason, now_ms())),
                                },
                                stop,
                            )
                            .await?;
                        if !answered {
                            tracing::warn!(
                                user_id,
                                request_id,
                                "an invalid message reuses a known request id; dead-lettered, the request's own response is kept"
                            );
                        }
                    }
                }
                self.report(
                    user_id,
                    invalid.request_id.as_deref(),
                    RequestResult::Invalid,
                    started,
                );
                return Ok(Handled::Continue);
            }
        };
        let request_id = request.request_id.as_str();
        let begun = self
            .bus
            .begin_request(request_id, user_id, &self.config.worker_id, now_ms())
            .await
            .map_err(Unfinished::Bus)?;
        let outcome = match begun {
            Begun::Done { response } => {
                tracing::info!(
                    user_id,
                    request_id,
                    "repeated request id; answered with its stored response, not executed again"
                );
                let replay = Answer {
                    user_id,
                    raw,
                    request_id,
                    response: &response,
                    mode: AnswerMode::Replay,
                    dead_letter: None,
                };
                self.answer(&replay, stop).await?;
                self.report(user_id, Some(request_id), RequestResult::Duplicate, started);
                return Ok(Handled::Continue);
            }
            Begun::Executing { user_id: owner, .. } if owner != user_id => {
                // Another user's request holds this id; answering would
                // overwrite that request's response.
                self.drop_request(
                    user_id,
                    raw,
                    "request id is in use by another user's request; not executed",
                    stop,
                )
                .await?;
                self.report(user_id, Some(request_id), RequestResult::Duplicate, started);
                return Ok(Handled::Continue);
            }
            Begun::Executing { worker_id, .. } => {
                tracing::warn!(
                    user_id,
                    request_id,
                    began_by = worker_id,
                    "request found executing; settling it with the broker by client order id"
                );
                self.settle(&request, claimed, cache).await
            }
            Begun::Started => self.execute(&request, claimed, cache, false).await,
        };
        let response = outcome.response.to_json();
        let done = Answer {
            user_id,
            raw,
            request_id,
            response: &response,
            mode: AnswerMode::Final,
            dead_letter: None,
        };
        self.answer(&done, stop).await?;
        self.report(user_id, Some(request_id), outcome.result, started);
        match outcome.fatal {
            Some(err) => Err(Unfinished::Fatal(err)),
            None => Ok(Handled::Continue),
        }
    }

    /// A request found `executing`: whatever began it may have sent the order,
    /// so the broker is asked first; only an order it does not hold is sent.
    async fn settle(
        &mut self,
        request: &Request,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
    ) -> Outcome {
        match self.lookup(request, claimed, cache).await {
            Ok(Some(order)) => {
                tracing::info!(
                    request_id = request.request_id,
                    "the broker holds the order; answered from its record"
                );
                Outcome::ok(&request.request_id, order)
            }
            Ok(None) => self.execute(request, claimed, cache, true).await,
            Err(outcome) => outcome,
        }
    }

    /// Asks the broker for the order under the request's client order id.
    /// `Err` is the in-doubt answer: the broker could not tell.
    async fn lookup(
        &mut self,
        request: &Request,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
    ) -> Result<Option<Value>, Outcome> {
        let id = &request.request_id;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(err @ ConnectError::Exhausted { .. }) => {
                return Err(
                    Outcome::in_doubt(id, format!("cannot reach the broker: {err}")).fatal(err),
                );
            }
            Err(err) => return Err(Outcome::in_doubt(id, err)),
        };
        match connection.lookup_order(id).await {
            Ok(found) => Ok(found),
            Err(err) => {
                if matches!(err, BrokerError::Connection(_)) {
                    cache.invalidate(&request.account).await;
                }
                Err(Outcome::in_doubt(
                    id,
                    format!("the broker could not tell: {err}"),
                ))
            }
        }
    }

    /// Sends the order once. `settling`: a lookup just found no such order.
    async fn execute(
        &mut self,
        request: &Request,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
        settling: bool,
    ) -> Outcome {
        let id = &request.request_id;
        if request.is_expired(now_ms()) {
            return Outcome::error(
                id,
                ErrorCode::Expired,
                "expires_at passed before the request ran; not executed",
            );
        }
        let Action::PlaceOrder(order) = &request.action;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(ConnectError::UnknownBroker(name)) => {
                return Outcome::error(id, ErrorCode::Invalid, format!("unknown broker {name:?}"));
            }
            Err(err) => {
                return Outcome::error(id, ErrorCode::Broker, format!("{err}; not executed"))
                    .fatal(err);
            }
        };
        match connection.place_order(id, order).await {
            Ok(result) => Outcome::ok(id, result),
            Err(BrokerError::DuplicateClientOrderId(_)) if settling => {
                // Placed between the lookup and now (whoever began it was
                // still running): the broker's record is the answer.
                match self.lookup(request, claimed, cache).await {
                    Ok(Some(order)) => Outcome::ok(id, order),
                    Ok(None) => Outcome::in_doubt(
                        id,
                        "the broker refused the client order id as used but holds no such order",
                    ),
                    Err(outcome) => outcome,
                }
            }
            Err(BrokerError::DuplicateClientOrderId(_)) => Outcome::error(
                id,
                ErrorCode::Duplicate,
                "the broker already holds an order with this client order id (the request id, \
                 used by an earlier request whose record has expired); not executed again",
            ),
            Err(BrokerError::Connection(problem)) => {
                // The order may have reached the broker before the connection
                // broke: ask, never guess and never resend.
                cache.invalidate(&request.account).await;
                match self.lookup(request, claimed, cache).await {
                    Ok(Some(order)) => Outcome::ok(id, order),
                    Ok(None) => Outcome::error(
                        id,
                        ErrorCode::Broker,
                        format!(
                            "broker connection lost: {problem}; the broker holds no such order: not executed"
                        ),
                    ),
                    Err(outcome) => outcome,
                }
            }
            Err(err) => Outcome::error(id, ErrorCode::Broker, err.to_string()),
        }
    }
}

/// Sleeps before retry `retries` (jittered, bounded) unless the worker stops
/// first; `false` when it stopped.
async fn pause(retries: &mut u32, stop: &CancellationToken) -> bool {
    let delay = RETRY.delay(*retries);
    *retries = retries.saturating_add(1);
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.cancelled() => false,
    }
}
