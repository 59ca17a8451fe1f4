//! DynamoDB lease store: the original conditional expressions, plus the lease rules'
//! additions (skew margin on takeover, release that keeps token and checkpoint).
//!
//! Endpoint, region and credentials come from the AWS SDK's own configuration
//! (`AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_DYNAMODB`, profiles, the ECS
//! task role), so a local DynamoDB-compatible server needs no code path of its own.
//! The SDK's retries are disabled: the keeper owns retry policy (full-jitter backoff
//! bounded by the holder's deadline), and a second hidden retry layer would let a
//! renew outlive it.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use leasehold_platform::iam::{self, IamAction, dynamodb};

use super::{
    AcquireRequest, CheckpointRequest, Consistency, Holder, LeaseError, LeasePage, LeaseReader,
    LeaseStore, LiftRequest, ReleaseRequest, RenewRequest, TakeoverRequest, check_reserved,
    refusal,
};
use crate::lease::Lease;
use crate::schema::{self, AttrValue, RawItem};

/// The original specification's acquire condition, verbatim.
pub const ACQUIRE_CONDITION: &str =
    "attribute_not_exists(owner_id) OR lease_expires_at < :now OR owner_id = :owner";
/// The original specification's acquire update, plus extras evaluated against the record as it was
/// before this write (previous holder and expiry, for the takeover gap).
pub const ACQUIRE_UPDATE: &str = "SET previous_owner = if_not_exists(last_owner, :none), \
     previous_expires_at = if_not_exists(lease_expires_at, :zero), \
     owner_id = :owner, last_owner = :owner, lease_expires_at = :expires, \
     fence_token = if_not_exists(fence_token, :zero) + :one, \
     acquired_at = :updated, updated_at = :updated";
/// A session takeover's update: the acquire's, with the previous expiry the
/// holder's session's (the stream's own is its acquire-time one).
pub const TAKEOVER_UPDATE: &str = "SET previous_owner = if_not_exists(last_owner, :none), \
     previous_expires_at = :from_expires, \
     owner_id = :owner, last_owner = :owner, lease_expires_at = :expires, \
     fence_token = if_not_exists(fence_token, :zero) + :one, \
     acquired_at = :updated, updated_at = :updated";
/// A session takeover's update when the session's end is unknown: no
/// previous expiry (no takeover gap) rather than a wrong one; ends with
/// [`TAKEOVER_UNKNOWN_END_REMOVE`] after the acquire's own `SET` additions.
pub const TAKEOVER_UNKNOWN_END_UPDATE: &str = "SET previous_owner = if_not_exists(last_owner, :none), \
     owner_id = :owner, last_owner = :owner, lease_expires_at = :expires, \
     fence_token = if_not_exists(fence_token, :zero) + :one, \
     acquired_at = :updated, updated_at = :updated";
/// Closes [`TAKEOVER_UNKNOWN_END_UPDATE`].
pub const TAKEOVER_UNKNOWN_END_REMOVE: &str = " REMOVE previous_expires_at";
/// Added to the acquire update when the acquire announces a sidecar (presence records).
pub const ACQUIRE_SIDECAR_UPDATE: &str = ", sidecar_url = :sidecar_url";
/// Appended to the acquire update by an announcing acquire with a hand-off address.
pub const ACQUIRE_HANDOFF_UPDATE: &str = ", handoff_addr = :handoff_addr";
/// What an announcing acquire adds for a worker's `MAX_STREAMS`.
pub const ACQUIRE_MAX_STREAMS_UPDATE: &str = ", max_streams = :max_streams";
/// Session mode's plain acquire condition ([`crate::protocol::session_acquirable`]):
/// never from another session; a per-stream holder's lapsed lease still yields.
pub const SESSION_ACQUIRE_CONDITION: &str = "attribute_not_exists(owner_id) OR owner_id = :owner \
     OR (attribute_not_exists(session_token) AND lease_expires_at < :now)";
