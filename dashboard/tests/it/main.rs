//! The integration tests of `leasehold-dashboard`: the router, access,
//! discovery and sidecar bounds, and the 10,000-stream page in headless
//! Chromium. One test binary for the crate (one link, and every module's tests
//! side by side in one process); one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-dashboard --test it access::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod access;
mod browser;
mod discovery;
mod router;
mod sidecar_bounds;
