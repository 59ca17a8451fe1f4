//! The integration tests of `leasehold-control`: the lease store conformance
//! suite (memory and DynamoDB) and the protocol and session models. One test
//! binary for the crate (one link, and every module's tests side by side in one
//! process); one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-control --test it conformance::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod conformance;
mod protocol_model;
mod session_model;
