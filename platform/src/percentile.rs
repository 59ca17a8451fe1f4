//! One percentile for every figure leasehold reports (dashboard trends,
//! benchmarks, test measurements), so a p99 means the same everywhere.

/// The nearest-rank `percentile` (0–100) of `sorted` (ascending): the
/// smallest value such that at least `percentile` % of the values are at or
/// below it (p50 of 1..=100 is 50, p99 is 99, p100 the maximum, p0 the
/// minimum). `None` when `sorted` is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], percentile: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((percentile.clamp(0.0, 100.0) / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::nearest_rank;

    #[test]
    fn the_rank_is_the_smallest_covering_the_share() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&values, 50.0), Some(50));
        assert_eq!(nearest_rank(&values, 99.0), Some(99));
        assert_eq!(nearest_rank(&values, 99.5), Some(100));
        assert_eq!(nearest_rank(&values, 100.0), Some(100));
        assert_eq!(nearest_rank(&values, 0.0), Some(1));
        assert_eq!(nearest_rank(&[7], 99.0), Some(7));
        assert_eq!(nearest_rank(&[1, 2, 3, 4], 50.0), Some(2));
        assert_eq!(nearest_rank::<u32>(&[], 50.0), None);
    }
}
