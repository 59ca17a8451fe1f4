//! One sink conformance suite, run against both sinks (design §5, invariant 2).

use leasehold_stream::sink::conformance::{MemoryTarget, OPTIONS, RedisTarget};

mod memory {
    use super::*;
    leasehold_stream::sink_conformance_suite!(async { Some(MemoryTarget::new(OPTIONS)) });
}

mod redis {
    use super::*;
    leasehold_stream::sink_conformance_suite!(RedisTarget::connect(OPTIONS));
}
