//! The integration tests of `leasehold-sink`: the sink conformance suite
//! (memory, Redis, RESP3, Redis Cluster), a busy Redis and a reshard during
//! traffic. One test binary for the crate (one link, and every module's tests
//! side by side in one process); one module per scenario file.
//!
//! Whatever a test does to its Redis that the others must not see (a stall, a
//! reshard) it does to a server of its own (`leasehold_testkit::private_redis`).
//!
//! One module's tests alone:
//! `cargo test -p leasehold-sink --test it redis_cluster_reshard::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod redis_cluster_reshard;
mod redis_sink_busy;
mod sink_conformance;
