//! The lease table as its readers see it: the one read model of the table's
//! records, as `leasehold_pool::read` is the pool's.
//!
//! A scan is split here, once, into streams, worker presence records, the
//! other reserved records (the observer lease, the hand-off doorbell) and
//! records that cannot be decoded; whether a record lets a caller in is
//! [`protocol::acquirable`]'s answer, never restated by a reader. The stream
//! worker's census, the sidecar's observer and the dashboard all read the table
//! through [`LeaseTable`]; it is built from a [`LeaseReader`], so nothing that
//! holds one can write.

use std::collections::HashMap;

use crate::lease::{Lease, LeaseState};
use crate::protocol;
use crate::schema::{
    MalformedItem, RESERVED_PREFIX, SESSION_PREFIX, WORKER_PRESENCE_PREFIX, session_record,
};
use crate::store::{Consistency, LeaseError, LeaseReader, list_all};

/// One scan of the lease table, classified. Each list keeps the scan's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTable {
    /// Stream records (every record outside the reserved `leasehold#` prefix).
    pub streams: Vec<Lease>,
    /// Stream workers' presence records (`leasehold#worker#{owner}`).
    pub presence: Vec<Presence>,
    /// The other reserved records: the observer lease, the hand-off doorbell,
    /// the mode record, session records.
    pub reserved: Vec<Lease>,
    /// Records that could not be decoded, reserved ones included (see
    /// [`LeaseTable::malformed_streams`] for those a stream view shows).
    pub malformed: Vec<MalformedItem>,
}

/// A stream worker's presence record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presence {
    /// The worker the record is named after (the id after the prefix).
    pub worker: String,
    /// The record (its `owner_id` is the worker while it runs).
    pub lease: Lease,
}

/// How the stream records stand at one instant: the observer's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounts {
    /// Held, not past expiry.
    pub owned: u64,
    /// Held, past expiry.
    pub expired: u64,
    /// Released, or registered and never taken.
    pub unowned: u64,
    /// Since when (unix ms) the longest-waiting stream has had no valid owner:
    /// an expired record's expiry, an unowned one's release (or last write);
    /// `None` when every stream is owned.
    pub unowned_since_ms: Option<i64>,
}

impl LeaseTable {
    /// Scans the whole table through `reader`, `page_size` records per page.
    pub async fn read(
        reader: &dyn LeaseReader,
        page_size: usize,
        consistency: Consistency,
    ) -> Result<LeaseTable, LeaseError> {
        Ok(LeaseTable::classify(
            list_all(reader, page_size, consistency).await?,
        ))
    }

    /// Sorts decoded (or undecodable) records into the table's kinds.
    ///
    /// A session-mode stream's `lease_expires_at` and `updated_at` are its
    /// session's ([`resolve_sessions`]): what every reader means by "held
    /// until" and "last renewed".
    pub fn classify(records: impl IntoIterator<Item = Result<Lease, MalformedItem>>) -> LeaseTable {
        let mut records: Vec<_> = records.into_iter().collect();
        resolve_sessions(&mut records);
        let mut table = LeaseTable::default();
        for record in records {
            match record {
                Ok(lease) if lease.is_stream() => table.streams.push(lease),
                Ok(lease) => match lease.stream_id.strip_prefix(WORKER_PRESENCE_PREFIX) {
                    Some(worker) => table.presence.push(Presence {
                        worker: worker.to_owned(),
                        lease,
                    }),
                    None => table.reserved.push(lease),
                },
                Err(item) => table.malformed.push(item),
            }
        }
        table
    }

    /// How many records the scan read, of every kind (what a scan's pacing
    /// is measured in).
    pub fn records(&self) -> usize {
        self.streams.len() + self.presence.len() + self.reserved.len() + self.malformed.len()
    }

    /// The malformed records that claim to be streams: reserved records are
    /// no stream view's business, even when they cannot be read.
    pub fn malformed_streams(&self) -> impl Iterator<Item = &MalformedItem> {
        self.malformed
            .iter()
            .filter(|item| !item.stream_id.starts_with(RESERVED_PREFIX))
    }

