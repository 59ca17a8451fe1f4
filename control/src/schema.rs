//! The lease table schema: attribute names, raw items, and decoding.
//!
//! The table must stay readable by, and safely shared with, the original
//! `lease_demo.py`, so the six original attributes keep their names and DynamoDB types
//! exactly. Extra attributes leasehold writes are optional for every reader.
//! Both stores keep raw items in this representation and decode them here, so the
//! in-memory store fails on a malformed record exactly where DynamoDB would.

use std::collections::BTreeMap;

use crate::lease::Lease;

/// Partition key (S): the logical stream or user.
pub const STREAM_ID: &str = "stream_id";
/// Current holder (S); absent when released or never acquired.
pub const OWNER_ID: &str = "owner_id";
/// Expiry (N, unix ms); the only takeover criterion (never DynamoDB TTL).
pub const LEASE_EXPIRES_AT: &str = "lease_expires_at";
/// Fence token (N), incremented on every acquire.
pub const FENCE_TOKEN: &str = "fence_token";
/// Last sequence confirmed by the sink (N).
pub const CHECKPOINT: &str = "checkpoint";
/// Last write (N, unix ms).
pub const UPDATED_AT: &str = "updated_at";

/// Extra (N, unix ms): when the current holder acquired.
pub const ACQUIRED_AT: &str = "acquired_at";
/// Extra (S): the most recent holder; unlike `owner_id`, kept across a release.
pub const LAST_OWNER: &str = "last_owner";
/// Extra (S): the holder before the current one ("" when there was none).
pub const PREVIOUS_OWNER: &str = "previous_owner";
/// Extra (N, unix ms): the previous holder's `lease_expires_at` at the moment of
/// this acquire (0 after a release); used to measure the takeover gap.
pub const PREVIOUS_EXPIRES_AT: &str = "previous_expires_at";
/// Extra (N, unix ms): when the lease was last released.
pub const RELEASED_AT: &str = "released_at";
/// Extra (N, unix ms): when the checkpoint last moved.
pub const CHECKPOINT_AT: &str = "checkpoint_at";
/// Extra (S): the worker a graceful hand-off released the stream to (set by
/// that release, removed by any other). Scanning peers leave such a stream to
/// it for a while, so the successor that subscribed ahead takes it, not
/// whoever scans first. Advice only: the acquire condition ignores it.
pub const HANDED_TO: &str = "handed_to";
/// Extra (S), presence records only: the base URL of the worker's sidecar
/// (`http://10.0.3.7:9464`), which is how the dashboard finds sidecars. Written
/// by the acquire that announces the worker; untrusted for every reader.
pub const SIDECAR_URL: &str = "sidecar_url";
/// Extra (S), presence records only: the UDP `IP:PORT` where the worker takes
/// pushed hand-offs (a draining peer names the stream it just released).
/// Written by the announcing acquire; untrusted: a datagram only prompts a
/// conditional acquire.
pub const HANDOFF_ADDR: &str = "handoff_addr";

/// Extra (N), presence records only: the worker's `MAX_STREAMS`, so the
/// assigner never advises it more streams than it will hold. Written by the
/// announcing acquire; untrusted like `sidecar_url` (a wrong value only skews
/// the advice).
pub const MAX_STREAMS: &str = "max_streams";

/// Extra (N), session mode only: the token of the owner's session record
/// (`leasehold#session#{owner_id}`) the stream was acquired under. The stream
/// is held while that record is held by the same owner with this token and
/// not expired; a record without it is a per-stream lease.
pub const SESSION_TOKEN: &str = "session_token";
/// Extra (S), the mode record only: `per-stream` or `session`.
pub const LEASE_MODE: &str = "lease_mode";
/// Extra (S), stream records only, assigned discovery: the worker the elected
/// assigner wants to hold the stream. Advice, never ownership: only the
/// conditional acquire decides who holds a stream.
pub const ASSIGNEE: &str = "assignee";
/// The lease table's global secondary index on `assignee` (hash) and
/// `stream_id` (range), keys only: a worker finds the streams assigned to it
/// with one `Query`, whose read units grow with its own streams, not the
/// table's. Sparse: records without `assignee` are not in it.
pub const ASSIGNEE_INDEX: &str = "assignee-index";