/// Appended to the acquire update in session mode: the session the stream lives by.
pub const ACQUIRE_SESSION_UPDATE: &str = ", session_token = :session_token";
/// Appended to a per-stream acquire: whatever session held it before is no longer its clock.
pub const ACQUIRE_PER_STREAM_REMOVE: &str = " REMOVE session_token";
/// The takeover transaction's check on the holder's session record
/// ([`crate::protocol::session_ended`]).
pub const SESSION_ENDED_CONDITION: &str = "attribute_not_exists(owner_id) \
     OR attribute_not_exists(fence_token) OR fence_token <> :from_session \
     OR lease_expires_at < :now";
/// The takeover transaction's condition on the stream: still that session's, not moved since.
pub const TAKEOVER_CONDITION: &str =
    "owner_id = :from_owner AND session_token = :from_session AND fence_token = :from_token";
/// The mode record: the first declaration stays.
pub const DECLARE_MODE_UPDATE: &str = "SET lease_mode = if_not_exists(lease_mode, :mode), \
     updated_at = if_not_exists(updated_at, :now)";
/// The original specification's renew condition, verbatim.
pub const RENEW_CONDITION: &str =
    "owner_id = :owner AND fence_token = :token AND lease_expires_at >= :now";
/// Added to the renew condition when the renew carries a checkpoint.
pub const CHECKPOINT_NOT_BEHIND: &str =
    "(attribute_not_exists(checkpoint) OR checkpoint <= :checkpoint)";
/// A renew never shortens the stored expiry (a holder whose clock stepped back
/// would otherwise cut its own lease short).
pub const EXPIRY_NOT_SHORTENED: &str = "lease_expires_at <= :expires";
/// The original specification's renew update.
pub const RENEW_UPDATE: &str = "SET lease_expires_at = :expires, updated_at = :now";
/// Added to the renew update when the renew carries a checkpoint.
pub const RENEW_CHECKPOINT_UPDATE: &str = ", checkpoint = :checkpoint, checkpoint_at = :now";
/// Checkpoint and release are conditional on owner and token.
pub const HOLDER_CONDITION: &str = "owner_id = :owner AND fence_token = :token";
/// Checkpoint update.
pub const CHECKPOINT_UPDATE: &str =
    "SET checkpoint = :checkpoint, checkpoint_at = :now, updated_at = :now";
/// Release update: no owner, expiry 0, token and checkpoint kept; the
/// successor of a graceful hand-off named (`""` for none: one expression
/// whether or not there is one).
pub const RELEASE_UPDATE: &str = "REMOVE owner_id SET lease_expires_at = :zero, \
     released_at = :now, updated_at = :now, handed_to = :successor";
/// Release that also records the holder's last checkpoint (a drain).
pub const RELEASE_WITH_CHECKPOINT_UPDATE: &str = "REMOVE owner_id SET lease_expires_at = :zero, \
     released_at = :now, updated_at = :now, handed_to = :successor, \
     checkpoint = :checkpoint, checkpoint_at = :now";
/// Force release and renew-free updates only apply to records that exist.
pub const RECORD_EXISTS: &str = "attribute_exists(stream_id)";
/// Doorbell update: a counter on a reserved record.
pub const BUMP_UPDATE: &str =
    "SET fence_token = if_not_exists(fence_token, :zero) + :one, updated_at = :now";
/// Lift only above the current token, and only for its holder.
pub const LIFT_CONDITION: &str = "owner_id = :owner AND fence_token = :token AND fence_token < :to";
/// Fence-regression recovery: the token jumps past a sink's fence.
pub const LIFT_UPDATE: &str = "SET fence_token = :to, updated_at = :now";
/// Added to the lift of a new epoch: its checkpoint, which may go back.
pub const EPOCH_CHECKPOINT_UPDATE: &str = ", checkpoint = :checkpoint, checkpoint_at = :now";
/// Register only creates.
pub const RECORD_ABSENT: &str = "attribute_not_exists(stream_id)";
/// The assigner's advice on a stream record.
pub const ASSIGN_UPDATE: &str = "SET assignee = :assignee";
/// The assigner takes its advice back.
pub const UNASSIGN_UPDATE: &str = "REMOVE assignee";

