//! What the fleet tests share: waiting for a table state, and counting the
//! lease moves while a fleet should stay put.

use std::time::Duration;

use leasehold_devcluster::fleet::{FleetView, Holdings};

/// Waits until `done` holds, checking every 100 ms; the holdings then and how
/// long it took. Fails the test past `within`.
pub async fn wait_for(
    view: &FleetView,
    within: Duration,
    done: impl Fn(&Holdings) -> bool,
) -> (Holdings, Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let holdings = view.holdings().await.expect("holdings");
        if done(&holdings) {
            return (holdings, start.elapsed());
        }
        assert!(
            start.elapsed() < within,
            "not reached within {within:?}: {holdings:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs for `span` and returns the acquisitions made meanwhile, checking the
/// fleet stays `balanced` throughout.
pub async fn moves_while_idle(
    view: &FleetView,
    span: Duration,
    balanced: impl Fn(&Holdings) -> bool,
) -> u64 {
    let before = view.holdings().await.expect("holdings");
    let end = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = view.holdings().await.expect("holdings");
        assert!(balanced(&now), "lost balance: {now:?}");
    }
    view.holdings().await.expect("holdings").acquisitions - before.acquisitions
}