/// Prefix of records that are not streams (observer lease, presence records);
/// stream views and counts leave them out.
pub const RESERVED_PREFIX: &str = "leasehold#";
/// Prefix of stream workers' presence leases (`leasehold#worker#{owner_id}`): a
/// worker holds one while it runs, so peers can count live workers even when
/// they hold no stream yet.
pub const WORKER_PRESENCE_PREFIX: &str = "leasehold#worker#";
/// The observer lease: the one sidecar holding it publishes the cluster gauges.
pub const OBSERVER_LEASE: &str = "leasehold#observer";
/// The hand-off doorbell: draining workers bump its counter so peers rescan now.
pub const HANDOFF_DOORBELL: &str = "leasehold#handoff";
/// The assigner lease (assigned discovery): the one stream worker holding it
/// scans the table and writes every stream's `assignee`.
pub const ASSIGNER_LEASE: &str = "leasehold#assigner";

/// Prefix of session records (`leasehold#session#{owner_id}`): in session mode
/// a worker renews this one record, and every stream it holds lives as long
/// as the record does.
pub const SESSION_PREFIX: &str = "leasehold#session#";
/// The record declaring the table's lease mode (`lease_mode`): workers of the
/// other mode refuse to run.
pub const MODE_RECORD: &str = "leasehold#mode";

/// The session record of a worker (session mode).
pub fn session_record(owner_id: &str) -> String {
    format!("{SESSION_PREFIX}{owner_id}")
}

/// The presence record of a worker.
pub fn worker_presence(owner_id: &str) -> String {
    format!("{WORKER_PRESENCE_PREFIX}{owner_id}")
}

/// One attribute value, in the two DynamoDB types the schema uses.
///
/// Numbers stay strings, as on the wire, so a value that does not parse is
/// reported as malformed instead of being silently coerced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    /// DynamoDB `S`.
    S(String),
    /// DynamoDB `N`, in its decimal string form.
    N(String),
    /// Any other DynamoDB type (B, BOOL, L, M, NULL, sets); never valid in this schema.
    Other(&'static str),
}

impl AttrValue {
    /// A number attribute from an integer.
    pub fn n(value: impl ToString) -> Self {
        AttrValue::N(value.to_string())
    }

    /// A string attribute.
    pub fn s(value: impl Into<String>) -> Self {
        AttrValue::S(value.into())
    }

    fn type_name(&self) -> &'static str {
        match self {
            AttrValue::S(_) => "S",
            AttrValue::N(_) => "N",
            AttrValue::Other(name) => name,
        }
    }
}

/// A record as stored: attribute name to value.
pub type RawItem = BTreeMap<String, AttrValue>;

/// A record that cannot be read as a lease, naming the stream and the attribute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed lease record {stream_id:?}: attribute `{attribute}` {problem}")]
pub struct MalformedItem {
    /// The record's key, or `"?"` when the key itself is the problem.
    pub stream_id: String,
    /// The attribute that could not be read.
    pub attribute: String,
    /// What is wrong with it (type or value), never the value of a secret.
    pub problem: String,
}

/// Decodes a raw item into a [`Lease`].
pub fn decode(item: &RawItem) -> Result<Lease, MalformedItem> {
    let stream_id = match item.get(STREAM_ID) {
        Some(AttrValue::S(s)) => s.clone(),
        other => {
            return Err(MalformedItem {
                stream_id: "?".into(),
                attribute: STREAM_ID.into(),
                problem: describe_wrong_type(other, "S"),
            });
        }
    };
    let reader = Reader {
        item,
        stream_id: &stream_id,
    };
    Ok(Lease {
        owner_id: reader.string(OWNER_ID)?,
        lease_expires_at: reader.int(LEASE_EXPIRES_AT)?.unwrap_or(0),
        fence_token: reader.uint(FENCE_TOKEN)?.unwrap_or(0),
        checkpoint: reader.uint(CHECKPOINT)?,
        updated_at: reader.int(UPDATED_AT)?,
        acquired_at: reader.int(ACQUIRED_AT)?,
        last_owner: reader.string(LAST_OWNER)?,
        previous_owner: reader.string(PREVIOUS_OWNER)?.filter(|s| !s.is_empty()),
        previous_expires_at: reader.int(PREVIOUS_EXPIRES_AT)?,
        released_at: reader.int(RELEASED_AT)?,
        checkpoint_at: reader.int(CHECKPOINT_AT)?,
        handed_to: reader.string(HANDED_TO)?.filter(|s| !s.is_empty()),
        sidecar_url: reader.string(SIDECAR_URL)?.filter(|s| !s.is_empty()),
        handoff_addr: reader.string(HANDOFF_ADDR)?.filter(|s| !s.is_empty()),
        session_token: reader.uint(SESSION_TOKEN)?,
        assignee: reader.string(ASSIGNEE)?.filter(|s| !s.is_empty()),
        max_streams: reader.uint(MAX_STREAMS)?,
        stream_id,
    })
}

