//! The claimed loop: control messages first, then the user's requests oldest
//! first, each with exactly one final response. The decisions are
//! `leasehold_pool::settlement`'s (pure, model-checked in
//! `worker/pool/tests/it/request_model.rs`); this module performs each step.
//!
//! A request waits in the user's processing list until its final response is
//! stored, which removes it in the same bus step: a worker that dies
//! mid-request leaves it to its successor. Before the broker call the
//! request's record says `executing`; whoever finds it `executing` does not
//! know whether the order reached the broker, so it asks the broker by client
//! order id (= request id) and never sends it blindly again. A Redis error
//! leaves the request where it is, to be retried after a jittered backoff.
//!
//! Only the mark holder acts: the bus refuses to begin a request or store a
//! final answer for a worker that does not hold the user's mark (and, for
//! the answer, that did not begin or take over the request), and a worker
//! whose heartbeats have failed past its holder deadline sends no order. A
//! displaced worker therefore cannot replace its successor's answer. A
//! request id of another user's request is dead-lettered
//! (`foreign_request_id`), never answered.
//!
//! Every broker call is bounded ([`crate::connections::CallTimeouts`]), and an
//! order call also by the time left before `expires_at` (checked again once
//! the connection is ready). An order that may be at the broker — timed out,
//! connection lost, client order id refused as used — is looked up by its
//! client order id: found → answered from the broker's record; not found →
//! `timeout` / `broker` / `in_doubt`; the lookup failing too → `in_doubt`. A
//! stopping worker does not wait for a broker call: it leaves the request
//! `executing` in the processing list, and its successor settles it by
//! lookup. A broker or account that fails answers that account's requests
//! `broker`; the worker stays up.
//!
//! Bounds: a message over `REQUEST_MAX_BYTES` arrives as its head only and is
//! answered `too_large` unparsed; a request taken by more than
//! `REQUEST_MAX_DELIVERIES` workers is settled by lookup, `poison` when
//! absent. Before each request the queue's length is checked against
//! `USER_QUEUE_MAX`: the newest requests beyond it are answered `overloaded`
//! in the same bus step that takes them out of the queue, so none is lost.

use std::time::Duration;

use leasehold_pool::bus::{
    Answer, AnswerMode, Answered, Begun, BusError, MessageKind, Oversized, Shed, UserMessage,
};
use leasehold_pool::keys;
use leasehold_pool::protocol::{self, Action, ControlMessage, ErrorCode, Request, Response};
use leasehold_pool::settlement::{self, Final, Looked, Sent, Step};
use leasehold_telemetry::{RequestResult, TelemetryEvent};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    BrokerWorker, Claimed, Due, Handled, Holder, RETRY, Schedule, WorkerError, WorkerExit, now_ms,
};
use crate::connections::{ConnectError, ConnectionCache};
use crate::paper::BrokerError;

/// Why a request was left in the processing list unanswered.
enum Unfinished {
    /// The bus failed; nothing is lost, the request is tried again.
    Bus(BusError),
    /// The worker is stopping; its successor finishes the request.
    Stopped,
    /// This worker cannot show it still holds the user (its heartbeats have
    /// failed past the holder deadline, or the bus refused it as holder): it
    /// places nothing and stores no answer until the heartbeat confirms the
    /// mark again, or stops when another worker has it.
    NotHolder,
}

/// What a request came to: its final response and how it is counted.
struct Outcome {
    response: Response,
    result: RequestResult,
}

