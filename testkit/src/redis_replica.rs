//! A replica of the test Redis, started as an operator would (`redis-server
//! --replicaof`): what `SINK_WAIT_REPLICAS` waits for, in its test and in the
//! throughput bench that measures its cost.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running replica; killed, and its directory removed, when dropped (a
/// failed assertion included).
pub struct Replica {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Replica {
    /// Starts `redis-server` (`LEASEHOLD_REDIS_SERVER`, else the one on PATH)
    /// on a free loopback port as a replica of `primary_url`
    /// (`redis://host:port`) and waits until its link to the primary is up.
    ///
    /// # Panics
    /// When the server cannot start or does not link within 10 s: a test or
    /// bench that asked for a replica cannot go on without one.
    pub fn start(primary_url: &str) -> Replica {
        let server =
            std::env::var("LEASEHOLD_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let primary = primary_url
            .trim_start_matches("redis://")
            .trim_end_matches('/');
        let (host, primary_port) = primary.rsplit_once(':').expect("host:port");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        // Its own directory: a replica writes the primary's snapshot to disk.
        let dir = std::env::temp_dir().join(crate::unique_name("replica"));
        std::fs::create_dir_all(&dir).expect("replica dir");
        let child = Command::new(server)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--replicaof", host, primary_port])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let replica = Replica { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica.linked() {
            assert!(
                Instant::now() < deadline,
                "the replica never linked to {primary}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        replica
    }

    /// Whether the replica's link to its primary is up (`INFO replication`).
    pub fn linked(&self) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["INFO", "replication"])
            .output()
            .is_ok_and(|output| {
                String::from_utf8_lossy(&output.stdout).contains("master_link_status:up")
            })
    }

    /// The replica's own URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
