//! Assigned discovery (`DISCOVERY_MODE=assigned`) with whole stream workers on
//! tokio's paused clock: the elected assigner alone scans, every worker
//! queries its own assignments, and cold start, scale-out, a crash, a drain
//! and the assigner's own crash each end balanced with only the moves they
//! need.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{moves_while_idle, wait_for};
use leasehold_control::clock::PausedClock;
use leasehold_control::schema;
use leasehold_devcluster::fleet::{Fleet, FleetOptions, FleetView};
use leasehold_stream::worker::DiscoveryMode;

const DISCOVERY: Duration = Duration::from_secs(5);

async fn fleet(streams: usize) -> Fleet {
    let options = FleetOptions {
        streams,
        discovery: DiscoveryMode::Assigned,
        ..FleetOptions::default()
    };
    assert_eq!(options.discovery_interval, DISCOVERY);
    Fleet::new(
        options,
        Arc::new(PausedClock::starting_at(1_700_000_000_000)),
    )
    .await
    .expect("fleet")
}

/// The first of `workers` that does not hold the assigner lease (a test
/// that stops or crashes a worker must not also move the assigner).
async fn not_the_assigner<'a>(view: &FleetView, workers: &[&'a str]) -> &'a str {
    let assigner = view.record(schema::ASSIGNER_LEASE).await.unwrap().owner_id;
    workers
        .iter()
        .copied()
        .find(|w| assigner.as_deref() != Some(*w))
        .unwrap()
}

async fn balanced_fleet(streams: usize, owners: &[&str]) -> Fleet {
    let mut fleet = fleet(streams).await;
    for owner in owners {
        fleet.start(owner, 100);
    }
    let workers = owners.len();
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| {
        h.balanced(streams, workers)
    })
    .await;
    moves_while_idle(&fleet.view(), DISCOVERY, |h| h.balanced(streams, workers)).await;
    fleet
}

#[tokio::test(start_paused = true)]
async fn only_the_assigner_scans_and_workers_read_no_doorbell() {
    let mut fleet = balanced_fleet(100, &["w1", "w2", "w3", "w4"]).await;
    let before = fleet.units();
    let churn = moves_while_idle(&fleet.view(), 12 * DISCOVERY, |h| h.balanced(100, 4)).await;
    let used = fleet.units().since(&before);
    let calls = |kind: &str| used.calls.get(kind).copied().unwrap_or(0);
    println!("one minute of four balanced workers: {:?}", used.calls);
    assert_eq!(churn, 0, "a balanced fleet moves nothing");
    // 60 s at 5 s ± 20 %: at most 15 passes, one scan page each (100
    // streams); four scanning workers would list 48-60 pages.
    assert!(calls("list") <= 15, "{} scan pages", calls("list"));
    assert!(calls("assigned") >= 4 * 10, "every worker queries its own");
    // No doorbell polls (four workers would read it 960 times), no rings,
    // no assignment rewritten.
    assert!(calls("get") < 60, "{} reads", calls("get"));
    assert_eq!(calls("bump") + calls("assign"), 0);
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_scale_out_from_four_to_five_moves_only_the_new_share() {
    let mut fleet = balanced_fleet(100, &["w1", "w2", "w3", "w4"]).await;
    let before = fleet.holdings().await.expect("holdings").acquisitions;
    fleet.start("w5", 100);
    let (_, took) = wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(100, 5)).await;
    let churn = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(100, 5)).await;
    let moves = fleet.holdings().await.expect("holdings").acquisitions - before;
    println!("assigned scale-out 4 → 5, 100 streams: {moves} moves (ideal 20) in {took:?}");
    assert_eq!(churn, 0, "no churn once balanced");
    assert_eq!(moves, 20, "exactly the new worker's share moves");
    fleet.stop_all().await;
}

/// A crash: the assigner plans again the moment the dead worker's presence
/// lapses past the skew margin (not at its next interval) and pushes each
/// stream to its new worker, which takes it over at once: every stream is
/// owned again within a lease and two seconds of the crash. The workers take
/// pushes on the fleet's in-process network (a real datagram could arrive
/// late in simulated time on a busy host).
#[tokio::test(start_paused = true)]
async fn a_crashed_workers_streams_are_taken_over_within_a_lease_and_two_seconds() {
    let options = FleetOptions {
        streams: 100,
        discovery: DiscoveryMode::Assigned,
        pushes: true,
        ..FleetOptions::default()
    };
    let lease = options.lease;
    let mut fleet = Fleet::new(
        options,
        Arc::new(PausedClock::starting_at(1_700_000_000_000)),
    )
    .await
    .expect("fleet");
    let owners = ["w1", "w2", "w3", "w4", "w5"];
    for owner in owners {
        fleet.start(owner, 100);
    }
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(100, 5)).await;
    // Crash at every phase of the victim's renew interval (10 s) and of the
    // assigner's pass (5 s): one crash per phase, restarting in between.
    let mut worst = Duration::ZERO;
    for (round, phase) in [0u64, 1_700, 3_300, 5_100, 7_900].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(phase)).await;
        let victim = not_the_assigner(&fleet.view(), &owners).await;
        let before = fleet.holdings().await.expect("holdings").acquisitions;
        fleet.crash(victim);
        let (_, took) = wait_for(&fleet.view(), lease * 2, |h| h.balanced(100, 4)).await;
        let moves = fleet.holdings().await.expect("holdings").acquisitions - before;
        println!(
            "assigned, crash {round} of 1 of 5: {moves} moves (ideal 20), owned again after {took:?}"
        );
        assert_eq!(moves, 20, "only the crashed worker's streams move");
        worst = worst.max(took);
        fleet.start(victim, 100);
        wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(100, 5)).await;
    }
    assert!(
        worst <= lease + Duration::from_secs(2),
        "a takeover took {worst:?}"
    );
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn when_the_assigner_crashes_another_takes_its_place() {
    let mut fleet = balanced_fleet(60, &["w1", "w2", "w3"]).await;
    let first = fleet.view().record(schema::ASSIGNER_LEASE).await.unwrap();
    let first = first.owner_id.expect("an assigner was elected");
    fleet.crash(&first);
    let (_, took) = wait_for(&fleet.view(), Duration::from_secs(50), |h| {
        h.balanced(60, 2)
    })
    .await;
    let second = fleet.view().record(schema::ASSIGNER_LEASE).await.unwrap();
    assert_ne!(second.owner_id.as_deref(), Some(first.as_str()));
    println!("the assigner crashed; balanced again after {took:?}");
    // The new assigner serves a newcomer too.
    fleet.start("w9", 100);
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(60, 3)).await;
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_drained_workers_streams_are_owned_again_within_two_intervals() {
    let mut fleet = balanced_fleet(60, &["w1", "w2", "w3", "w4"]).await;
    let leaving = not_the_assigner(&fleet.view(), &["w1", "w2", "w3", "w4"]).await;
    fleet.stop(leaving).await;
    let (_, took) = wait_for(&fleet.view(), 2 * DISCOVERY + Duration::from_secs(2), |h| {
        h.balanced(60, 3)
    })
    .await;
    println!("assigned, drain of 1 of 4 (no pushes): owned again after {took:?}");
    fleet.stop_all().await;
}

