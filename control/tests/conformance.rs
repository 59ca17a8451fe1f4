//! One conformance suite, run against both lease stores (docs/invariants.md, invariant 7).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod memory {
    leasehold_control::conformance_suite!(async {
        Some(leasehold_control::conformance::MemoryTarget::default())
    });
}

mod dynamodb {
    leasehold_control::conformance_suite!(leasehold_control::conformance::DynamoTarget::create());
}
