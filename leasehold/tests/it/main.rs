//! The integration tests of `leasehold`: the binary end to end with real
//! processes, moto, Redis, Prometheus and Chromium, and the docs against the
//! code. One test binary for the crate (one link, and every module's tests side
//! by side in one process); one module per scenario file.
//!
//! Tests that start processes take turns: `support::serial` for one that runs
//! alone, `support::side_by_side` for one that may run beside its kind.
//!
//! One module's tests alone:
//! `cargo test -p leasehold --test it alerts_prometheus::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod support;

mod alerts_prometheus;
mod book_cli;
mod broker_pool;
mod broker_supervision;
mod credentials_kms;
mod dashboard_browser;
mod dev;
mod docs;
mod iam_enforced;
mod logging;
mod operator_cli;
mod otlp_resource;
mod recorded_sessions;
mod redis_acl;
mod shared_connections;
mod sink_consumer;
mod stream_failover;
mod upstream_exchanges;
