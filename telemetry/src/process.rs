//! This process's resource use, sampled for the worker heartbeat: the sidecar
//! runs in another container of the task and cannot see the worker's process,
//! so the worker reports its own memory, CPU and file descriptors once a second.

use serde::{Deserialize, Serialize};

/// One sample of the worker process's resource use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// Resident set size.
    pub resident_memory_bytes: u64,
    /// User plus system CPU time since the process started.
    pub cpu_seconds: f64,
    /// Open file descriptors (sockets included): one per connection and more.
    pub open_fds: u64,
}

/// Samples this process; `None` where `/proc` is not available.
pub fn sample() -> Option<ProcessUsage> {
    #[cfg(target_os = "linux")]
    {
        use procfs::WithCurrentSystemInfo;
        let me = procfs::process::Process::myself().ok()?;
        let stat = me.stat().ok()?;
        Some(ProcessUsage {
            resident_memory_bytes: stat.rss_bytes().get(),
            cpu_seconds: (stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64,
            open_fds: me.fd_count().ok()? as u64,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sample_sees_this_process() {
        let usage = super::sample().expect("/proc is there on Linux");
        assert!(usage.resident_memory_bytes > 1024 * 1024, "{usage:?}");
        assert!(usage.open_fds >= 3, "{usage:?}");
        // Other tests of this process open and close files meanwhile, so a
        // difference between two samples says nothing: 64 files held open
        // must be counted whatever the others do.
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let more = super::sample().unwrap();
        assert!(more.open_fds >= 64 + 3, "{more:?}");
        drop(files);
    }
}
