//! The typed lease record and its derived state.

use serde::{Deserialize, Serialize};

use crate::schema::RESERVED_PREFIX;

/// One lease record, as decoded from the lease table.
///
/// The first six fields are the original lease specification's schema; the rest are optional extras that
/// leasehold writes and no reader may require.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Logical stream or user (partition key).
    pub stream_id: String,
    /// Current holder; `None` when released or never acquired.
    pub owner_id: Option<String>,
    /// Expiry in unix ms; 0 when released or never acquired.
    pub lease_expires_at: i64,
    /// Incremented on every acquire; 0 when never acquired.
    pub fence_token: u64,
    /// Last sequence confirmed by the sink; `None` when nothing was ever confirmed.
    pub checkpoint: Option<u64>,
    /// Last write, unix ms.
    pub updated_at: Option<i64>,
    /// When the current holder acquired, unix ms.
    pub acquired_at: Option<i64>,
    /// The most recent holder, kept across a release.
    pub last_owner: Option<String>,
    /// The holder before the current one.
    pub previous_owner: Option<String>,
    /// The previous holder's expiry at the moment of the current acquire (0 after a release).
    pub previous_expires_at: Option<i64>,
    /// When the lease was last released, unix ms.
    pub released_at: Option<i64>,
    /// When the checkpoint last moved, unix ms.
    pub checkpoint_at: Option<i64>,
    /// The worker the last release handed the stream to, if that release
    /// was a graceful hand-off (advice to scanning peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_to: Option<String>,
    /// Presence records only: where the worker's sidecar answers (untrusted:
    /// anyone who can write the table chooses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_url: Option<String>,
    /// Presence records only: the UDP address (`IP:PORT`) where the worker
    /// takes pushed hand-offs (untrusted, like `sidecar_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_addr: Option<String>,
    /// Session mode only: the token of the owner's session record this stream
    /// was acquired under (the stream lives as long as that session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<u64>,
    /// Assigned discovery only: the worker the assigner wants to hold this
    /// stream (advice: the conditional acquire decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<String>,
    /// Presence records only: the worker's `MAX_STREAMS` (untrusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<u64>,
}

/// Ownership state of a lease at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Held, and not yet past `lease_expires_at`.
    Owned,
    /// Has an owner whose lease ran out: anyone may take it over.
    Expired,
    /// No owner (never acquired, or released).
    Unowned,
}

impl LeaseState {
    /// The label used in metrics and JSON (`owned`, `expired`, `unowned`).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Owned => "owned",
            LeaseState::Expired => "expired",
            LeaseState::Unowned => "unowned",
        }
    }
}

impl Lease {
    /// The worker other than `me` that a graceful hand-off released this
    /// unowned stream to less than `grace_ms` ago: scanning peers leave it
    /// to that worker until then (its successor subscribed ahead; anyone
    /// else would start cold, with a gap on a live upstream).
    pub fn left_to(&self, me: &str, now_ms: i64, grace_ms: i64) -> Option<&str> {
        let successor = self.handed_to.as_deref()?;
        let released_at = self.released_at?;
        (self.owner_id.is_none()
            && successor != me
            && now_ms < released_at.saturating_add(grace_ms))
        .then_some(successor)
    }

    /// A record for a stream nobody has touched yet.
    pub fn unowned(stream_id: impl Into<String>) -> Self {
        Lease {
            stream_id: stream_id.into(),
            owner_id: None,
            lease_expires_at: 0,
            fence_token: 0,
            checkpoint: None,
            updated_at: None,
            acquired_at: None,
            last_owner: None,
            previous_owner: None,
            previous_expires_at: None,
            released_at: None,
            checkpoint_at: None,
            handed_to: None,
            sidecar_url: None,
            handoff_addr: None,
            session_token: None,
            assignee: None,
            max_streams: None,
        }
    }

    /// Ownership state as seen at `now_ms` (unix ms).
    pub fn state(&self, now_ms: i64) -> LeaseState {
        match &self.owner_id {
            None => LeaseState::Unowned,
            Some(_) if self.lease_expires_at >= now_ms => LeaseState::Owned,
            Some(_) => LeaseState::Expired,
        }
    }

    /// Whether this record is a stream (not a reserved `leasehold#` record).
    pub fn is_stream(&self) -> bool {
        !self.stream_id.starts_with(RESERVED_PREFIX)
    }

    /// How long the stream had no valid owner before the current acquire, if the
    /// record says (ms; 0 when the previous lease was still valid or there was none).
    pub fn takeover_gap_ms(&self) -> Option<i64> {
        let acquired_at = self.acquired_at?;
        let unowned_since = match self.previous_expires_at? {
            0 => self.released_at?,
            expired_at => expired_at,
        };
        Some((acquired_at - unowned_since).max(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_follows_owner_and_expiry() {
        let mut lease = Lease::unowned("s");
        assert_eq!(lease.state(10), LeaseState::Unowned);
        lease.owner_id = Some("w".into());
        lease.lease_expires_at = 10;
        assert_eq!(lease.state(10), LeaseState::Owned);
        assert_eq!(lease.state(11), LeaseState::Expired);
    }

    #[test]
    fn reserved_records_are_not_streams() {
        assert!(!Lease::unowned("leasehold#observer").is_stream());
        assert!(Lease::unowned("orders").is_stream());
    }

    #[test]
    fn takeover_gap_uses_expiry_or_release_time() {
        let mut lease = Lease::unowned("s");
        lease.acquired_at = Some(5_000);
        lease.previous_expires_at = Some(3_000);
        assert_eq!(lease.takeover_gap_ms(), Some(2_000));
        lease.previous_expires_at = Some(0);
        lease.released_at = Some(4_500);
        assert_eq!(lease.takeover_gap_ms(), Some(500));
        lease.previous_expires_at = Some(9_000);
        assert_eq!(lease.takeover_gap_ms(), Some(0));
    }
}
