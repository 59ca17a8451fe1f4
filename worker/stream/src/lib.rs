//! The lease-driven stream worker: each logical stream is owned through a lease,
//! consumed from the upstream from its checkpoint, written to a fenced sink, and
//! handed over on crash (expiry) or deploy (drain) without gaps.
//!
//! Module map:
//! - [`upstream`]: "connect to stream X from sequence N": the [`upstream::Upstream`]
//!   seam and the generic WebSocket JSON adapter (URL and subscribe templates,
//!   JSON pointers, frame limit).
//! - the fenced sinks are their own crate, `leasehold_sink` (`worker/sink`).
//! - [`sequence`]: what an upstream's sequence numbers mean for the sink
//!   (replays, holes, ranges, resets, jumps, backfill), without I/O: the
//!   machine's `Sequencer`, and the sequence models' subject.
//! - [`numbering`]: the stream's own numbers for an upstream whose sequence
//!   starts over on every connection or that has none.
//! - [`book`]: order books without I/O: how each exchange spells a snapshot
//!   and a diff, the book kept as exact decimal strings, Kraken's and OKX's
//!   checksums (`UPSTREAM_BOOK_CHECKSUM`), the worker's per-stream keeper and
//!   the readers' rebuild from stored entries.
//! - [`machine`]: one held stream's state and decisions, without I/O
//!   (`StreamMachine`: progress, sequencer, write slot, backfill, reset).
//! - [`runner`]: the machine's driver, from the sink's open to release: the
//!   order of checks (valid lease → write with token → stage checkpoint)
//!   lives here.
//! - [`discovery`]: when to look for streams and what an offer becomes, in
//!   the machine's shape, without I/O: the one place that knows the mode.
//! - [`worker`]: presence, discovery, fair share, hand-back, drain: the
//!   driver of [`discovery`].
//! - [`balance`]: fair share, hand-back, and when to stop giving.
//! - [`assignment`]: assigned discovery's plan (`DISCOVERY_MODE=assigned`):
//!   which live worker each stream should be with, the elected assigner's advice.
//! - [`probes`]: acquire attempts scheduled for when a lease becomes takeable.
//! - [`handoff`]: pushed hand-offs: the UDP hint a draining worker sends its
//!   successor, which then acquires at once (only the acquire decides).
//! - [`settings`]: the worker's variables, read once.

pub mod assignment;
pub mod balance;
pub mod book;
pub mod discovery;
pub mod handoff;
pub mod machine;
pub mod numbering;
pub mod probes;
pub mod runner;
pub mod sequence;
pub mod settings;
pub mod upstream;
pub mod worker;

pub use runner::{RunnerConfig, RunnerContext, StreamExit, run_stream};
pub use worker::{DrainReport, StreamWorker, StreamWorkerConfig};
