//! One pool bus conformance suite, run against both buses (the in-memory bus
//! must behave as the Redis layout of design §3.2 does).

use leasehold_pool::bus::conformance::{MemoryTarget, RedisTarget};

mod memory {
    use super::*;
    leasehold_pool::pool_bus_conformance_suite!(async { Some(MemoryTarget::new()) });
}

mod redis {
    use super::*;
    leasehold_pool::pool_bus_conformance_suite!(RedisTarget::connect());
}
