//! The integration tests of `leasehold-broker`: the broker pool on the memory
//! bus, on Redis and on ECS, KMS credentials and the credential sealer. One
//! test binary for the crate (one link, and every module's tests side by side
//! in one process); one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-broker --test it broker_ecs::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod broker_ecs;
mod broker_memory;
mod broker_redis;
mod credentials_kms;
mod sealer_callers;
mod sealer_memory;
