//! Every message body of the broker pool protocol (docs/messages.md), in one place.
//!
//! The API side may be written in any language, so parsing is strict and
//! explains itself: a bad message yields a [`ParseError`] naming the field, never
//! echoing values (a value could be a secret someone put in the wrong place).
//! serde_json's own messages are not used for the same reason.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which broker session a request needs (the request's `account` object).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Account {
    /// Broker adapter, e.g. `paper`.
    pub broker_name: String,
    /// Product type, e.g. `stock`.
    pub broker_type: String,
    /// Simulation (paper) account or live.
    pub simulation: bool,
    /// Account at the broker.
    pub account_id: String,
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.broker_name,
            self.broker_type,
            if self.simulation { "sim" } else { "live" },
            self.account_id
        )
    }
}

/// Why a message could not be used. Messages name fields, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all (position only).
    #[error("not valid JSON (line {line}, column {column})")]
    NotJson {
        /// Line of the syntax error.
        line: usize,
        /// Column of the syntax error.
        column: usize,
    },
    /// JSON, but not an object.
    #[error("not a JSON object")]
    NotObject,
    /// A required field is absent or null.
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    /// A field has the wrong type or an unusable value.
    #[error("field `{field}` {problem}")]
    BadField {
        /// Field name (dotted path for nested fields).
        field: &'static str,
        /// What is wrong, without the value.
        problem: &'static str,
    },
    /// An action this worker does not know.
    #[error("unknown action (supported: place_order)")]
    UnknownAction,
    /// A control type this worker does not know.
    #[error("unknown control message type (supported: reload_credentials, shutdown)")]
    UnknownControl,
    /// The user the message is for has an id that cannot name its keys
    /// ([`crate::keys::check_user_id`]).
    #[error("{0}")]
    UserId(crate::keys::UserIdError),
}

fn object(text: &str) -> Result<Map<String, Value>, ParseError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ParseError::NotObject),
        Err(err) => Err(ParseError::NotJson {
            line: err.line(),
            column: err.column(),
        }),
    }
}

fn string(map: &Map<String, Value>, field: &'static str) -> Result<String, ParseError> {
    match map.get(field) {
        None | Some(Value::Null) => Err(ParseError::MissingField(field)),
        Some(Value::String(s)) if s.is_empty() => Err(ParseError::BadField {
            field,
            problem: "must not be empty",
        }),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ParseError::BadField {
            field,
            problem: "must be a string",
        }),
    }
}

/// Ids become parts of Redis keys: keep them printable and bounded.
fn id(map: &Map<String, Value>, field: &'static str) -> Result<String, ParseError> {
    let value = string(map, field)?;
    if value.len() > 200 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ParseError::BadField {
            field,
            problem: "must be 1-200 characters without spaces",
        });
    }
    Ok(value)
}

/// A claim for an idle pool worker (list `pool:claims`).
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimMessage {
    /// User the worker is to serve.
    pub user_id: String,
    /// The credentials blob (see [`crate::keys::credentials`]); encrypted, still never logged.
    pub encrypted_credentials: String,
    /// Id chosen by the API, for tracing a claim end to end.
    pub claim_id: String,
    /// When the API pushed the claim (unix ms).
    pub enqueued_at: u64,
}

impl std::fmt::Debug for ClaimMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimMessage")
            .field("user_id", &self.user_id)
            .field("encrypted_credentials", &"[redacted]")
            .field("claim_id", &self.claim_id)
            .field("enqueued_at", &self.enqueued_at)
            .finish()
    }
}

impl ClaimMessage {
    /// The JSON body the API pushes.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "user_id": self.user_id,
            "encrypted_credentials": self.encrypted_credentials,
            "claim_id": self.claim_id,
            "enqueued_at": self.enqueued_at,
        })
        .to_string()
    }
}

