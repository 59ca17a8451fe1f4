//! Trends: a bounded in-memory history the collector samples on every
//! refresh, so the dashboard can draw lag and pool charts without a TSDB.
//!
//! Samples are downsampled into fixed buckets (`resolution`, one minute by
//! default): several refreshes in one bucket merge (maxima for lag, ages and
//! gaps; the latest reading for counts). Two ring buffers keep them:
//! - the cluster series: [`CLUSTER_POINTS`] buckets (24 h at one minute);
//! - one series per stream: [`STREAM_POINTS`] buckets (1 h at one minute),
//!   16 bytes a bucket, so 10,000 streams cost about 10 MB.
//!
//! Where the operator has Grafana, the trends page links to it
//! (`DASHBOARD_GRAFANA_URL`, [`crate::web::DashboardState::grafana`]) for
//! longer spans. Claim latency comes from the raw claim samples the sidecars'
//! `/status` lists ([`Trends::sample_claims`]): per bucket, the median and 99th
//! percentile over every claim in it, whichever sidecar reported it.

use leasehold_platform::percentile::nearest_rank;
use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::model::changes::{Change, ChangeKind};
use crate::model::streams::StreamRow;
use leasehold_pool::read::PoolView;

/// Cluster buckets kept: 24 h at the default one-minute resolution.
pub const CLUSTER_POINTS: usize = 1_440;
/// Per-stream buckets kept: 1 h at the default one-minute resolution.
pub const STREAM_POINTS: usize = 60;
/// Default bucket width.
pub const DEFAULT_RESOLUTION_MS: i64 = 60_000;

/// One cluster bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClusterPoint {
    /// Bucket start, unix ms.
    pub at_ms: i64,
    /// Events behind, summed over streams (largest reading in the bucket).
    pub lag_events: u64,
    /// Largest lag in seconds of any stream.
    pub lag_seconds: f64,
    /// Largest last-event age of any stream, seconds.
    pub last_event_age_seconds: f64,
    /// Longest takeover gap seen in the bucket, seconds.
    pub takeover_gap_seconds: f64,
    /// Takeovers seen in the bucket.
    pub takeovers: u64,
    /// Idle pool workers (latest reading).
    pub pool_idle: u64,
    /// Claimed users (latest reading).
    pub pool_claimed: u64,
    /// Claims waiting for a pool worker (latest reading; the queue a claim's
    /// latency comes from).
    pub claims_pending: u64,
    /// Pool claims taken in the bucket (as the sidecars report them).
    pub claims_taken: u64,
    /// Median claim latency in the bucket, seconds (0 without claims).
    pub claim_p50_seconds: f64,
    /// 99th percentile claim latency in the bucket, seconds (0 without claims).
    pub claim_p99_seconds: f64,
}

/// Claim latencies kept for the current bucket's percentiles (the newest
/// bucket only; a bucket with more claims than this keeps the first ones).
pub const CLAIMS_PER_BUCKET: usize = 10_000;

/// One per-stream bucket (compact: 10,000 streams × 60 buckets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StreamPoint {
    /// Bucket start, unix ms.
    pub at_ms: i64,
    /// Events behind (largest reading in the bucket).
    pub lag_events: u32,
    /// Seconds behind (largest reading).
    pub lag_seconds: f32,
}

/// A ring buffer of buckets.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    capacity: usize,
    points: VecDeque<T>,
}

impl<T> Ring<T> {
    /// An empty ring keeping `capacity` buckets.
    pub fn new(capacity: usize) -> Self {
        Ring {
            capacity: capacity.max(1),
            points: VecDeque::new(),
        }
    }