    /// The running workers at `now_ms`: presence records held and not past
    /// expiry, with the owner the record names.
    pub fn live_workers(&self, now_ms: i64) -> impl Iterator<Item = (&str, &Presence)> {
        self.presence.iter().filter_map(move |presence| {
            let owner = presence.lease.owner_id.as_deref()?;
            (presence.lease.state(now_ms) == LeaseState::Owned).then_some((owner, presence))
        })
    }

    /// Every `sidecar_url` a presence record announces, whatever its state
    /// (untrusted: whoever can write the table chooses it).
    pub fn sidecar_urls(&self) -> impl Iterator<Item = &str> {
        self.presence
            .iter()
            .filter_map(|presence| presence.lease.sidecar_url.as_deref())
    }

    /// The streams `caller` may acquire at `now_ms` (see [`acquirable`]).
    pub fn acquirable_streams<'a>(
        &'a self,
        caller: &'a str,
        now_ms: i64,
        skew_margin_ms: i64,
    ) -> impl Iterator<Item = &'a Lease> {
        self.streams
            .iter()
            .filter(move |lease| acquirable(lease, caller, now_ms, skew_margin_ms))
    }

    /// The stream records' states at `now_ms`.
    pub fn stream_counts(&self, now_ms: i64) -> StreamCounts {
        let mut counts = StreamCounts::default();
        for lease in &self.streams {
            let since = match lease.state(now_ms) {
                LeaseState::Owned => {
                    counts.owned += 1;
                    continue;
                }
                LeaseState::Expired => {
                    counts.expired += 1;
                    lease.lease_expires_at
                }
                LeaseState::Unowned => {
                    counts.unowned += 1;
                    lease.released_at.or(lease.updated_at).unwrap_or(now_ms)
                }
            };
            counts.unowned_since_ms = Some(
                counts
                    .unowned_since_ms
                    .map_or(since, |oldest| oldest.min(since)),
            );
        }
        counts
    }
}

/// Gives every session-mode stream among `records` its session's expiry and
/// last renewal ([`session_expiry`]), from the session records among them: a
/// listing of the whole table is all it takes.
pub fn resolve_sessions(records: &mut [Result<Lease, MalformedItem>]) {
    let sessions: HashMap<String, Lease> = records
        .iter()
        .filter_map(|record| record.as_ref().ok())
        .filter(|lease| lease.stream_id.starts_with(SESSION_PREFIX))
        .map(|lease| (lease.stream_id.clone(), lease.clone()))
        .collect();
    for stream in records.iter_mut().filter_map(|record| record.as_mut().ok()) {
        if let (Some(owner), Some(_)) = (stream.owner_id.as_deref(), stream.session_token) {
            let session = sessions.get(&session_record(owner));
            live_by_session(stream, session);
        }
    }
}

/// A session-mode stream as readers mean it: held until its session's expiry
/// ([`session_expiry`]), last renewed when its session was (`updated_at`, as
/// a per-stream renew moves it: the dashboard's "renew overdue" judges by it).
fn live_by_session(stream: &mut Lease, session: Option<&Lease>) {
    stream.lease_expires_at = session_expiry(stream, session);
    if stream.lease_expires_at > 0
        && let Some(renewed) = session.and_then(|s| s.updated_at)
    {
        stream.updated_at = stream.updated_at.max(Some(renewed));
    }
}

/// When a session-mode stream's hold ends, given its owner's session record
/// (`None` when absent): the session's expiry while that record is held by
/// the stream's owner with the stream's `session_token`; otherwise 0 (the
/// session ended: released, started again, or gone), so the stream reads as
/// expired. A per-stream record keeps its own expiry.
pub fn session_expiry(stream: &Lease, session: Option<&Lease>) -> i64 {
    let Some(token) = stream.session_token else {
        return stream.lease_expires_at;
    };
    match session {
        Some(session)
            if session.owner_id.is_some()
                && session.owner_id == stream.owner_id
                && session.fence_token == token =>
        {
            session.lease_expires_at
        }
        _ => 0,
    }
}

/// Reads one stream's record and, in session mode, resolves its expiry from
/// its owner's session record (one more read): what `leases show` displays.
pub async fn read_stream(
    reader: &dyn LeaseReader,
    stream_id: &str,
    consistency: Consistency,
) -> Result<Lease, LeaseError> {
    let mut stream = reader.get_with(stream_id, consistency).await?;
    if let (Some(owner), Some(_)) = (stream.owner_id.as_deref(), stream.session_token) {
        let session = match reader.get_with(&session_record(owner), consistency).await {
            Ok(session) => Some(session),
            Err(LeaseError::NotFound { .. }) => None,
            Err(err) => return Err(err),
        };
        live_by_session(&mut stream, session.as_ref());
    }
    Ok(stream)
}