/// A roll-out lowering `MAX_STREAMS`: "small" announces it holds at most 10
/// (`max_streams` on its presence record), so the assigner advises it 10 and
/// "big" the other 30; advised 20, it would leave 10 streams unowned for good.
#[tokio::test(start_paused = true)]
async fn a_worker_with_less_room_is_advised_only_what_it_holds() {
    let mut fleet = fleet(40).await;
    fleet.start("big", 100);
    fleet.start("small", 10);
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.unowned == 0).await;
    let holdings = fleet.holdings().await.expect("holdings");
    assert_eq!(holdings.held_by.get("small"), Some(&10), "{holdings:?}");
    let churn = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| {
        h.unowned == 0 && h.held_by.get("big") == Some(&30)
    })
    .await;
    assert_eq!(churn, 0);
    fleet.stop_all().await;
}

/// The index lags the table: a lone worker that is its own assigner takes
/// every stream as it assigns it, and its queries keep answering "nothing
/// is yours". It must re-read each record before handing a stream over and
/// find the advice is still its own, or it would drain and retake its
/// streams at every pass.
#[tokio::test(start_paused = true)]
async fn a_lagging_index_never_makes_a_worker_hand_over_its_own_streams() {
    let mut fleet = fleet(20).await;
    fleet.freeze_index(true);
    fleet.start("w1", 100);
    wait_for(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(20, 1)).await;
    let churn = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(20, 1)).await;
    assert_eq!(churn, 0, "streams handed over on a stale index");
    fleet.stop_all().await;
}

/// Real time (the hand-off sockets are real I/O). A draining worker pushes
/// each released stream to a peer chosen from one census it reads at the
/// start of the drain, so its streams are owned again at once, not at the
/// assigner's next pass (5 s) and the peer's next query.
#[tokio::test]
async fn a_drain_pushes_its_streams_to_peers_without_waiting_for_a_pass() {
    let options = FleetOptions {
        streams: 12,
        discovery: DiscoveryMode::Assigned,
        ..FleetOptions::default()
    };
    let mut fleet = Fleet::new(options, Arc::new(leasehold_control::clock::SystemClock))
        .await
        .expect("fleet");
    for owner in ["w1", "w2", "w3"] {
        fleet.start_taking_pushes(owner, 100).expect("socket");
    }
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(12, 3)).await;
    let leaving = not_the_assigner(&fleet.view(), &["w1", "w2", "w3"]).await;
    let view = fleet.view();
    let stopping = tokio::spawn(async move {
        fleet.stop(leaving).await;
        fleet
    });
    let (_, took) = wait_for(&view, Duration::from_secs(3), |h| {
        h.unowned == 0 && !h.held_by.contains_key(leaving)
    })
    .await;
    println!("assigned, drain of 1 of 3 with pushes: owned again after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    stopping.await.unwrap().stop_all().await;
}

/// A datagram is a hint anyone can send: in assigned discovery a worker
/// re-reads the record first, so an id the table does not hold (an acquire
/// would create it) or a reserved record is never taken.
#[tokio::test]
async fn a_forged_push_is_never_taken_in_assigned_discovery() {
    let options = FleetOptions {
        streams: 2,
        discovery: DiscoveryMode::Assigned,
        discovery_interval: Duration::from_millis(200),
        ..FleetOptions::default()
    };
    let mut fleet = Fleet::new(options, Arc::new(leasehold_control::clock::SystemClock))
        .await
        .expect("fleet");
    let addr = fleet.start_taking_pushes("w1", 10).expect("socket");
    wait_for(&fleet.view(), Duration::from_secs(10), |h| {
        h.held_by.get("w1") == Some(&2)
    })
    .await;
    let before = fleet.holdings().await.expect("holdings");
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("sender");
    for forged in ["invented-stream", "leasehold#observer"] {
        sender
            .send_to(&leasehold_stream::handoff::encode(forged), addr)
            .expect("send");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = fleet.holdings().await.expect("holdings");
    assert_eq!(after, before, "a forged push changed the table");
    assert!(fleet.view().record("invented-stream").await.is_err());
    fleet.stop_all().await;
}