impl Outcome {
    /// The response for a settled request of `user_id`.
    fn of(request_id: &str, user_id: &str, answer: Final<Value>) -> Self {
        match answer {
            Final::Ok(result) => Outcome {
                response: Response::ok(request_id, result).for_user(user_id),
                result: RequestResult::Ok,
            },
            Final::Error(code, error) => Outcome {
                response: Response::error(request_id, code, error).for_user(user_id),
                result: match code {
                    ErrorCode::InDoubt => RequestResult::InDoubt,
                    ErrorCode::Expired => RequestResult::Expired,
                    ErrorCode::Timeout => RequestResult::Timeout,
                    ErrorCode::Overloaded => RequestResult::Overloaded,
                    ErrorCode::Invalid | ErrorCode::TooLarge => RequestResult::Invalid,
                    _ => RequestResult::Error,
                },
            },
        }
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
        holder: &Holder,
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
            let popped = self
                .bus
                .pop_user_message(&user_id, self.config.bounds.max_bytes, wait, stop)
                .await;
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
                UserMessage::Control(raw) => {
                    // Control bodies are plain JSON; bytes that are not UTF-8
                    // fail to parse and are dead-lettered as such.
                    let body = String::from_utf8_lossy(&raw).into_owned();
                    let handled = self.control(&mut claimed, cache, &body).await;
                    // Handled (or dead-lettered): out of control processing.
                    // A worker that dies before this leaves it to its
                    // successor, which handles it again (each is idempotent).
                    if let Err(Unfinished::Stopped) =
                        self.finish_control(&user_id, &raw, stop).await
                    {
                        continue;
                    }
                    handled
                }
                UserMessage::Oversized { kind, head, length } => {
                    match self.oversized(&user_id, kind, &head, length, stop).await {
                        Ok(()) => Handled::Continue,
                        Err(_) => continue,
                    }
                }
                UserMessage::Request(raw) => {
                    self.shed_excess(&user_id).await;
                    match self.request(&claimed, holder, cache, &raw, stop).await {
                        Ok(handled) => handled,
                        Err(Unfinished::Bus(err)) => {
                            tracing::warn!(user_id, error = %err, "pool bus failed mid-request; the request stays in processing and is retried");
                            pause(&mut retries, stop).await;
                            continue;
                        }
                        Err(Unfinished::NotHolder) => {
                            tracing::warn!(
                                user_id,
                                "cannot show this worker still holds the user; nothing placed or answered until a heartbeat confirms the mark (the request stays in processing)"
                            );
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
            .for_user(user_id)
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

    /// Takes a handled control message out of control processing, retrying
    /// bus failures until it holds or the worker stops.
    async fn finish_control(
        &self,
        user_id: &str,
        raw: &[u8],
        stop: &CancellationToken,
    ) -> Result<(), Unfinished> {
        let mut retries = 0;
        loop {
            match self.bus.finish_control(user_id, raw).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    tracing::warn!(user_id, error = %err, "cannot take a handled control message out of processing; retrying");
                }
            }
            if !pause(&mut retries, stop).await {
                return Err(Unfinished::Stopped);
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
        self.report_dead_letter_on(keys::user_requests(user_id), reason);
    }

    fn report_dead_letter_on(&self, queue: String, reason: &str) {
        self.telemetry.emit(TelemetryEvent::MessageDeadLettered {
            queue,
            reason: reason.to_owned(),
        });
    }

    /// Ends a message over `REQUEST_MAX_BYTES` from its head alone: a request
    /// with a readable id is answered `too_large` (unless the id has a
    /// record), and either kind is dead-lettered truncated, with its length.
    async fn oversized(
        &self,
        user_id: &str,
        kind: MessageKind,
        head: &[u8],
        length: u64,
        stop: &CancellationToken,
    ) -> Result<(), Unfinished> {
        let started = Instant::now();
        let max = self.config.bounds.max_bytes;
        let (queue, request_id) = match kind {
            MessageKind::Request => (
                keys::user_requests(user_id),
                protocol::sniff_request_id(head),
            ),
            MessageKind::Control => (keys::worker_control(user_id), None),
        };
        let response = request_id.as_deref().map(|id| {
            Response::error(
                id,
                ErrorCode::TooLarge,
                format!(
                    "the message is {length} bytes, over REQUEST_MAX_BYTES ({max}); \
                     not parsed, not executed"
                ),
            )
            .for_user(user_id)
            .to_json()
        });
        tracing::warn!(
            user_id,
            queue,
            length,
            max,
            "a message over REQUEST_MAX_BYTES is dead-lettered from its head, unparsed"
        );
        self.report_dead_letter_on(queue, protocol::dead_reason::TOO_LARGE);
        let oversized = Oversized {
            user_id,
            head,
            length,
            kind,
            answer: request_id.as_deref().zip(response.as_deref()),
            at_unix_ms: now_ms(),
        };
        let mut retries = 0;
        loop {
            match self.bus.drop_oversized(&oversized).await {
                Ok(_) => break,
                Err(err) => {
                    tracing::warn!(user_id, error = %err, "cannot dead-letter an over-long message; retrying");
                }
            }
            if !pause(&mut retries, stop).await {
                return Err(Unfinished::Stopped);
            }
        }
        if kind == MessageKind::Request {
            self.report(
                user_id,
                request_id.as_deref(),
                RequestResult::Invalid,
                started,
            );
        }
        Ok(())
    }

    /// Stores a request's final step, retrying bus failures until it holds or
    /// the worker stops (then the request stays in processing for the next).
    async fn answer(
        &self,
        answer: &Answer<'_>,
        stop: &CancellationToken,
    ) -> Result<Answered, Unfinished> {
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
    /// at most one execution. The decisions are `settlement`'s; this performs
    /// them.
    async fn request(
        &mut self,
        claimed: &Claimed,
        holder: &Holder,
        cache: &mut ConnectionCache,
        raw: &[u8],
        stop: &CancellationToken,
    ) -> Result<Handled, Unfinished> {
        let started = Instant::now();
        let user_id = claimed.user_id.as_str();
        let worker_id = self.config.worker_id.clone();
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
                self.invalid(user_id, raw, &invalid, stop).await?;
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
            .begin_request(request_id, user_id, &worker_id, now_ms())
            .await
            .map_err(Unfinished::Bus)?;
        if let Begun::Executing {
            worker_id: began_by,
            deliveries,
            ..
        } = &begun
        {
            tracing::warn!(
                user_id,
                request_id,
                began_by,
                deliveries,
                "request found executing; settling it with the broker by client order id"
            );
        }
        let mut step = settlement::after_begin(&begun, user_id, self.config.bounds.max_deliveries);
        let answer = loop {
            step = match step {
                Step::Stop => return Err(Unfinished::NotHolder),
                Step::Answer(answer) => break answer,
                Step::Replay(response) => {
                    tracing::info!(
                        user_id,
                        request_id,
                        "repeated request id; answered with its stored response, not executed again"
                    );
                    let replay = Answer {
                        user_id,
                        worker_id: &worker_id,
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
                Step::DeadLetter(reason) => {
                    // Another user's request holds this id: answering would
                    // overwrite or leak that request's response.
                    tracing::warn!(
                        user_id,
                        request_id,
                        reason,
                        "request id belongs to another user's request; dead-lettered, not executed, not answered"
                    );
                    self.drop_request(user_id, raw, reason, stop).await?;
                    self.report(user_id, Some(request_id), RequestResult::Invalid, started);
                    return Ok(Handled::Continue);
                }
                Step::LookUp(why) => {
                    let looked = until_stopped(self.lookup(&request, claimed, cache), stop).await?;
                    settlement::after_lookup(why, looked)
                }
                Step::Place => {
                    until_stopped(self.place(&request, claimed, holder, cache), stop).await??
                }
            };
        };
        let outcome = Outcome::of(request_id, user_id, answer);
        let response = outcome.response.to_json();
        let done = Answer {
            user_id,
            worker_id: &worker_id,
            raw,
            request_id,
            response: &response,
            mode: AnswerMode::Final,
            dead_letter: None,
        };
        if self.answer(&done, stop).await? == Answered::Fenced {
            // Displaced: the holder settles this request, by lookup.
            return Err(Unfinished::NotHolder);
        }
        self.report(user_id, Some(request_id), outcome.result, started);
        Ok(Handled::Continue)
    }

    /// A request that does not parse: answered `invalid` when its id is
    /// readable and has no record yet, dead-lettered either way.
    async fn invalid(
        &self,
        user_id: &str,
        raw: &[u8],
        invalid: &protocol::InvalidRequest,
        stop: &CancellationToken,
    ) -> Result<(), Unfinished> {
        let reason = format!("invalid request: {}", invalid.error);
        let Some(request_id) = invalid.request_id.as_deref() else {
            return self.drop_request(user_id, raw, &reason, stop).await;
        };
        self.report_dead_letter(user_id, &reason);
        let response = Response::error(request_id, ErrorCode::Invalid, &reason)
            .for_user(user_id)
            .to_json();
        let answered = self
            .answer(
                &Answer {
                    user_id,
                    worker_id: &self.config.worker_id,
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
        if answered == Answered::Kept {
            tracing::warn!(
                user_id,
                request_id,
                "an invalid message reuses a known request id; dead-lettered, the request's own response is kept"
            );
        }
        Ok(())
    }

    /// Asks the broker for the order under the request's client order id.
    async fn lookup(
        &mut self,
        request: &Request,
        claimed: &Claimed,
        cache: &mut ConnectionCache,
    ) -> Looked<Value> {
        let timeout = cache.timeouts().lookup;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(err) => return Looked::Failed(format!("cannot reach the broker: {err}")),
        };
        let looked_up = tokio::time::timeout(timeout, connection.lookup_order(&request.request_id))
            .await
            .unwrap_or(Err(BrokerError::TimedOut {
                call: "lookup_order",
                after: timeout,
            }));
        match looked_up {
            Ok(Some(order)) => Looked::Found(order),
            Ok(None) => Looked::Absent,
            Err(err) => {
                if matches!(
                    err,
                    BrokerError::Connection(_) | BrokerError::TimedOut { .. }
                ) {
                    cache.invalidate(&request.account).await;
                }
                Looked::Failed(err.to_string())
            }
        }
    }

    /// Sends the order once: only before `expires_at` (checked again once
    /// the connection is ready, the call bounded by the time left) and only
    /// within the holder deadline.
    async fn place(
        &mut self,
        request: &Request,
        claimed: &Claimed,
        holder: &Holder,
        cache: &mut ConnectionCache,
    ) -> Result<Step<Value>, Unfinished> {
        let id = &request.request_id;
        let order_timeout = cache.timeouts().order;
        let order_timeout_ms = u64::try_from(order_timeout.as_millis()).unwrap_or(u64::MAX);
        // Before connecting too: an expired request needs no connection.
        if let Err(instead) =
            settlement::send_budget(request.expires_at, now_ms(), order_timeout_ms)
        {
            return Ok(instead);
        }
        let Action::PlaceOrder(order) = &request.action;
        let connection = match cache.get(&request.account, &claimed.credentials).await {
            Ok(connection) => connection,
            Err(ConnectError::UnknownBroker(name)) => {
                return Ok(settlement::after_send(Sent::NotSent(
                    ErrorCode::Invalid,
                    format!("unknown broker {name:?}"),
                )));
            }
            // This account only: the worker goes on serving the others.
            Err(err) => {
                return Ok(settlement::after_send(Sent::NotSent(
                    ErrorCode::Broker,
                    err.to_string(),
                )));
            }
        };
        // A connect can take many seconds: the deadline is checked again now.
        let budget = match settlement::send_budget(request.expires_at, now_ms(), order_timeout_ms) {
            Ok(budget) => Duration::from_millis(budget),
            Err(instead) => return Ok(instead),
        };
        // The call ends while the mark is surely this worker's: an order
        // call that outlived the holder deadline would still be running
        // when a successor settles the request. Cut short, it is a timeout,
        // settled by lookup like any other.
        let Some(left) = holder.time_left(Instant::now()) else {
            return Err(Unfinished::NotHolder);
        };
        let budget = budget.min(left);
        let placed = tokio::time::timeout(budget, connection.place_order(id, order))
            .await
            .unwrap_or(Err(BrokerError::TimedOut {
                call: "place_order",
                after: budget,
            }));
        let sent = match placed {
            Ok(result) => Sent::Placed(result),
            Err(err @ BrokerError::TimedOut { .. }) => {
                // The order may be at the broker; the lookup goes over a
                // fresh connection (this one is suspect), never a resend.
                tracing::warn!(request_id = id, error = %err, "order timed out; looking it up by client order id");
                cache.invalidate(&request.account).await;
                Sent::TimedOut(err.to_string())
            }
            Err(BrokerError::DuplicateClientOrderId(_)) => Sent::Duplicate,
            Err(BrokerError::Connection(problem)) => {
                cache.invalidate(&request.account).await;
                Sent::ConnectionLost(problem)
            }
            Err(err) => Sent::Refused(err.to_string()),
        };
        Ok(settlement::after_send(sent))
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
