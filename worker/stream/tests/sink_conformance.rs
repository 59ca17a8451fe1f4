//! One sink conformance suite, run against both sinks (docs/invariants.md, invariant 2).

use leasehold_stream::sink::conformance::{MemoryTarget, OPTIONS, RedisTarget};

mod memory {
    use super::*;
    leasehold_stream::sink_conformance_suite!(async { Some(MemoryTarget::new(OPTIONS)) });
}

mod redis {
    use super::*;
    leasehold_stream::sink_conformance_suite!(RedisTarget::connect(OPTIONS));
}
