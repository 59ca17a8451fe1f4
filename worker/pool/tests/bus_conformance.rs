//! One pool bus conformance suite, run against both buses (the in-memory bus
//! must behave as the Redis layout of docs/redis.md does).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use leasehold_testkit::pool_bus::{MemoryTarget, RedisTarget};

mod memory {
    use super::*;
    leasehold_testkit::pool_bus_conformance_suite!(async { Some(MemoryTarget::new()) });
}

mod redis {
    use super::*;
    leasehold_testkit::pool_bus_conformance_suite!(RedisTarget::connect());
}
