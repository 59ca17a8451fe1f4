//! The integration tests of `leasehold-devcluster`: fleets of whole stream
//! workers on tokio's paused clock: balancing and assigned discovery. One test
//! binary for the crate (one link, and every module's tests side by side in one
//! process); one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-devcluster --test it assigned::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod support;

mod assigned;
mod balance;
