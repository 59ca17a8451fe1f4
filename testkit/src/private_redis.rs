//! A Redis of a test's own, one server or a three-primary cluster, for a test
//! that does to its server what no other test may see: the tests of a crate
//! run side by side in one test binary, and the test Redis and Redis Cluster
//! the test command starts are shared by all of them. A script that stalls a
//! server, or a reshard that moves a cluster's slots, goes to one of these.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port with a directory of its own;
/// killed, and the directory removed, when dropped (a failed assertion
/// included).
pub struct PrivateRedis {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PrivateRedis {
    /// Starts the test command's `redis-server` ([`crate::redis_server`])
    /// with `extra` arguments and waits until it answers; `None` to skip when
    /// the test command did not name one (a failure when it said services
    /// are required).
    ///
    /// # Panics
    /// When the server does not answer within 10 s: a test that asked for a
    /// server of its own cannot go on without one.
    pub fn start(extra: &[&str]) -> Option<PrivateRedis> {
        let binary = crate::redis_server()?;
        let port = free_port();
        let dir = std::env::temp_dir().join(crate::unique_name("private-redis"));
        std::fs::create_dir_all(&dir).expect("server dir");
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let server = PrivateRedis { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} never answered\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's URL (`redis://127.0.0.1:port`).
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `redis-cli` on this server: its output, `None` when it failed.
    fn cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// The server's log, for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A three-primary Redis Cluster of [`PrivateRedis`] nodes, made as the test
/// command makes the shared one (`redis-cli --cluster create`, no replicas).
pub struct PrivateCluster {
    nodes: Vec<PrivateRedis>,
}

impl PrivateCluster {
    /// Starts three nodes, joins them into a cluster and waits until every
    /// node says `cluster_state:ok`; `None` to skip as [`PrivateRedis::start`].
    ///
    /// # Panics
    /// When the cluster does not form within 10 s.
    pub fn start() -> Option<PrivateCluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            // The bus port chosen like the others, instead of port + 10000.
            let bus_port = free_port().to_string();
            nodes.push(PrivateRedis::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus_port,
            ])?);
        }
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(PrivateRedis::addr))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = PrivateCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in &cluster.nodes {
            while !node
                .cli(&["CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
            {
                assert!(
                    Instant::now() < deadline,
                    "the private cluster never formed\n{}",
                    node.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(cluster)
    }

    /// The cluster's URL (`redis+cluster://h:p,h:p,h:p`), as
    /// [`crate::redis_cluster_url`] gives the shared one's.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(PrivateRedis::addr).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}
