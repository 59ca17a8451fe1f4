//! Measurement helpers shared by the benchmarks: CPU time
//! from the kernel's per-thread schedstat, resident memory, percentiles, and
//! `--name value` arguments.

use std::time::Duration;

/// CPU seconds of this process's threads whose name starts with `prefix`
/// (`""` for every thread).
pub fn thread_cpu_seconds(prefix: &str) -> f64 {
    task_cpu_seconds("self", prefix)
}

/// CPU seconds of the threads of process `pid` (`"self"` or a pid) whose
/// name starts with `prefix` (`""` for every thread).
pub fn task_cpu_seconds(pid: &str, prefix: &str) -> f64 {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if !prefix.is_empty() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
        }
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            nanos += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    nanos as f64 / 1e9
}

/// CPU seconds of the whole process (every thread).
pub fn process_cpu_seconds() -> f64 {
    thread_cpu_seconds("")
}

/// Resident set size of a process in KiB (`"self"` or a pid), 0 if unknown.
pub fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The `p`-th percentile ([`nearest_rank`]) of `values`, sorting them in
/// place; zero when there are none.
///
/// [`nearest_rank`]: leasehold_platform::percentile::nearest_rank
pub fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    leasehold_platform::percentile::nearest_rank(values, p).unwrap_or(Duration::ZERO)
}

/// The median ([`percentile`]'s p50) of `values`; NaN when there are none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    leasehold_platform::percentile::nearest_rank(&values, 50.0).unwrap_or(f64::NAN)
}

/// The number after `--name` on the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut values: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&mut values, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&mut values, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&mut [], 99.0), Duration::ZERO);
    }

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {}
        assert!(process_cpu_seconds() > 0.0);
        assert!(rss_kib("self") > 0);
    }
}
