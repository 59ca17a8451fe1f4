//! How the model tests (the lease protocol, the upstream sequence, the order
//! path) run stateright: one search set-up and one report, so the models
//! differ only in what they model.

use std::fmt::Debug;
use std::hash::Hash;
use std::ops::Add;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

/// A lease model's monotonic (real) time, in whole seconds: discrete, so the
/// holder's deadline and clock skew are part of the state. Adding a lease (a
/// `Duration`) gives a deadline, so `leasehold_control::protocol`'s generic
/// deadline functions run on it as on `tokio::time::Instant`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(pub i64);

impl Add<Duration> for Tick {
    type Output = Tick;
    fn add(self, duration: Duration) -> Tick {
        Tick(self.0 + i64::try_from(duration.as_secs()).unwrap_or(i64::MAX))
    }
}

/// Overrides a model's default search depth (a bound for a quick run, or a
/// deeper search than the test command's).
pub const MODEL_DEPTH_VAR: &str = "LEASEHOLD_MODEL_DEPTH";

/// The search depth: [`MODEL_DEPTH_VAR`] when it holds a number, else `default`.
pub fn depth(default: usize) -> usize {
    std::env::var(MODEL_DEPTH_VAR)
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(default)
}

/// Explores `model` breadth-first (so each counterexample found is a short
/// one) on two threads, until `finish_when` holds or `depth` is reached.
pub fn explore<M>(model: M, finish_when: HasDiscoveries, depth: usize) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    model
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .finish_when(finish_when)
        .spawn_bfs()
        .join()
}

/// Runs `search` (an exploration that stops at any failure), prints how much
/// it explored under `name`, and asserts that every property held.
pub fn assert_every_property<M, C>(name: &str, search: impl FnOnce() -> C)
where
    M: Model,
    M::State: Debug + Clone + PartialEq,
    M::Action: Debug + Clone + PartialEq,
    C: Checker<M>,
{
    let started = Instant::now();
    let checker = search();
    eprintln!(
        "{name}: {} states explored ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// Asserts that `checker` found a counterexample to each of `broken`, and
/// prints each one's actions.
pub fn expect_counterexamples<M, C>(checker: &C, broken: &[&'static str])
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Debug + Clone + PartialEq,
    C: Checker<M>,
{
    for &name in broken {
        let path = checker
            .discovery(name)
            .unwrap_or_else(|| panic!("without the fix, no counterexample to {name:?}"));
        eprintln!("counterexample to {name:?}: {:?}", path.into_actions());
    }
}