/// Leases in a DynamoDB table with a string `stream_id` partition key.
#[derive(Debug, Clone)]
pub struct DynamoLeaseStore {
    client: Client,
    table: String,
}

/// Outcome of [`DynamoLeaseStore::create_table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCreation {
    /// The table was created and is active.
    Created,
    /// A table with that name already existed; left as it was.
    AlreadyExisted,
}

impl DynamoLeaseStore {
    /// Uses an existing client.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoLeaseStore {
            client,
            table: table.into(),
        }
    }

    /// Uses the AWS SDK's configuration; build it with
    /// `leasehold_platform::aws::sdk_config(RetryPolicy::CallerRetries)`: the keeper owns retries.
    pub fn from_sdk_config(config: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        Self::new(Client::new(config), table)
    }

    /// The store an operator command opens: `LEASE_TABLE` as `lookup` has
    /// it, every problem (a missing region included) reported at once. An
    /// operator waits for an answer rather than racing a lease deadline, so
    /// the SDK's standard retries ride out throttling.
    pub async fn for_operator(
        lookup: leasehold_platform::settings::Lookup<'_>,
    ) -> Result<Self, leasehold_platform::settings::ConfigError> {
        use leasehold_platform::aws::{RetryPolicy, require_region, sdk_config};
        let mut env = leasehold_platform::settings::Env::new(lookup);
        let table = crate::settings::table_settings(&mut env);
        let sdk = sdk_config(RetryPolicy::Standard).await;
        let table = require_region(&sdk, env.finish(table))?;
        Ok(DynamoLeaseStore::from_sdk_config(&sdk, table.table))
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn sdk_error<E, R>(&self, err: SdkError<E, R>) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug,
    {
        classify_sdk_error(&self.table, err)
    }

    /// Runs an UpdateItem whose condition failure is explained by `holder`.
    async fn update(
        &self,
        stream_id: &str,
        condition: &str,
        update: &str,
        values: Vec<(&str, AttributeValue)>,
        holder: Holder<'_>,
    ) -> Result<Lease, LeaseError> {
        may(&[dynamodb::UPDATE_ITEM])?;
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(schema::STREAM_ID, AttributeValue::S(stream_id.to_owned()))
            .condition_expression(condition)
            .update_expression(update)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (name, value) in values {
            request = request.expression_attribute_values(name, value);
        }
        match request.send().await {
            Ok(output) => {
                let item = output.attributes.ok_or_else(|| LeaseError::Rejected {
                    message: "UpdateItem returned no attributes".into(),
                })?;
                Ok(schema::decode(&to_raw(item))?)
            }
            Err(err) => {
                let current = err
                    .as_service_error()
                    .and_then(|e| match e {
                        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(ccf) => {
                            Some(ccf.item().cloned())
                        }
                        _ => None,
                    });
                match current {
                    Some(Some(item)) => Err(refusal(schema::decode(&to_raw(item))?, holder)),
                    Some(None) => Err(LeaseError::NotFound {
                        stream_id: stream_id.to_owned(),
                    }),
                    None => Err(self.sdk_error(err)),
                }
            }
        }
    }
}

/// Maps an SDK error onto the store's error kinds. Messages carry the service's
/// error code and text, which never include credentials.
pub fn classify_sdk_error<E, R>(table: &str, err: SdkError<E, R>) -> LeaseError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    // One line, no `Debug` dump: the table, then what went wrong.
    let message = match &err {
        SdkError::ServiceError(service) => format!(
            "DynamoDB table {table}: {}: {}",
            service.err().code().unwrap_or("error"),
            service.err().message().unwrap_or("no message")
        ),
        SdkError::TimeoutError(_) => format!("DynamoDB table {table}: no answer in time"),
        SdkError::DispatchFailure(failure) => format!(
            "DynamoDB table {table}: {}",
            failure.as_connector_error().map_or_else(
                || "no answer".to_owned(),
                |cause| { leasehold_platform::aws::unanswered(cause) }
            )
        ),
        SdkError::ResponseError(_) => format!("DynamoDB table {table}: an unreadable answer"),
        _ => format!("DynamoDB table {table}: {}", DisplayErrorContext(&err)),
    };
    match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            LeaseError::Transient { message }
        }
        SdkError::ServiceError(service) => match service.err().code() {
            Some("ResourceNotFoundException") => LeaseError::TableMissing {
                table: table.to_owned(),
            },
            Some(
                "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded"
                | "LimitExceededException",
            ) => LeaseError::Throttled { message },
            Some("InternalServerError" | "ServiceUnavailable" | "InternalFailure") => {
                LeaseError::Transient { message }
            }
            _ => LeaseError::Rejected { message },
        },
        _ => LeaseError::Rejected { message },
    }
}

