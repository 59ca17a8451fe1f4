//! The integration tests of `leasehold-stream`: the fake and recorded order
//! books and the machine, sequence, range, snapshot and hand-off models. One
//! test binary for the crate (one link, and every module's tests side by side
//! in one process); one module per scenario file.
//!
//! One module's tests alone:
//! `cargo test -p leasehold-stream --test it fake_books::`.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

mod fake_books;
mod handoff_model;
mod machine_model;
mod range_model;
mod recorded_books;
mod sequence_model;
mod snapshot_model;
