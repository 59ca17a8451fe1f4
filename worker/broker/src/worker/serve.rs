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
//!
//! Every broker call is bounded ([`crate::connections::CallTimeouts`]). An
//! order that times out is looked up by its client order id: found → answered
//! from the broker's record; not found → `timeout` (not executed); the lookup
//! failing too → `in_doubt`. A stopping worker does not wait for a broker
//! call: it leaves the request `executing` in the processing list, and its
//! successor settles it by lookup. A broker or account that fails answers
//! that account's requests `broker`; the worker stays up.
//!
//! Before each request the queue's length is checked against
//! `USER_QUEUE_MAX`: the newest requests beyond it are answered `overloaded`
//! in the same bus step that takes them out of the queue, so none is lost.

use leasehold_pool::bus::{Answer, AnswerMode, Begun, BusError, Shed, UserMessage};
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, Action, ControlMessage, ErrorCode, Request, Response};
use leasehold_telemetry::{RequestResult, TelemetryEvent};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    BrokerWorker, Claimed, Due, Handled, RETRY, Schedule, WorkerError, WorkerExit, now_ms,
};
use crate::connections::{ConnectError, ConnectionCache};
use crate::paper::BrokerError;

/// Why a request was left in the processing list unanswered.
enum Unfinished {
    /// The bus failed; nothing is lost, the request is tried again.
    Bus(BusError),
    /// The worker is stopping; its successor finishes the request.
    Stopped,
}

/// What a request came to: its final response and how it is counted.
struct Outcome {
    response: Response,
    result: RequestResult,
}

impl Outcome {
    fn ok(request_id: &str, result: Value) -> Self {
        Outcome {
            response: Response::ok(request_id, result),
            result: RequestResult::Ok,
        }
    }