/// Parses a claim message.
pub fn parse_claim(text: &str) -> Result<ClaimMessage, ParseError> {
    let map = object(text)?;
    let user_id = id(&map, "user_id")?;
    if user_id == crate::keys::POOL_USER_ID {
        return Err(ParseError::BadField {
            field: "user_id",
            problem: "must not be the pool's user id -1",
        });
    }
    // Checked at claim time, before any key is built from it: a user id like
    // `-1:w7` would share `worker:active:-1:w7` with pool worker `w7`.
    if !crate::keys::valid_user_id(&user_id) {
        return Err(ParseError::BadField {
            field: "user_id",
            problem: "must be 1-128 of A-Z a-z 0-9 _ . @ - and not start with -",
        });
    }
    Ok(ClaimMessage {
        user_id,
        encrypted_credentials: string(&map, "encrypted_credentials")?,
        claim_id: id(&map, "claim_id")?,
        enqueued_at: map
            .get("enqueued_at")
            .ok_or(ParseError::MissingField("enqueued_at"))?
            .as_u64()
            .ok_or(ParseError::BadField {
                field: "enqueued_at",
                problem: "must be unix milliseconds (a whole number)",
            })?,
    })
}

/// Whether a claim ended with the user marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStatus {
    /// A pool worker now serves the user.
    Claimed,
    /// No pool worker took the user for this claim; `error` says why.
    Failed,
}

/// Why a trusted component granted a user's credentials to its worker
/// (`pool:grant:{user_id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantReason {
    /// A claim was pushed for the user (`leasehold claim`, supervision).
    Claim,
    /// A worker was cold-started for the user.
    ColdStart,
    /// `reload_credentials` was sent (a rotation or a new blob).
    Reload,
}

/// The value of `pool:grant:{user_id}`: the credential sealer hands the
/// user's credentials only while one exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialsGrant {
    /// What the grant is for.
    pub reason: GrantReason,
    /// When it was written (unix ms).
    pub granted_at: u64,
    /// A claim grant's claim: only the worker holding this claim may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<String>,
    /// A cold-start grant's task (the launcher's id for it): only that task may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Set by the sealer's assign step: the worker that used the grant (one
    /// seal per grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_by: Option<String>,
}

impl CredentialsGrant {
    /// A grant for `reason` written at `granted_at` (unix ms); a reload's
    /// grant is bound by the sealer's holder record, the others by
    /// [`CredentialsGrant::for_claim`] or [`CredentialsGrant::for_task`].
    pub fn new(reason: GrantReason, granted_at: u64) -> Self {
        CredentialsGrant {
            reason,
            granted_at,
            claim_id: None,
            task_id: None,
            used_by: None,
        }
    }

    /// Bound to the claim `claim_id`.
    pub fn for_claim(mut self, claim_id: &str) -> Self {
        self.claim_id = Some(claim_id.to_owned());
        self
    }

    /// Bound to the launched task `task_id`.
    pub fn for_task(mut self, task_id: &str) -> Self {
        self.task_id = Some(task_id.to_owned());
        self
    }

    /// The JSON stored in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// How long a grant lasts unless renewed: long enough for a claim to wait
/// for an idle worker, or a cold start to boot, and no longer.
pub const GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(120);

/// The outcome of one claim, stored under `pool:claim:{claim_id}` (60 s) in
/// the step that settles the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOutcome {
    /// Claimed or failed.
    pub status: ClaimStatus,
    /// The pool worker that settled the claim.
    pub worker_id: String,
    /// Why it failed (only when failed; never a secret).
    pub error: Option<String>,
}

impl ClaimOutcome {
    /// `worker_id` now serves the claim's user.
    pub fn claimed(worker_id: &str) -> Self {
        ClaimOutcome {
            status: ClaimStatus::Claimed,
            worker_id: worker_id.to_owned(),
            error: None,
        }
    }

    /// `worker_id` settled the claim without taking the user.
    pub fn failed(worker_id: &str, error: impl Into<String>) -> Self {
        ClaimOutcome {
            status: ClaimStatus::Failed,
            worker_id: worker_id.to_owned(),
            error: Some(error.into()),
        }
    }

    /// The stored JSON: `error` only when failed, as in a response.
    pub fn to_json(&self) -> String {
        let mut body = serde_json::json!({
            "status": match self.status {
                ClaimStatus::Claimed => "claimed",
                ClaimStatus::Failed => "failed",
            },
            "worker_id": self.worker_id,
        });
        if let Some(error) = &self.error {
            body["error"] = Value::String(error.clone());
        }
        body.to_string()
    }

    /// Parses a stored outcome.
    pub fn parse(text: &str) -> Result<ClaimOutcome, ParseError> {
        let map = object(text)?;
        let status = match string(&map, "status")?.as_str() {
            "claimed" => ClaimStatus::Claimed,
            "failed" => ClaimStatus::Failed,
            _ => {
                return Err(ParseError::BadField {
                    field: "status",
                    problem: "must be \"claimed\" or \"failed\"",
                });
            }
        };
        Ok(ClaimOutcome {
            status,
            worker_id: string(&map, "worker_id")?,
            error: match map.get("error") {
                None | Some(Value::Null) => None,
                Some(_) => Some(string(&map, "error")?),
            },
        })
    }
}