/// The IAM actions a call is about to need, declared by the running
/// subcommand ([`leasehold_platform::iam`]); every DynamoDB request of the
/// store asks right before it is sent.
fn may(needs: &[IamAction]) -> Result<(), LeaseError> {
    iam::authorize(needs).map_err(rejected)
}

fn rejected(err: impl std::fmt::Display) -> LeaseError {
    LeaseError::Rejected {
        message: err.to_string(),
    }
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

/// Converts an SDK item into the schema's raw representation.
pub fn to_raw(item: HashMap<String, AttributeValue>) -> RawItem {
    item.into_iter()
        .map(|(name, value)| {
            let value = match value {
                AttributeValue::S(v) => AttrValue::S(v),
                AttributeValue::N(v) => AttrValue::N(v),
                AttributeValue::B(_) => AttrValue::Other("B"),
                AttributeValue::Bool(_) => AttrValue::Other("BOOL"),
                AttributeValue::L(_) => AttrValue::Other("L"),
                AttributeValue::M(_) => AttrValue::Other("M"),
                AttributeValue::Null(_) => AttrValue::Other("NULL"),
                AttributeValue::Ss(_) => AttrValue::Other("SS"),
                AttributeValue::Ns(_) => AttrValue::Other("NS"),
                AttributeValue::Bs(_) => AttrValue::Other("BS"),
                _ => AttrValue::Other("unknown"),
            };
            (name, value)
        })
        .collect()
}

/// Converts a raw item into an SDK item (raw writes in tests and tools).
pub fn from_raw(item: &RawItem) -> HashMap<String, AttributeValue> {
    item.iter()
        .filter_map(|(name, value)| {
            let value = match value {
                AttrValue::S(v) => AttributeValue::S(v.clone()),
                AttrValue::N(v) => AttributeValue::N(v.clone()),
                AttrValue::Other(_) => return None,
            };
            Some((name.clone(), value))
        })
        .collect()
}

/// The values every acquire expression uses.
fn acquire_values(r: &AcquireRequest) -> Vec<(&'static str, AttributeValue)> {
    vec![
        (":owner", s(&r.owner_id)),
        (":expires", n(r.now_ms + r.lease_ms)),
        (":now", n(r.now_ms - r.skew_margin_ms)),
        (":updated", n(r.now_ms)),
        (":zero", n(0)),
        (":one", n(1)),
        (":none", s("")),
    ]
}

/// Completes an acquire's update for what the request announces and its
/// mode, and returns the condition of a plain (non-transactional) acquire.
fn acquire_expression(
    r: &AcquireRequest,
    values: &mut Vec<(&'static str, AttributeValue)>,
    update: &mut String,
) -> &'static str {
    if let Some(url) = &r.sidecar_url {
        values.push((":sidecar_url", s(url)));
        update.push_str(ACQUIRE_SIDECAR_UPDATE);
    }
    if let Some(addr) = &r.handoff_addr {
        values.push((":handoff_addr", s(addr)));
        update.push_str(ACQUIRE_HANDOFF_UPDATE);
    }
    if let Some(max) = r.max_streams {
        values.push((":max_streams", n(max)));
        update.push_str(ACQUIRE_MAX_STREAMS_UPDATE);
    }
    match r.session_token {
        Some(token) => {
            values.push((":session_token", n(token)));
            update.push_str(ACQUIRE_SESSION_UPDATE);
            SESSION_ACQUIRE_CONDITION
        }
        None => {
            update.push_str(ACQUIRE_PER_STREAM_REMOVE);
            ACQUIRE_CONDITION
        }
    }
}

fn values_map(values: Vec<(&str, AttributeValue)>) -> HashMap<String, AttributeValue> {
    values
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}

#[async_trait]
impl LeaseStore for DynamoLeaseStore {
    async fn acquire(&self, r: &AcquireRequest) -> Result<Lease, LeaseError> {
        let mut values = acquire_values(r);
        let mut update = ACQUIRE_UPDATE.to_owned();
        let condition = acquire_expression(r, &mut values, &mut update);
        self.update(&r.stream_id, condition, &update, values, Holder::none())
            .await
    }

    async fn renew(&self, r: &RenewRequest) -> Result<Lease, LeaseError> {
        let mut values = vec![
            (":owner", s(&r.owner_id)),
            (":token", n(r.fence_token)),
            (":expires", n(r.now_ms + r.lease_ms)),
            (":now", n(r.now_ms)),
        ];
        let (condition, update) = match r.checkpoint {
            Some(checkpoint) => {
                values.push((":checkpoint", n(checkpoint)));
                (
                    format!(
                        "{RENEW_CONDITION} AND {EXPIRY_NOT_SHORTENED} AND {CHECKPOINT_NOT_BEHIND}"
                    ),
                    format!("{RENEW_UPDATE}{RENEW_CHECKPOINT_UPDATE}"),
                )
            }
            None => (
                format!("{RENEW_CONDITION} AND {EXPIRY_NOT_SHORTENED}"),
                RENEW_UPDATE.to_owned(),
            ),
        };
        let holder = Holder::new(&r.owner_id, r.fence_token, r.checkpoint)
            .renewing_to(r.now_ms + r.lease_ms);
        match self
            .update(&r.stream_id, &condition, &update, values, holder)
            .await
        {
            // Still held and already running longer than asked: keep the later
            // expiry, and store the checkpoint that rode on this renew.
            Err(LeaseError::ExpiryAhead { current, .. }) => match r.checkpoint {
                Some(checkpoint) if current.checkpoint.is_none_or(|c| c < checkpoint) => {
                    self.checkpoint(&CheckpointRequest {
                        stream_id: r.stream_id.clone(),
                        owner_id: r.owner_id.clone(),
                        fence_token: r.fence_token,
                        checkpoint,
                        now_ms: r.now_ms,
                    })
                    .await
                }
                _ => Ok(*current),
            },
            other => other,
        }
    }

    async fn checkpoint(&self, r: &CheckpointRequest) -> Result<Lease, LeaseError> {
        let values = vec![
            (":owner", s(&r.owner_id)),
            (":token", n(r.fence_token)),
            (":checkpoint", n(r.checkpoint)),
            (":now", n(r.now_ms)),
        ];
        let condition = format!("{HOLDER_CONDITION} AND {CHECKPOINT_NOT_BEHIND}");
        let holder = Holder::new(&r.owner_id, r.fence_token, Some(r.checkpoint));
        self.update(&r.stream_id, &condition, CHECKPOINT_UPDATE, values, holder)
            .await
    }

    async fn release(&self, r: &ReleaseRequest) -> Result<Lease, LeaseError> {
        let mut values = vec![
            (":owner", s(&r.owner_id)),
            (":token", n(r.fence_token)),
            (":zero", n(0)),
            (":now", n(r.now_ms)),
            (":successor", s(r.successor.as_deref().unwrap_or_default())),
        ];
        let holder = Holder::new(&r.owner_id, r.fence_token, r.checkpoint);
        match r.checkpoint {
            None => {
                self.update(
                    &r.stream_id,
                    HOLDER_CONDITION,
                    RELEASE_UPDATE,
                    values,
                    holder,
                )
                .await
            }
            Some(checkpoint) => {
                values.push((":checkpoint", n(checkpoint)));
                let condition = format!("{HOLDER_CONDITION} AND {CHECKPOINT_NOT_BEHIND}");
                self.update(
                    &r.stream_id,
                    &condition,
                    RELEASE_WITH_CHECKPOINT_UPDATE,
                    values,
                    holder,
                )
                .await
            }
        }
    }

    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError> {
        let values = vec![(":zero", n(0)), (":now", n(now_ms)), (":successor", s(""))];
        self.update(
            stream_id,
            RECORD_EXISTS,
            RELEASE_UPDATE,
            values,
            Holder::none(),
        )
        .await
    }

    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError> {
        let item = super::registration_item(stream_id, now_ms);
        may(&[dynamodb::PUT_ITEM])?;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(from_raw(&item)))
            .condition_expression(RECORD_ABSENT)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) if err.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(err) => Err(self.sdk_error(err)),
        }
    }

    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError> {
        check_reserved(record_id)?;
        may(&[dynamodb::UPDATE_ITEM])?;
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(schema::STREAM_ID, s(record_id))
            .update_expression(BUMP_UPDATE)
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now_ms))
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|err| self.sdk_error(err))?;
        let item = output.attributes.ok_or_else(|| LeaseError::Rejected {
            message: "UpdateItem returned no attributes".into(),
        })?;
        Ok(schema::decode(&to_raw(item))?.fence_token)
    }

    async fn take_over(&self, r: &TakeoverRequest) -> Result<Lease, LeaseError> {
        use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
        use aws_sdk_dynamodb::types::{ConditionCheck, TransactWriteItem, Update};
        let acquire = &r.acquire;
        if acquire.session_token.is_none() {
            return Err(LeaseError::Rejected {
                message: "a takeover is made under the taker's session".into(),
            });
        }
        let session_key = schema::session_record(&r.from_owner);
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .key(schema::STREAM_ID, s(&session_key))
            .condition_expression(SESSION_ENDED_CONDITION)
            .set_expression_attribute_values(Some(values_map(vec![
                (":from_session", n(r.from_session_token)),
                (":now", n(acquire.now_ms - acquire.skew_margin_ms)),
            ])))
            .build()
            .map_err(rejected)?;
        let mut values = acquire_values(acquire);
        let mut update = match r.from_expires_at {
            Some(expired_at) => {
                values.push((":from_expires", n(expired_at)));
                TAKEOVER_UPDATE
            }
            None => TAKEOVER_UNKNOWN_END_UPDATE,
        }
        .to_owned();
        acquire_expression(acquire, &mut values, &mut update);
        if r.from_expires_at.is_none() {
            update.push_str(TAKEOVER_UNKNOWN_END_REMOVE);
        }
        // The plain acquire's `:now` is not used by the takeover condition;
        // DynamoDB refuses unused values.
        values.retain(|(name, _)| *name != ":now");
        values.extend([
            (":from_owner", s(&r.from_owner)),
            (":from_session", n(r.from_session_token)),
            (":from_token", n(r.from_fence_token)),
        ]);
        let write = Update::builder()
            .table_name(&self.table)
            .key(schema::STREAM_ID, s(&acquire.stream_id))
            .condition_expression(TAKEOVER_CONDITION)
            .update_expression(update)
            .set_expression_attribute_values(Some(values_map(values)))
            .build()
            .map_err(rejected)?;
        may(&[dynamodb::CONDITION_CHECK_ITEM, dynamodb::UPDATE_ITEM])?;
        let result = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().condition_check(check).build())
            .transact_items(TransactWriteItem::builder().update(write).build())
            .send()
            .await;
        let refused = match result {
            Ok(_) => false,
            Err(err) => match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                    let condition_failed = cancelled
                        .cancellation_reasons()
                        .iter()
                        .any(|reason| reason.code() == Some("ConditionalCheckFailed"));
                    if !condition_failed {
                        // A concurrent transaction on the same items (another
                        // taker): the outcome is theirs to decide; look again.
                        return Err(LeaseError::Transient {
                            message: format!(
                                "takeover of {:?} cancelled: {}",
                                acquire.stream_id,
                                DisplayErrorContext(&err)
                            ),
                        });
                    }
                    true
                }
                _ => return Err(self.sdk_error(err)),
            },
        };
        // A transaction returns no item: read the stream as it is now.
        let current = self.get(&acquire.stream_id).await?;
        let ours = current.owner_id.as_deref() == Some(acquire.owner_id.as_str())
            && current.session_token == acquire.session_token;
        if refused || !ours {
            return Err(refusal(current, Holder::none()));
        }
        Ok(current)
    }

    async fn declare_mode(&self, mode: &str, now_ms: i64) -> Result<String, LeaseError> {
        may(&[dynamodb::UPDATE_ITEM])?;
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(schema::STREAM_ID, s(schema::MODE_RECORD))
            .update_expression(DECLARE_MODE_UPDATE)
            .expression_attribute_values(":mode", s(mode))
            .expression_attribute_values(":now", n(now_ms))
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|err| self.sdk_error(err))?;
        match output
            .attributes
            .as_ref()
            .and_then(|item| item.get(schema::LEASE_MODE))
        {
            Some(AttributeValue::S(declared)) => Ok(declared.clone()),
            _ => Err(LeaseError::Malformed(schema::MalformedItem {
                stream_id: schema::MODE_RECORD.to_owned(),
                attribute: schema::LEASE_MODE.to_owned(),
                problem: "is not a string".to_owned(),
            })),
        }
    }

    async fn assign(&self, stream_id: &str, assignee: Option<&str>) -> Result<(), LeaseError> {
        super::check_stream(stream_id)?;
        let (update, values) = match assignee {
            Some(assignee) => (ASSIGN_UPDATE, vec![(":assignee", s(assignee))]),
            None => (UNASSIGN_UPDATE, Vec::new()),
        };
        self.update(stream_id, RECORD_EXISTS, update, values, Holder::none())
            .await
            .map(|_| ())
    }

    async fn lift_token(&self, r: &LiftRequest) -> Result<Lease, LeaseError> {
        let mut values = vec![
            (":owner", s(&r.owner_id)),
            (":token", n(r.fence_token)),
            (":to", n(r.to)),
            (":now", n(r.now_ms)),
        ];
        let update = match r.checkpoint {
            Some(checkpoint) => {
                values.push((":checkpoint", n(checkpoint)));
                format!("{LIFT_UPDATE}{EPOCH_CHECKPOINT_UPDATE}")
            }
            None => LIFT_UPDATE.to_owned(),
        };
        let holder = Holder::new(&r.owner_id, r.fence_token, None);
        self.update(&r.stream_id, LIFT_CONDITION, &update, values, holder)
            .await
    }
}

