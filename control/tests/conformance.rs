//! One conformance suite, run against both lease stores (docs/invariants.md, invariant 7).
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod memory {
    leasehold_testkit::conformance_suite!(async {
        Some(leasehold_testkit::lease_store::MemoryTarget::default())
    });
}

mod dynamodb {
    leasehold_testkit::conformance_suite!(leasehold_testkit::lease_store::DynamoTarget::create());
}
