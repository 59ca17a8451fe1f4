//! The test Redis Cluster, driven as an operator would: `redis-cli --cluster
//! reshard` moves slots (and their keys, with `MIGRATE`) while tests write.

use std::process::Command;

/// `host:port` of each node of a `redis+cluster://h:p,h:p…` URL (no credentials).
pub fn nodes(cluster_url: &str) -> Vec<String> {
    let rest = cluster_url
        .split_once("://")
        .map_or(cluster_url, |(_, rest)| rest);
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    hosts
        .trim_end_matches('/')
        .split(',')
        .map(str::to_owned)
        .collect()
}

fn cli(node: &str, args: &[&str]) -> String {
    let (host, port) = node.rsplit_once(':').expect("host:port");
    let output = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli");
    assert!(output.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A node's id (`CLUSTER MYID`).
pub fn node_id(node: &str) -> String {
    cli(node, &["CLUSTER", "MYID"])
}

/// The hash slot of a key (`CLUSTER KEYSLOT`).
pub fn key_slot(node: &str, key: &str) -> u16 {
    cli(node, &["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("a slot number")
}

/// Moves `slots` slots from node `from` to node `to` (ids), keys and all;
/// `redis-cli` takes the lowest slots `from` serves first.
pub fn reshard(entry: &str, from: &str, to: &str, slots: u32) {
    let output = Command::new("redis-cli")
        .args(["--cluster", "reshard", entry])
        .args(["--cluster-from", from, "--cluster-to", to])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .output()
        .expect("redis-cli");
    assert!(
        output.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `count` names `{prefix}-{i}` whose key (`key(name)`) hashes into `slots`,
/// so a test knows which of its streams a reshard moves.
pub fn names_in_slots(
    node: &str,
    prefix: &str,
    count: usize,
    slots: std::ops::Range<u16>,
    key: impl Fn(&str) -> String,
) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|name| slots.contains(&key_slot(node, &key(name))))
        .take(count)
        .collect()
}
