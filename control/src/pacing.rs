//! How often a reader may scan the whole lease table.
//!
//! A `Scan` costs read units in proportion to the bytes it reads, so a reader
//! that scans on a fixed period pays in proportion to the table. Readers that
//! only show or count (the dashboard's collector, the cluster observer) pace
//! their scans by the size of the last one instead:
//!
//! ```text
//! interval = min(ceiling, max(base, items / items_per_second))
//! ```
//!
//! Up to `base × items_per_second` items the reader scans every `base`, as
//! configured; above it the interval grows with the table, so the reader scans
//! at most `items_per_second` items per second on average, whatever the table
//! size: its read units per second stay bounded by
//! `items_per_second × item size / 4 KiB` (halved for an eventually consistent
//! scan). The `ceiling` keeps the reader's view from going staler than its
//! consumers tolerate (the observer's scan-age alert fires at 120 s); beyond
//! `ceiling × items_per_second` items the cost grows with the table again.
//!
//! Discovery is not paced here: a stream worker's scan interval is
//! `DISCOVERY_INTERVAL_MS`, and its cost is a sizing decision (docs/lease-table.md).

use std::time::Duration;

/// The pacing of one reader's scans (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanPacing {
    /// The interval while the table is small.
    pub base: Duration,
    /// Items per second the reader may scan, on average over an interval.
    pub items_per_second: u32,
    /// The interval never grows past this (at least `base`).
    pub ceiling: Duration,
}

impl ScanPacing {
    /// Longest interval any reader is paced to by default: half the observer's
    /// scan-age alert (120 s), so one slow scan does not page anyone.
    pub const DEFAULT_CEILING: Duration = Duration::from_secs(60);

    /// A pacing with the default ceiling.
    pub const fn new(base: Duration, items_per_second: u32) -> Self {
        ScanPacing {
            base,
            items_per_second,
            ceiling: Self::DEFAULT_CEILING,
        }
    }

    /// The time from one scan's start to the next, given how many items the
    /// last scan read (reserved and malformed records count: they cost the same).
    pub fn interval(&self, items: usize) -> Duration {
        let per_second = u128::from(self.items_per_second.max(1));
        // Whole milliseconds, rounded up, so the budget is never exceeded.
        let millis = (items as u128 * 1000).div_ceil(per_second);
        let paced = Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX));
        paced.max(self.base).min(self.ceiling.max(self.base))
    }

    /// Items scanned per second at this table size: the reader's scan load.
    pub fn items_per_second_at(&self, items: usize) -> f64 {
        items as f64 / self.interval(items).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DASHBOARD: ScanPacing = ScanPacing::new(Duration::from_secs(2), 1_000);

    #[test]
    fn a_small_table_is_scanned_at_the_base_interval() {
        for items in [0, 1, 1_000, 2_000] {
            assert_eq!(DASHBOARD.interval(items), Duration::from_secs(2), "{items}");
        }
    }

    #[test]
    fn a_large_table_is_scanned_within_the_budget() {
        assert_eq!(DASHBOARD.interval(2_001), Duration::from_millis(2_001));
        assert_eq!(DASHBOARD.interval(10_000), Duration::from_secs(10));
        for items in [2_000, 2_001, 3_333, 10_000, 59_999, 60_000] {
            assert!(
                DASHBOARD.items_per_second_at(items) <= 1_000.0,
                "{items} items: {} items/s",
                DASHBOARD.items_per_second_at(items)
            );
        }
    }

    #[test]
    fn the_ceiling_caps_the_interval() {
        assert_eq!(DASHBOARD.interval(60_000), Duration::from_secs(60));
        assert_eq!(DASHBOARD.interval(1_000_000), Duration::from_secs(60));
        let slow = ScanPacing {
            base: Duration::from_secs(90),
            ..DASHBOARD
        };
        assert_eq!(
            slow.interval(0),
            Duration::from_secs(90),
            "a base above the ceiling wins"
        );
    }

    #[test]
    fn a_zero_budget_is_read_as_one_item_per_second() {
        let zero = ScanPacing::new(Duration::from_secs(1), 0);
        assert_eq!(zero.interval(5), Duration::from_secs(5));
    }
}