/// The claim id of a claim body that may not parse as a whole, so its
/// outcome can still be written; `None` when there is no usable one.
pub fn claim_id_of(text: &str) -> Option<String> {
    id(&object(text).ok()?, "claim_id").ok()
}

/// Buy or sell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// Buy.
    Buy,
    /// Sell.
    Sell,
}

/// An order as the API sends it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Order {
    /// Instrument symbol, e.g. `2330`.
    pub symbol: String,
    /// Buy or sell.
    pub side: Side,
    /// Units, greater than 0.
    pub quantity: f64,
    /// Limit price; absent for a market order.
    pub price: Option<f64>,
}

/// What a request asks for. New actions are added here and in [`parse_request`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Place an order.
    PlaceOrder(Order),
}

/// A request for a user's worker (list `trading:user:{user_id}:requests`).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Id the API polls `trading:response:{user_id}:{request_id}` with; also the broker's
    /// client order id, so the broker itself refuses to execute it twice.
    pub request_id: String,
    /// Which broker connection to use.
    pub account: Account,
    /// What to do.
    pub action: Action,
    /// Unix ms after which the request must not be executed (answered `expired`).
    pub expires_at: Option<u64>,
}

impl Request {
    /// Whether the request may no longer be executed at `now_unix_ms`.
    pub fn is_expired(&self, now_unix_ms: u64) -> bool {
        self.expires_at.is_some_and(|at| now_unix_ms > at)
    }
}

/// A request that could not be parsed; carries its id when one was readable so
/// the API can still be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct InvalidRequest {
    /// The request id, if the message had a usable one.
    pub request_id: Option<String>,
    /// What is wrong.
    pub error: ParseError,
}

fn order(map: &Map<String, Value>) -> Result<Order, ParseError> {
    let order = match map.get("order") {
        None | Some(Value::Null) => return Err(ParseError::MissingField("order")),
        Some(Value::Object(order)) => order,
        Some(_) => {
            return Err(ParseError::BadField {
                field: "order",
                problem: "must be an object",
            });
        }
    };
    let side = match string(order, "side")
        .map_err(|err| rename(err, "order.side"))?
        .as_str()
    {
        "buy" => Side::Buy,
        "sell" => Side::Sell,
        _ => {
            return Err(ParseError::BadField {
                field: "order.side",
                problem: "must be \"buy\" or \"sell\"",
            });
        }
    };
    let quantity = order
        .get("quantity")
        .ok_or(ParseError::MissingField("order.quantity"))?
        .as_f64()
        .filter(|q| *q > 0.0 && q.is_finite())
        .ok_or(ParseError::BadField {
            field: "order.quantity",
            problem: "must be a number greater than 0",
        })?;
    let price = match order.get("price") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_f64().filter(|p| *p > 0.0 && p.is_finite()).ok_or(
            ParseError::BadField {
                field: "order.price",
                problem: "must be a number greater than 0",
            },
        )?),
    };
    Ok(Order {
        symbol: string(order, "symbol").map_err(|err| rename(err, "order.symbol"))?,
        side,
        quantity,
        price,
    })
}

/// Nested fields are reported with their dotted path.
fn rename(err: ParseError, path: &'static str) -> ParseError {
    match err {
        ParseError::MissingField(_) => ParseError::MissingField(path),
        ParseError::BadField { problem, .. } => ParseError::BadField {
            field: path,
            problem,
        },
        other => other,
    }
}

fn account(map: &Map<String, Value>) -> Result<Account, ParseError> {
    let account = match map.get("account") {
        None | Some(Value::Null) => return Err(ParseError::MissingField("account")),
        Some(Value::Object(account)) => account,
        Some(_) => {
            return Err(ParseError::BadField {
                field: "account",
                problem: "must be an object",
            });
        }
    };
    Ok(Account {
        broker_name: string(account, "broker_name")
            .map_err(|err| rename(err, "account.broker_name"))?,
        broker_type: string(account, "broker_type")
            .map_err(|err| rename(err, "account.broker_type"))?,
        simulation: account
            .get("simulation")
            .ok_or(ParseError::MissingField("account.simulation"))?
            .as_bool()
            .ok_or(ParseError::BadField {
                field: "account.simulation",
                problem: "must be true or false",
            })?,
        account_id: string(account, "account_id")
            .map_err(|err| rename(err, "account.account_id"))?,
    })
}