    fn error(request_id: &str, code: ErrorCode, error: impl Into<String>) -> Self {
        Outcome {
            response: Response::error(request_id, code, error),
            result: match code {
                ErrorCode::InDoubt => RequestResult::InDoubt,
                ErrorCode::Expired => RequestResult::Expired,
                ErrorCode::Timeout => RequestResult::Timeout,
                ErrorCode::Overloaded => RequestResult::Overloaded,
                _ => RequestResult::Error,
            },
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
}

/// Runs `work` unless the worker stops first: a broker call that hangs must
/// not hold a stopping worker (its request stays in processing, `executing`,
/// for the successor to settle by lookup).
async fn until_stopped<T>(
    work: impl std::future::Future<Output = T>,
    stop: &CancellationToken,
) -> Result<T, Unfinished> {
    tokio::select! {
        done = work => Ok(done),
        _ = stop.cancelled() => Err(Unfinished::Stopped),
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
                    // Bounded by the ping timeout per connection, and cut
                    // short by a stop.
                    let _ = until_stopped(cache.health_check(), stop).await;
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
                    self.shed_excess(&user_id).await;
                    match self.request(&claimed, cache, &raw, stop).await {
                        Ok(handled) => handled,
                        Err(Unfinished::Bus(err)) => {
                            tracing::warn!(user_id, error = %err, "pool bus failed mid-request; the request stays in processing and is retried");
                            pause(&mut retries, stop).await;
                            continue;
                        }
                        Err(Unfinished::Stopped) => {
                            tracing::warn!(
                                user_id,
                                "stopping mid-request; the request stays in processing for the next worker, which settles it by lookup"
                            );
                            continue;
                        }
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
                // Shutdown still works for such a user; nothing else does.
                if let Err(err) = keys::check_user_id(&claimed.user_id) {
                    self.dead_letter(
                        &control_key,
                        &format!("invalid control message: {err}"),
                        body,
                    )
                    .await;
                    return Handled::Continue;
                }
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

    /// Answers `overloaded` the newest queued requests beyond
    /// `USER_QUEUE_MAX`, each in one bus step that takes it out of the queue.
    /// The API only pushes, so the worker is the one place that sees the
    /// queue and can answer: it checks each time it takes a request. Best
    /// effort: a bus failure leaves them queued, to be checked again next time.
    async fn shed_excess(&self, user_id: &str) {
        let max = self.config.queue_max;
        let excess = match self.bus.excess_requests(user_id, max).await {
            Ok(excess) => excess,
            Err(err) => {
                tracing::warn!(user_id, error = %err, "cannot check the request queue's length");
                return;
            }
        };
        for raw in excess {
            let started = Instant::now();
            // Only requests with a readable id can be answered; the others
            // are dead-lettered in their turn.
            let Some(request_id) = std::str::from_utf8(&raw).ok().and_then(|text| {
                match protocol::parse_request(text) {
                    Ok(request) => Some(request.request_id),
                    Err(invalid) => invalid.request_id,
                }
            }) else {
                continue;
            };
            let response = Response::error(
                &request_id,
                ErrorCode::Overloaded,
                format!(
                    "the user's queue held more than {max} requests (USER_QUEUE_MAX); \
                     the newest are answered at once; not executed"
                ),
            )
            .to_json();
            let shed = Shed {
                user_id,
                raw: &raw,
                request_id: &request_id,
                response: &response,
            };
            match self.bus.shed_request(&shed).await {
                Ok(true) => {
                    self.report(
                        user_id,
                        Some(&request_id),
                        RequestResult::Overloaded,
                        started,
                    );
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(user_id, error = %err, "cannot answer an over-cap request; it stays queued");
                    return;
                }
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
        // A worker claimed for a user id that could name another key family
        // serves nothing for it (docs/redis.md, user ids).
        let parsed =
            protocol::parse_request(text).and_then(|request| match keys::check_user_id(user_id) {
                Ok(()) => Ok(request),
                Err(err) => Err(protocol::InvalidRequest {
                    request_id: Some(request.request_id),
                    error: protocol::ParseError::UserId(err),
                }),
            });
        let request = match parsed {
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
                until_stopped(self.settle(&request, claimed, cache), stop).await?
            }
            Begun::Started => {
                until_stopped(self.execute(&request, claimed, cache, false), stop).await?
            }
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
        Ok(Handled::Continue)
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
        let timeout = cache.timeouts().lookup;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(err) => {
                return Err(Outcome::in_doubt(
                    id,
                    format!("cannot reach the broker: {err}"),
                ));
            }
        };
        let looked_up = tokio::time::timeout(timeout, connection.lookup_order(id))
            .await
            .unwrap_or(Err(BrokerError::TimedOut {
                call: "lookup_order",
                after: timeout,
            }));
        match looked_up {
            Ok(found) => Ok(found),
            Err(err) => {
                if matches!(
                    err,
                    BrokerError::Connection(_) | BrokerError::TimedOut { .. }
                ) {
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
        let timeout = cache.timeouts().order;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(ConnectError::UnknownBroker(name)) => {
                return Outcome::error(id, ErrorCode::Invalid, format!("unknown broker {name:?}"));
            }
            // This account only: the worker goes on serving the others.
            Err(err) => {
                return Outcome::error(id, ErrorCode::Broker, format!("{err}; not executed"));
            }
        };
        let placed = tokio::time::timeout(timeout, connection.place_order(id, order))
            .await
            .unwrap_or(Err(BrokerError::TimedOut {
                call: "place_order",
                after: timeout,
            }));
        match placed {
            Ok(result) => Outcome::ok(id, result),
            Err(err @ BrokerError::TimedOut { .. }) => {
                // The order may be at the broker: ask by client order id on a
                // fresh connection (this one is suspect), never resend.
                tracing::warn!(request_id = id, error = %err, "order timed out; looking it up by client order id");
                cache.invalidate(&request.account).await;
                match self.lookup(request, claimed, cache).await {
                    Ok(Some(order)) => Outcome::ok(id, order),
                    Ok(None) => Outcome::error(
                        id,
                        ErrorCode::Timeout,
                        format!(
                            "{err}; asked afterwards by client order id, the broker holds no such order: not executed"
                        ),
                    ),
                    Err(outcome) => outcome,
                }
            }
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
