//! The integration tests of `leasehold-sidecar`: the sidecar's endpoints,
//! exporters and alert metrics. One test binary for the crate (one link, and
//! every module's tests side by side in one process); one module per scenario
//! file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-sidecar --test it alert_metrics::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod support;

mod alert_metrics;
mod cloudwatch;
mod exporters;
mod otlp;
mod prometheus_scrape;
mod sidecar;