/// Parses a request.
pub fn parse_request(text: &str) -> Result<Request, InvalidRequest> {
    let invalid = |request_id: Option<String>| move |error| InvalidRequest { request_id, error };
    let map = object(text).map_err(invalid(None))?;
    let request_id = id(&map, "request_id").map_err(invalid(None))?;
    let parse = || -> Result<Request, ParseError> {
        let action = match string(&map, "action")?.as_str() {
            "place_order" => Action::PlaceOrder(order(&map)?),
            _ => return Err(ParseError::UnknownAction),
        };
        let expires_at = match map.get("expires_at") {
            None | Some(Value::Null) => None,
            Some(value) => Some(value.as_u64().ok_or(ParseError::BadField {
                field: "expires_at",
                problem: "must be unix milliseconds (a whole number)",
            })?),
        };
        Ok(Request {
            request_id: request_id.clone(),
            account: account(&map)?,
            action,
            expires_at,
        })
    };
    parse().map_err(invalid(Some(request_id.clone())))
}

/// The `request_id` of a request too long to parse, read from its first
/// bytes without parsing the body: the first `"request_id"` key followed by a
/// plain JSON string (no escapes) that is a valid id. `None` when there is no
/// such thing in `head`; the request is then only dead-lettered.
pub fn sniff_request_id(head: &[u8]) -> Option<String> {
    sniff_id(head, "request_id")
}

/// [`sniff_request_id`] for any id field (a claim's `claim_id`).
pub fn sniff_id(head: &[u8], field: &str) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let key = format!("\"{field}\"");
    let after = &text[text.find(&key)? + key.len()..];
    let after = after.trim_start().strip_prefix(':')?.trim_start();
    let value = after.strip_prefix('"')?;
    let end = value.find('"')?;
    let candidate = &value[..end];
    let valid = !candidate.is_empty()
        && candidate.len() <= 200
        && !candidate.contains('\\')
        && !candidate
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == char::REPLACEMENT_CHARACTER);
    valid.then(|| candidate.to_owned())
}

/// Answer status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Done; see `result`.
    Ok,
    /// Failed; see `error`.
    Error,
}

/// Why a request failed, for programs (`error` is for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Its `expires_at` passed before it ran; not executed.
    Expired,
    /// Sent to the broker, whose outcome the broker could not confirm either
    /// way: it may have executed. Look it up by client order id (= request id).
    InDoubt,
    /// The request could not be used (bad field, unknown action or broker).
    Invalid,
    /// The broker refused it or could not be reached; not executed.
    Broker,
    /// Not produced since a broker may book an order after its call timed
    /// out: a timeout whose lookup finds nothing is answered `in_doubt`. Kept
    /// so that readers of older responses still parse the code.
    Timeout,
    /// The user's queue held more than `USER_QUEUE_MAX` requests: answered at
    /// once, not executed.
    Overloaded,
    /// The broker already holds an order with this client order id (an earlier
    /// request with the same id whose record has expired); not executed again.
    Duplicate,
    /// The request was longer than `REQUEST_MAX_BYTES`: answered without being
    /// parsed; not executed.
    TooLarge,
    /// The request was taken `REQUEST_MAX_DELIVERIES` times without a final
    /// answer (it stops every worker that takes it) and the broker holds no
    /// order under its id: settled without running it again; not executed.
    Poison,
}

impl ErrorCode {
    /// The `error_code` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Expired => "expired",
            ErrorCode::InDoubt => "in_doubt",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Broker => "broker",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Duplicate => "duplicate",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Poison => "poison",
        }
    }
}

/// The answer written to `trading:response:{user_id}:{request_id}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    /// The request answered.
    pub request_id: String,
    /// The user whose request this answers: request ids are chosen by the API,
    /// so an API that reads `trading:response:{user_id}:{request_id}` checks it is its
    /// own user's (docs/messages.md). Absent only on responses written before
    /// it existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// `ok` or `error`.
    pub status: Status,
    /// What the broker returned (on `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// What went wrong (on `error`), never a secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why (on `error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
}

