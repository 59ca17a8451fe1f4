//! What a snapshot keeps of a sidecar's `/status`: the fields the views use,
//! every list capped while it is parsed, so a sidecar (or anyone who can
//! publish a `sidecar_url`) cannot make one refresh hold more than these caps,
//! whatever its body says. Fields the views never show (event counters,
//! connection counts, the pool part) are skipped by the parser, not kept.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;

use leasehold_telemetry::status::{
    BackfillSample, ClaimSample, GapSample, HeldLease, LISTED_CONNECTIONS, RECENT_BACKFILLS,
    RECENT_CLAIMS, RECENT_GAPS, StreamLag, UpstreamConnection,
};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// Held leases kept per sidecar (the first ones listed): 20 times the
/// stream worker's default `MAX_STREAMS`, and about what a 2 MiB body holds.
pub const KEPT_LEASES: usize = 2_000;

/// Per-stream lag entries kept per sidecar (the first ones listed), as many
/// as held leases.
pub const KEPT_LAG_ENTRIES: usize = KEPT_LEASES;

/// Claim samples kept per sidecar (the newest): what a sidecar lists anyway.
pub const KEPT_CLAIMS: usize = RECENT_CLAIMS;

/// Data gaps kept per sidecar (the newest): what a sidecar lists anyway.
pub const KEPT_GAPS: usize = RECENT_GAPS;

/// Backfills kept per sidecar (the newest): what a sidecar lists anyway.
pub(super) const KEPT_BACKFILLS: usize = RECENT_BACKFILLS;

/// Longest owner id or stream id kept: the views never look up a longer
/// stream id ([`crate::model::streams::MAX_STREAM_ID_LEN`]), so a longer one could
/// match nothing; a longer owner id is dropped (the row says "unknown worker").
pub const KEPT_ID_LEN: usize = crate::model::streams::MAX_STREAM_ID_LEN;

/// Longest `component` kept (`stream-worker`, `broker-worker`).
const KEPT_COMPONENT_LEN: usize = 64;

/// The parts of one sidecar's `/status` the views use: the workers view
/// (identity, liveness, counters), the per-stream page (held leases and lag),
/// the trends (claim samples) and the data gaps. Parsed from the same JSON
/// as [`leasehold_telemetry::status::SidecarStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptStatus {
    /// `stream-worker`, `broker-worker`, or none before the first heartbeat.
    #[serde(default, deserialize_with = "short_component")]
    pub component: Option<String>,
    /// The worker's identity.
    #[serde(default, deserialize_with = "short_id")]
    pub owner_id: Option<String>,
    /// Milliseconds since the last event; none if none yet.
    #[serde(default)]
    pub last_event_age_ms: Option<u64>,
    /// Connected and not silent beyond the threshold.
    pub worker_up: bool,
    /// Events the sink refused because a newer fence token exists.
    #[serde(default)]
    pub sink_events_fenced: u64,
    /// Leases this worker lost.
    #[serde(default)]
    pub leases_lost: u64,
    /// Leases held, the first [`KEPT_LEASES`].
    #[serde(deserialize_with = "first_leases")]
    pub leases: Vec<HeldLease>,
    /// Per-stream lag, the first [`KEPT_LAG_ENTRIES`].
    #[serde(deserialize_with = "first_lag_entries")]
    pub lag: BTreeMap<String, StreamLag>,
    /// The newest [`KEPT_CLAIMS`] pool claims, oldest first.
    #[serde(default, deserialize_with = "newest_claims")]
    pub claims: Vec<ClaimSample>,
    /// The newest [`KEPT_GAPS`] data gaps, oldest first.
    #[serde(default, deserialize_with = "newest_gaps")]
    pub gaps: Vec<GapSample>,
    /// The newest [`KEPT_BACKFILLS`] finished backfills, oldest first.
    #[serde(default, deserialize_with = "newest_backfills")]
    pub backfills: Vec<BackfillSample>,
    /// The worker's upstream connections, the first [`LISTED_CONNECTIONS`]
    /// (what a worker lists anyway).
    #[serde(default, deserialize_with = "first_connections")]
    pub upstream_connections: Vec<UpstreamConnection>,
    /// Upstream connections the worker has open.
    #[serde(default)]
    pub upstream_connections_open: u64,
    /// Connects that waited for the worker's connect budget.
    #[serde(default)]
    pub upstream_connects_throttled: u64,
    /// This sidecar publishes the cluster gauges.
    pub observer: bool,
}