#[async_trait]
impl LeaseReader for DynamoLeaseStore {
    async fn assigned(&self, assignee: &str) -> Result<Vec<String>, LeaseError> {
        self.query_assigned(assignee).await
    }

    async fn get_with(
        &self,
        stream_id: &str,
        consistency: Consistency,
    ) -> Result<Lease, LeaseError> {
        may(&[dynamodb::GET_ITEM])?;
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(schema::STREAM_ID, s(stream_id))
            .consistent_read(consistency.is_strong())
            .send()
            .await
            .map_err(|err| self.sdk_error(err))?;
        match output.item {
            Some(item) => Ok(schema::decode(&to_raw(item))?),
            None => Err(LeaseError::NotFound {
                stream_id: stream_id.to_owned(),
            }),
        }
    }

    async fn list_with(
        &self,
        start_after: Option<&str>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<LeasePage, LeaseError> {
        let limit = i32::try_from(limit.max(1)).unwrap_or(i32::MAX);
        may(&[dynamodb::SCAN])?;
        let output = self
            .client
            .scan()
            .table_name(&self.table)
            .limit(limit)
            .consistent_read(consistency.is_strong())
            .set_exclusive_start_key(
                start_after.map(|key| HashMap::from([(schema::STREAM_ID.to_owned(), s(key))])),
            )
            .send()
            .await
            .map_err(|err| self.sdk_error(err))?;
        let leases = output
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|item| schema::decode(&to_raw(item)))
            .collect();
        let next = output
            .last_evaluated_key
            .and_then(|key| match key.get(schema::STREAM_ID) {
                Some(AttributeValue::S(id)) => Some(id.clone()),
                _ => None,
            });
        Ok(LeasePage { leases, next })
    }
}

mod table;
#[cfg(test)]
mod tests;