impl Response {
    /// A successful answer.
    pub fn ok(request_id: &str, result: Value) -> Self {
        Response {
            request_id: request_id.to_owned(),
            user_id: None,
            status: Status::Ok,
            result: Some(result),
            error: None,
            error_code: None,
        }
    }

    /// A failed answer.
    pub fn error(request_id: &str, code: ErrorCode, error: impl Into<String>) -> Self {
        Response {
            request_id: request_id.to_owned(),
            user_id: None,
            status: Status::Error,
            result: None,
            error: Some(error.into()),
            error_code: Some(code),
        }
    }

    /// The same answer, naming the user it belongs to.
    pub fn for_user(mut self, user_id: &str) -> Self {
        self.user_id = Some(user_id.to_owned());
        self
    }

    /// The JSON body.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            // Serialising plain strings and JSON values cannot fail; keep a valid answer anyway.
            format!(r#"{{"request_id":{:?},"status":"error"}}"#, self.request_id)
        })
    }
}

/// A control message (list `worker:control:{user_id}:messages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMessage {
    /// Close connections, re-read `credentials:{user_id}`, reconnect lazily.
    ReloadCredentials,
    /// Graceful exit.
    Shutdown,
}

/// Parses a control message.
pub fn parse_control(text: &str) -> Result<ControlMessage, ParseError> {
    let map = object(text)?;
    match string(&map, "type")?.as_str() {
        "reload_credentials" => Ok(ControlMessage::ReloadCredentials),
        "shutdown" => Ok(ControlMessage::Shutdown),
        _ => Err(ParseError::UnknownControl),
    }
}

/// The body pushed to a `…:dead` list: the original text (never decrypted
/// secrets: claims carry credentials only encrypted), the reason and the time.
pub fn dead_letter(reason: &str, message: &str, at_unix_ms: u64) -> String {
    serde_json::json!({"reason": reason, "message": message, "at": at_unix_ms}).to_string()
}

/// [`dead_letter`] for a message as Redis holds it, which need not be UTF-8:
/// such a body keeps a readable `message` (invalid bytes replaced) and the
/// exact bytes in `message_base64`, so nothing is lost.
pub fn dead_letter_raw(reason: &str, message: &[u8], at_unix_ms: u64) -> String {
    if reason == dead_reason::TOO_LARGE {
        // Whatever step dead-letters an over-long message keeps its head only.
        return dead_letter_truncated(reason, message, message.len() as u64, at_unix_ms);
    }
    match std::str::from_utf8(message) {
        Ok(text) => dead_letter(reason, text, at_unix_ms),
        Err(_) => {
            use base64::Engine as _;
            serde_json::json!({
                "reason": reason,
                "message": String::from_utf8_lossy(message),
                "message_base64": base64::engine::general_purpose::STANDARD.encode(message),
                "at": at_unix_ms,
            })
            .to_string()
        }
    }
}

/// Dead-letter reasons that programs match on exactly (the others are text
/// for people, naming fields, never values).
pub mod dead_reason {
    /// A request whose id has a record of another user's request: nothing of
    /// that request changes, nothing is executed, nothing is answered.
    pub const FOREIGN_REQUEST_ID: &str = "foreign_request_id";
    /// A message longer than `REQUEST_MAX_BYTES`, kept truncated to
    /// [`super::DEAD_LETTER_HEAD_BYTES`] with its original `length`.
    pub const TOO_LARGE: &str = "too_large";
}

/// How much of an over-long message a dead letter keeps: enough to see what
/// it was, never enough to grow Redis by the message's size.
pub const DEAD_LETTER_HEAD_BYTES: usize = 4096;

/// [`dead_letter_raw`] for a message longer than the bound: `head` is its
/// first bytes (at most [`DEAD_LETTER_HEAD_BYTES`]), `length` its full size;
/// `truncated` says the message is not whole.
pub fn dead_letter_truncated(reason: &str, head: &[u8], length: u64, at_unix_ms: u64) -> String {
    let head = &head[..head.len().min(DEAD_LETTER_HEAD_BYTES)];
    serde_json::json!({
        "reason": reason,
        "message": String::from_utf8_lossy(head),
        "length": length,
        "truncated": true,
        "at": at_unix_ms,
    })
    .to_string()
}

mod stored;
pub use stored::{MarkValue, PaperOrder, metadata, record};

#[cfg(test)]
mod tests;
