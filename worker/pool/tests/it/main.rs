//! The integration tests of `leasehold-pool`: the pool bus conformance suite
//! (memory and Redis) and the assign and request models. One test binary for
//! the crate (one link, and every module's tests side by side in one process);
//! one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-pool --test it assign_model::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod assign_model;
mod bus_conformance;
mod request_model;