/// The key a raw item would have, even when the rest of it is malformed.
pub fn item_key(item: &RawItem) -> Option<&str> {
    match item.get(STREAM_ID) {
        Some(AttrValue::S(s)) => Some(s),
        _ => None,
    }
}

fn describe_wrong_type(found: Option<&AttrValue>, expected: &str) -> String {
    match found {
        None => "is missing".into(),
        Some(v) => format!("has type {} (expected {expected})", v.type_name()),
    }
}

struct Reader<'a> {
    item: &'a RawItem,
    stream_id: &'a str,
}

impl Reader<'_> {
    fn malformed(&self, attribute: &str, problem: String) -> MalformedItem {
        MalformedItem {
            stream_id: self.stream_id.to_owned(),
            attribute: attribute.to_owned(),
            problem,
        }
    }

    fn string(&self, name: &str) -> Result<Option<String>, MalformedItem> {
        match self.item.get(name) {
            None => Ok(None),
            Some(AttrValue::S(s)) => Ok(Some(s.clone())),
            other => Err(self.malformed(name, describe_wrong_type(other, "S"))),
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, MalformedItem> {
        match self.item.get(name) {
            None => Ok(None),
            Some(AttrValue::N(n)) => n
                .parse::<T>()
                .map(Some)
                .map_err(|_| self.malformed(name, format!("is not an integer in range ({n:?})"))),
            other => Err(self.malformed(name, describe_wrong_type(other, "N"))),
        }
    }

    fn int(&self, name: &str) -> Result<Option<i64>, MalformedItem> {
        self.number(name)
    }

    fn uint(&self, name: &str) -> Result<Option<u64>, MalformedItem> {
        self.number(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_item() -> RawItem {
        RawItem::from([
            (STREAM_ID.into(), AttrValue::s("orders-us-east")),
            (OWNER_ID.into(), AttrValue::s("worker-a")),
            (LEASE_EXPIRES_AT.into(), AttrValue::n(1_700_000_030_000_i64)),
            (FENCE_TOKEN.into(), AttrValue::n(3)),
            (UPDATED_AT.into(), AttrValue::n(1_700_000_000_000_i64)),
        ])
    }

    #[test]
    fn decodes_the_seed_demo_record() {
        let lease = decode(&seed_item()).unwrap();
        assert_eq!(lease.stream_id, "orders-us-east");
        assert_eq!(lease.owner_id.as_deref(), Some("worker-a"));
        assert_eq!(lease.fence_token, 3);
        assert_eq!(lease.checkpoint, None);
        assert_eq!(lease.lease_expires_at, 1_700_000_030_000);
    }

    #[test]
    fn a_string_fence_token_names_the_attribute() {
        let mut item = seed_item();
        item.insert(FENCE_TOKEN.into(), AttrValue::s("3"));
        let err = decode(&item).unwrap_err();
        assert_eq!(err.attribute, FENCE_TOKEN);
        assert_eq!(err.stream_id, "orders-us-east");
        assert!(err.to_string().contains("expected N"), "{err}");
    }

    #[test]
    fn a_fractional_number_is_malformed_not_truncated() {
        let mut item = seed_item();
        item.insert(CHECKPOINT.into(), AttrValue::n("1.5"));
        assert_eq!(decode(&item).unwrap_err().attribute, CHECKPOINT);
    }

    #[test]
    fn a_missing_key_is_malformed() {
        let mut item = seed_item();
        item.remove(STREAM_ID);
        let err = decode(&item).unwrap_err();
        assert_eq!(err.attribute, STREAM_ID);
        assert_eq!(err.problem, "is missing");
    }

    #[test]
    fn an_empty_previous_owner_means_none() {
        let mut item = seed_item();
        item.insert(PREVIOUS_OWNER.into(), AttrValue::s(""));
        assert_eq!(decode(&item).unwrap().previous_owner, None);
    }
}