/// Whether the store would let `caller` acquire `lease` at `now_ms`: the
/// store's own condition ([`protocol::acquirable`]) applied to the record as
/// read. A hint only (the read may be stale); the conditional write decides.
pub fn acquirable(lease: &Lease, caller: &str, now_ms: i64, skew_margin_ms: i64) -> bool {
    protocol::acquirable(
        lease.owner_id.as_deref(),
        Some(lease.lease_expires_at),
        caller,
        now_ms,
        skew_margin_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{HANDOFF_DOORBELL, OBSERVER_LEASE, worker_presence};

    const NOW: i64 = 1_800_000_000_000;
    const SKEW: i64 = 1_000;

    fn held(id: &str, owner: &str, expires_at: i64) -> Lease {
        Lease {
            owner_id: Some(owner.to_owned()),
            lease_expires_at: expires_at,
            ..Lease::unowned(id)
        }
    }

    fn malformed(id: &str) -> MalformedItem {
        MalformedItem {
            stream_id: id.to_owned(),
            attribute: "fence_token".to_owned(),
            problem: "is not a number".to_owned(),
        }
    }

    #[test]
    fn a_scan_is_split_into_streams_presence_reserved_and_malformed() {
        let mut presence = held(&worker_presence("w1"), "w1", NOW + 5_000);
        presence.sidecar_url = Some("http://10.0.0.1:9464".to_owned());
        let table = LeaseTable::classify([
            Ok(held("orders", "w1", NOW + 5_000)),
            Ok(presence.clone()),
            Ok(Lease::unowned(OBSERVER_LEASE)),
            Err(malformed("trades")),
            Ok(Lease::unowned(HANDOFF_DOORBELL)),
            Err(malformed("leasehold#worker#w2")),
            Ok(Lease::unowned("quotes")),
        ]);
        let ids = |leases: &[Lease]| -> Vec<String> {
            leases.iter().map(|l| l.stream_id.clone()).collect()
        };
        assert_eq!(ids(&table.streams), ["orders", "quotes"]);
        assert_eq!(
            table.presence,
            [Presence {
                worker: "w1".to_owned(),
                lease: presence
            }]
        );
        assert_eq!(ids(&table.reserved), [OBSERVER_LEASE, HANDOFF_DOORBELL]);
        assert_eq!(table.malformed.len(), 2);
        assert_eq!(
            table
                .malformed_streams()
                .map(|m| m.stream_id.as_str())
                .collect::<Vec<_>>(),
            ["trades"],
            "a reserved record that cannot be read is no stream"
        );
        assert_eq!(table.records(), 7);
        assert_eq!(
            table.sidecar_urls().collect::<Vec<_>>(),
            ["http://10.0.0.1:9464"]
        );
    }

    #[test]
    fn live_workers_are_held_unexpired_presence_records() {
        let table = LeaseTable::classify([
            Ok(held(&worker_presence("w1"), "w1", NOW)),
            Ok(held(&worker_presence("w2"), "w2", NOW - 1)),
            Ok(Lease::unowned(worker_presence("w3"))),
        ]);
        let live: Vec<&str> = table.live_workers(NOW).map(|(owner, _)| owner).collect();
        assert_eq!(live, ["w1"]);
    }

    #[test]
    fn who_may_acquire_is_the_store_condition() {
        let table = LeaseTable::classify([
            Ok(Lease::unowned("released")),
            Ok(held("mine", "me", NOW + 10_000)),
            Ok(held("theirs", "other", NOW + 10_000)),
            Ok(held("lapsed-within-skew", "other", NOW - SKEW)),
            Ok(held("lapsed", "other", NOW - SKEW - 1)),
        ]);
        let free: Vec<&str> = table
            .acquirable_streams("me", NOW, SKEW)
            .map(|l| l.stream_id.as_str())
            .collect();
        assert_eq!(free, ["released", "mine", "lapsed"]);
        for lease in &table.streams {
            assert_eq!(
                acquirable(lease, "me", NOW, SKEW),
                protocol::acquirable(
                    lease.owner_id.as_deref(),
                    Some(lease.lease_expires_at),
                    "me",
                    NOW,
                    SKEW
                ),
                "{}",
                lease.stream_id
            );
        }
    }

    #[test]
    fn a_session_streams_expiry_is_its_sessions() {
        let mut live = held("live", "w1", NOW - 60_000);
        live.session_token = Some(4);
        let mut restarted = held("restarted", "w2", NOW + 60_000);
        restarted.session_token = Some(1);
        let mut orphan = held("orphan", "w3", NOW + 60_000);
        orphan.session_token = Some(1);
        let mut session_w1 = held(&session_record("w1"), "w1", NOW + 9_000);
        session_w1.fence_token = 4;
        let mut session_w2 = held(&session_record("w2"), "w2", NOW + 9_000);
        session_w2.fence_token = 2;
        let table = LeaseTable::classify([
            Ok(live),
            Ok(restarted),
            Ok(orphan),
            Ok(held("per-stream", "w1", NOW + 5)),
            Ok(session_w1),
            Ok(session_w2),
        ]);
        let expiries: Vec<(&str, i64)> = table
            .streams
            .iter()
            .map(|l| (l.stream_id.as_str(), l.lease_expires_at))
            .collect();
        assert_eq!(
            expiries,
            [
                ("live", NOW + 9_000),
                ("restarted", 0),
                ("orphan", 0),
                ("per-stream", NOW + 5)
            ],
            "the session's expiry; 0 once it ended (new token, or no record)"
        );
        let free: Vec<&str> = table
            .acquirable_streams("me", NOW, SKEW)
            .map(|l| l.stream_id.as_str())
            .collect();
        assert_eq!(free, ["restarted", "orphan"]);
    }

    #[tokio::test]
    async fn one_stream_is_read_with_its_sessions_expiry() {
        use crate::store::memory::MemoryLeaseStore;
        use crate::store::{AcquireRequest, LeaseStore};
        let store = MemoryLeaseStore::new();
        let acquire = |stream: &str, now_ms, session_token| AcquireRequest {
            stream_id: stream.to_owned(),
            owner_id: "w1".to_owned(),
            now_ms,
            lease_ms: 30_000,
            skew_margin_ms: SKEW,
            sidecar_url: None,
            handoff_addr: None,
            max_streams: None,
            session_token,
        };
        let session = store
            .acquire(&acquire(&session_record("w1"), NOW + 50_000, None))
            .await
            .unwrap();
        store
            .acquire(&acquire("s", NOW, Some(session.fence_token)))
            .await
            .unwrap();
        let read = read_stream(&store, "s", Consistency::Strong).await.unwrap();
        assert_eq!(read.lease_expires_at, NOW + 80_000, "the session's expiry");
        assert_eq!(
            read.updated_at,
            Some(NOW + 50_000),
            "the session's last renewal"
        );
        let mut listed = list_all(&store, 10, Consistency::Strong).await.unwrap();
        resolve_sessions(&mut listed);
        let listed = listed.into_iter().flatten().find(|l| l.stream_id == "s");
        assert_eq!(listed.map(|l| l.lease_expires_at), Some(NOW + 80_000));
    }

    #[test]
    fn counts_say_since_when_the_oldest_stream_has_had_no_owner() {
        let mut released = Lease::unowned("released");
        released.released_at = Some(NOW - 9_000);
        released.updated_at = Some(NOW - 1_000);
        let mut registered = Lease::unowned("registered");
        registered.updated_at = Some(NOW - 4_000);
        let table = LeaseTable::classify([
            Ok(held("owned", "w", NOW)),
            Ok(held("expired", "w", NOW - 2_000)),
            Ok(released),
            Ok(registered),
            Ok(held(&worker_presence("w"), "w", NOW - 60_000)),
        ]);
        assert_eq!(
            table.stream_counts(NOW),
            StreamCounts {
                owned: 1,
                expired: 1,
                unowned: 2,
                unowned_since_ms: Some(NOW - 9_000),
            }
        );
        assert_eq!(
            LeaseTable::classify([Ok(held("owned", "w", NOW))])
                .stream_counts(NOW)
                .unowned_since_ms,
            None
        );
    }
}