    fn push(&mut self, point: T) {
        if self.points.len() == self.capacity {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.points.iter()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Nothing held yet.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// The sampled history.
#[derive(Debug)]
pub struct Trends {
    resolution_ms: i64,
    cluster: Ring<ClusterPoint>,
    streams: HashMap<String, Ring<StreamPoint>>,
    /// The newest bucket's claim latencies (its percentiles are recomputed
    /// from them as claims arrive): (bucket start, seconds).
    claim_bucket: (i64, Vec<f64>),
}

impl Trends {
    /// Empty trends with buckets `resolution_ms` wide.
    pub fn new(resolution_ms: i64) -> Self {
        Trends {
            resolution_ms: resolution_ms.max(1),
            cluster: Ring::new(CLUSTER_POINTS),
            streams: HashMap::new(),
            claim_bucket: (i64::MIN, Vec::new()),
        }
    }

    /// Bucket width, ms.
    pub fn resolution_ms(&self) -> i64 {
        self.resolution_ms
    }

    /// (cluster span, per-stream span), ms.
    pub fn spans_ms(&self) -> (i64, i64) {
        (
            self.resolution_ms * CLUSTER_POINTS as i64,
            self.resolution_ms * STREAM_POINTS as i64,
        )
    }

    fn bucket(&self, now_ms: i64) -> i64 {
        now_ms - now_ms.rem_euclid(self.resolution_ms)
    }

    /// Adds one refresh: the stream rows, the pool, and the ownership
    /// changes observed since the previous sample.
    pub fn sample(
        &mut self,
        now_ms: i64,
        streams: &[StreamRow],
        pool: Option<&PoolView>,
        new_changes: &[Change],
    ) {
        let at_ms = self.bucket(now_ms);
        let mut point = ClusterPoint {
            at_ms,
            ..ClusterPoint::default()
        };
        for row in streams {
            point.lag_events += row.lag_events.unwrap_or(0);
            point.lag_seconds = point.lag_seconds.max(row.lag_seconds.unwrap_or(0.0));
            point.last_event_age_seconds = point
                .last_event_age_seconds
                .max(row.last_event_age_seconds.unwrap_or(0.0));
            if row.lag_events.is_none() && row.lag_seconds.is_none() {
                continue;
            }
            // Look up before inserting: an entry() would clone every id on
            // every refresh.
            if !self.streams.contains_key(&row.stream_id) {
                self.streams
                    .insert(row.stream_id.clone(), Ring::new(STREAM_POINTS));
            }
            let Some(ring) = self.streams.get_mut(&row.stream_id) else {
                continue;
            };
            let sample = StreamPoint {
                at_ms,
                lag_events: row.lag_events.unwrap_or(0).min(u32::MAX as u64) as u32,
                lag_seconds: row.lag_seconds.unwrap_or(0.0) as f32,
            };
            match ring.points.back_mut() {
                Some(last) if last.at_ms == at_ms => {
                    last.lag_events = last.lag_events.max(sample.lag_events);
                    last.lag_seconds = last.lag_seconds.max(sample.lag_seconds);
                }
                _ => ring.push(sample),
            }
        }
        for change in new_changes {
            if change.kind == ChangeKind::Takeover {
                point.takeovers += 1;
                point.takeover_gap_seconds = point
                    .takeover_gap_seconds
                    .max(change.gap_seconds.unwrap_or(0.0));
            }
        }
        if let Some(pool) = pool {
            point.pool_idle = pool.idle.len() as u64;
            point.pool_claimed = pool.claimed.len() as u64;
            point.claims_pending = pool.claims_pending;
        }
        match self.cluster.points.back_mut() {
            Some(last) if last.at_ms == at_ms => {
                last.lag_events = last.lag_events.max(point.lag_events);
                last.lag_seconds = last.lag_seconds.max(point.lag_seconds);
                last.last_event_age_seconds = last
                    .last_event_age_seconds
                    .max(point.last_event_age_seconds);
                last.takeover_gap_seconds =
                    last.takeover_gap_seconds.max(point.takeover_gap_seconds);
                last.takeovers += point.takeovers;
                last.pool_idle = point.pool_idle;
                last.pool_claimed = point.pool_claimed;
                last.claims_pending = point.claims_pending;
            }
            _ => self.cluster.push(point),
        }
    }

    /// Adds the claim latencies (seconds) the sidecars reported since the
    /// previous refresh to the bucket of `now_ms` (call after [`Trends::sample`]
    /// for the same refresh, which opens the bucket).
    pub fn sample_claims(&mut self, now_ms: i64, latencies: &[f64]) {
        let at_ms = self.bucket(now_ms);
        let Some(point) = self
            .cluster
            .points
            .back_mut()
            .filter(|point| point.at_ms == at_ms)
        else {
            return;
        };
        if self.claim_bucket.0 != at_ms {
            self.claim_bucket = (at_ms, Vec::new());
        }
        let kept = &mut self.claim_bucket.1;
        let room = CLAIMS_PER_BUCKET.saturating_sub(kept.len());
        kept.extend(
            latencies
                .iter()
                .copied()
                .filter(|s| s.is_finite())
                .take(room),
        );
        point.claims_taken += latencies.len() as u64;
        if !kept.is_empty() {
            let mut sorted = kept.clone();
            sorted.sort_by(f64::total_cmp);
            point.claim_p50_seconds = nearest_rank(&sorted, 50.0).unwrap_or_default();
            point.claim_p99_seconds = nearest_rank(&sorted, 99.0).unwrap_or_default();
        }
    }

    /// Forgets streams that are no longer in the table.
    pub fn retain(&mut self, alive: impl Fn(&str) -> bool) {
        self.streams.retain(|stream, _| alive(stream));
    }

    /// The cluster series, oldest first.
    pub fn cluster(&self) -> Vec<ClusterPoint> {
        self.cluster.iter().copied().collect()
    }

    /// One stream's series, oldest first (empty when never sampled).
    pub fn stream(&self, stream_id: &str) -> Vec<StreamPoint> {
        self.streams
            .get(stream_id)
            .map(|ring| ring.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::streams::{StreamState, Verdict};

    fn row(id: &str, lag: u64) -> StreamRow {
        StreamRow {
            owner_id: Some("w1".into()),
            fence_token: 1,
            state: StreamState::Owned,
            lag_events: Some(lag),
            lag_seconds: Some(lag as f64 / 10.0),
            last_event_age_seconds: Some(1.0),
            verdict: Verdict::Ok,
            ..StreamRow::unowned(id)
        }
    }

    #[test]
    fn samples_in_one_bucket_merge_and_rings_stay_bounded() {
        let mut trends = Trends::new(1_000);
        trends.sample(10_000, &[row("a", 5)], None, &[]);
        trends.sample(10_500, &[row("a", 9)], None, &[]);
        trends.sample(10_900, &[row("a", 2)], None, &[]);
        assert_eq!(trends.cluster().len(), 1, "one bucket");
        assert_eq!(trends.cluster()[0].lag_events, 9, "the bucket's maximum");
        assert_eq!(trends.stream("a")[0].lag_events, 9);
        for second in 11..(11 + CLUSTER_POINTS as i64 + 10) {
            trends.sample(second * 1_000, &[row("a", 1)], None, &[]);
        }
        assert_eq!(trends.cluster().len(), CLUSTER_POINTS);
        assert_eq!(trends.stream("a").len(), STREAM_POINTS);
        let newest = trends.cluster().last().unwrap().at_ms;
        assert_eq!(newest, (10 + CLUSTER_POINTS as i64 + 10) * 1_000);
        trends.retain(|_| false);
        assert!(trends.stream("a").is_empty());
        assert_eq!(trends.spans_ms(), (1_440_000, 60_000));
    }

    #[test]
    fn takeovers_and_pool_counts_are_sampled() {
        let mut trends = Trends::new(60_000);
        let change = Change {
            at_ms: 1,
            stream_id: "a".into(),
            kind: ChangeKind::Takeover,
            old_owner: Some("w1".into()),
            new_owner: Some("w2".into()),
            fence_token: 2,
            gap_seconds: Some(4.5),
            missed: 0,
        };
        let pool = PoolView {
            claims_pending: 3,
            ..PoolView::default()
        };
        trends.sample(120_000, &[], Some(&pool), &[change]);
        let point = trends.cluster()[0];
        assert_eq!((point.takeovers, point.takeover_gap_seconds), (1, 4.5));
        assert_eq!(point.claims_pending, 3);
    }

    #[test]
    fn claim_latencies_make_percentiles_per_bucket() {
        let mut trends = Trends::new(60_000);
        trends.sample_claims(120_000, &[9.0]);
        assert!(trends.cluster().is_empty(), "no bucket opened yet: nothing");
        trends.sample(120_000, &[], None, &[]);
        let latencies: Vec<f64> = (1..=100).map(f64::from).collect();
        trends.sample_claims(120_000, &latencies[..60]);
        trends.sample(150_000, &[], None, &[]);
        trends.sample_claims(150_000, &latencies[60..]);
        let point = trends.cluster()[0];
        assert_eq!(point.claims_taken, 100, "two refreshes in one bucket");
        assert_eq!(point.claim_p50_seconds, 50.0);
        assert_eq!(point.claim_p99_seconds, 99.0);
        // The next bucket starts afresh; a bucket without claims shows 0.
        trends.sample(180_000, &[], None, &[]);
        trends.sample_claims(180_000, &[0.5]);
        trends.sample(240_000, &[], None, &[]);
        trends.sample_claims(240_000, &[]);
        let cluster = trends.cluster();
        assert_eq!(
            (cluster[1].claims_taken, cluster[1].claim_p99_seconds),
            (1, 0.5)
        );
        assert_eq!(
            (cluster[2].claims_taken, cluster[2].claim_p50_seconds),
            (0, 0.0)
        );
        // Bounded: a flood keeps at most CLAIMS_PER_BUCKET for percentiles.
        trends.sample_claims(240_000, &vec![1.0; CLAIMS_PER_BUCKET * 2]);
        assert_eq!(trends.claim_bucket.1.len(), CLAIMS_PER_BUCKET);
        assert_eq!(
            trends.cluster()[2].claims_taken,
            2 * CLAIMS_PER_BUCKET as u64
        );
    }
}