fn short_text<'de, D: Deserializer<'de>>(
    deserializer: D,
    longest: usize,
) -> Result<Option<String>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.filter(|text| text.len() <= longest))
}

fn short_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    short_text(deserializer, KEPT_ID_LEN)
}

fn short_component<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    short_text(deserializer, KEPT_COMPONENT_LEN)
}

fn first_leases<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<HeldLease>, D::Error> {
    let mut leases =
        deserializer.deserialize_seq(Capped::<HeldLease>::keeping(KEPT_LEASES, Keep::First))?;
    leases.retain(|lease| lease.stream_id.len() <= KEPT_ID_LEN);
    Ok(leases)
}

fn newest_claims<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ClaimSample>, D::Error> {
    deserializer.deserialize_seq(Capped::keeping(KEPT_CLAIMS, Keep::Newest))
}

fn newest_gaps<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<GapSample>, D::Error> {
    let mut gaps =
        deserializer.deserialize_seq(Capped::<GapSample>::keeping(KEPT_GAPS, Keep::Newest))?;
    gaps.retain(|gap| gap.stream_id.len() <= KEPT_ID_LEN);
    Ok(gaps)
}

fn newest_backfills<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<BackfillSample>, D::Error> {
    let mut backfills = deserializer.deserialize_seq(Capped::<BackfillSample>::keeping(
        KEPT_BACKFILLS,
        Keep::Newest,
    ))?;
    backfills.retain(|backfill| backfill.stream_id.len() <= KEPT_ID_LEN);
    Ok(backfills)
}

fn first_connections<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<UpstreamConnection>, D::Error> {
    deserializer.deserialize_seq(Capped::keeping(LISTED_CONNECTIONS, Keep::First))
}

fn first_lag_entries<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, StreamLag>, D::Error> {
    deserializer.deserialize_map(FirstEntries(KEPT_LAG_ENTRIES))
}

/// Which items of a long list a capped parse keeps.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// The first ones: the rest are skipped without being built.
    First,
    /// The last ones (lists written oldest first): older ones leave as newer
    /// ones arrive, so at most `cap + 1` are ever held.
    Newest,
}

/// Parses a JSON array keeping at most `cap` items.
struct Capped<T> {
    cap: usize,
    keep: Keep,
    item: PhantomData<T>,
}

impl<T> Capped<T> {
    fn keeping(cap: usize, keep: Keep) -> Self {
        Capped {
            cap,
            keep,
            item: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut kept = VecDeque::with_capacity(self.cap.min(64));
        match self.keep {
            Keep::First => {
                while kept.len() < self.cap {
                    let Some(item) = seq.next_element()? else {
                        return Ok(kept.into());
                    };
                    kept.push_back(item);
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
            }
            Keep::Newest => {
                while let Some(item) = seq.next_element()? {
                    kept.push_back(item);
                    if kept.len() > self.cap {
                        kept.pop_front();
                    }
                }
            }
        }
        Ok(kept.into())
    }
}

/// Parses a JSON object keeping its first entries (at most the count given),
/// without keys longer than [`KEPT_ID_LEN`].
struct FirstEntries(usize);

impl<'de> Visitor<'de> for FirstEntries {
    type Value = BTreeMap<String, StreamLag>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of stream ids to lag")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while kept.len() < self.0 {
            let Some((stream, lag)) = map.next_entry::<String, StreamLag>()? else {
                return Ok(kept);
            };
            if stream.len() <= KEPT_ID_LEN {
                kept.insert(stream, lag);
            }
        }
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(kept)
    }
}
