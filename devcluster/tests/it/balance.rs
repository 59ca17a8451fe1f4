//! Balancing with whole stream workers on tokio's paused clock: cold start,
//! scale-out, crash takeover and a peer that cannot take, judged from the lease
//! table alone (who holds what, and how many acquisitions it took).

use std::sync::Arc;
use std::time::Duration;

use crate::support::{moves_while_idle, wait_for};
use leasehold_control::clock::PausedClock;
use leasehold_devcluster::fleet::{Fleet, FleetOptions};

const DISCOVERY: Duration = Duration::from_secs(5);

async fn fleet(streams: usize) -> Fleet {
    let options = FleetOptions {
        streams,
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

#[tokio::test(start_paused = true)]
async fn a_cold_start_spreads_within_two_discovery_intervals() {
    let mut fleet = fleet(100).await;
    let start = tokio::time::Instant::now();
    // Started one second apart, all within one discovery interval: the first
    // finds every stream free before its peers exist.
    for (index, owner) in ["w1", "w2", "w3", "w4"].into_iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        fleet.start(owner, 100);
    }
    let (_, waited) = wait_for(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(100, 4)).await;
    let spread_after = start.elapsed() - Duration::from_secs(3) + waited;
    assert!(spread_after <= 2 * DISCOVERY, "{spread_after:?}");
    let churn = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(100, 4)).await;
    assert_eq!(churn, 0, "a balanced fleet moves nothing");
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_scale_out_from_four_to_five_moves_only_the_new_share() {
    let mut fleet = fleet(100).await;
    for owner in ["w1", "w2", "w3", "w4"] {
        fleet.start(owner, 100);
    }
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(100, 4)).await;
    moves_while_idle(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(100, 4)).await;
    let before = fleet.holdings().await.expect("holdings").acquisitions;
    fleet.start("w5", 100);
    let (_, took) = wait_for(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(100, 5)).await;
    let after_settle = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(100, 5)).await;
    let moves = fleet.holdings().await.expect("holdings").acquisitions - before;
    println!(
        "scale-out 4 → 5, 100 streams: {moves} lease moves (ideal 20), balanced after {took:?}"
    );
    assert_eq!(after_settle, 0, "no churn once balanced");
    assert_eq!(moves, 20, "exactly the new worker's share moves");
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn after_a_crash_probes_fill_the_survivors_to_their_share_only() {
    let mut fleet = fleet(100).await;
    for owner in ["w1", "w2", "w3", "w4", "w5"] {
        fleet.start(owner, 100);
    }
    wait_for(&fleet.view(), 4 * DISCOVERY, |h| h.balanced(100, 5)).await;
    moves_while_idle(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(100, 5)).await;
    let before = fleet.holdings().await.expect("holdings").acquisitions;
    fleet.crash("w3");
    // The orphans become takeable one lease (30 s) plus the skew margin later.
    let (_, took) = wait_for(&fleet.view(), Duration::from_secs(40), |h| {
        h.balanced(100, 4)
    })
    .await;
    let after_settle = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(100, 4)).await;
    let moves = fleet.holdings().await.expect("holdings").acquisitions - before;
    println!(
        "crash of 1 of 5, 100 streams: {moves} lease moves (ideal 20), balanced after {took:?}"
    );
    assert_eq!(after_settle, 0, "no churn once balanced");
    assert_eq!(moves, 20, "only the crashed worker's streams move");
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_cannot_take_gets_no_stream_again_and_none_stays_unowned() {
    // A roll-out lowering MAX_STREAMS: "small" counts in the fair share (20
    // each) but holds at most 10, so "big" must carry 30.
    let mut fleet = fleet(40).await;
    fleet.start("big", 100);
    fleet.start("small", 10);
    let (holdings, _) = wait_for(&fleet.view(), 6 * DISCOVERY, |h| h.unowned == 0).await;
    assert_eq!(holdings.held_by.get("small"), Some(&10), "{holdings:?}");
    // One gift plays out: "big" hands its excess back, nobody takes it, and once
    // it has been free for an interval "big" takes it again. 30 + 10 + 10
    // acquisitions, and not one more afterwards.
    let (holdings, _) = wait_for(&fleet.view(), 12 * DISCOVERY, |h| {
        h.acquisitions >= 50 && h.unowned == 0
    })
    .await;
    assert_eq!(holdings.acquisitions, 50, "{holdings:?}");
    let churn = moves_while_idle(&fleet.view(), 20 * DISCOVERY, |h| {
        h.unowned == 0 && h.held_by.get("big") == Some(&30)
    })
    .await;
    assert_eq!(churn, 0, "a hand-back nobody can take is not repeated");
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_worker_gets_the_richest_peers_gift_and_the_gift_is_not_passed_around() {
    // Eight streams on six workers (2, 2, 1, 1, 1, 1): a seventh worker is owed
    // one. Five peers have room for a second stream, and all of them hear the
    // doorbell when the richest releases its gift; the new worker must still
    // get it, at once, and nothing else may move.
    let mut fleet = fleet(8).await;
    for (index, owner) in ["w1", "w2", "w3", "w4", "w5", "w6"].into_iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(Duration::from_millis(37)).await;
        }
        fleet.start(owner, 100);
    }
    wait_for(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(8, 6)).await;
    moves_while_idle(&fleet.view(), 2 * DISCOVERY, |h| h.balanced(8, 6)).await;
    let before = fleet.holdings().await.expect("holdings").acquisitions;
    fleet.start("n1", 100);
    let (_, took) = wait_for(&fleet.view(), 4 * DISCOVERY, |h| {
        h.held_by.get("n1") == Some(&1)
    })
    .await;
    let churn = moves_while_idle(&fleet.view(), 6 * DISCOVERY, |h| h.balanced(8, 7)).await;
    let moves = fleet.holdings().await.expect("holdings").acquisitions - before;
    println!("scale-out 6 → 7, 8 streams: {moves} lease moves (ideal 1), n1 served after {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "n1 waited {took:?} for its stream"
    );
    assert_eq!(churn, 0, "no churn once balanced");
    assert_eq!(moves, 1, "only the new worker's one stream moves");
    fleet.stop_all().await;
}

/// A datagram is a hint, and anyone on the network can send one: a worker
/// acts only on a stream id its last scan saw. An acquire of an id the table
/// does not hold would create the record (the acquire doubles as
/// registration), so a forged push would otherwise make the worker invent and
/// run a stream. Real time: the hand-off socket is real I/O.
#[tokio::test]
async fn a_pushed_id_that_is_not_a_stream_of_the_table_is_never_taken() {
    let options = FleetOptions {
        streams: 2,
        discovery_interval: Duration::from_millis(200),
        handoff_poll: Duration::from_millis(50),
        ..FleetOptions::default()
    };
    let mut fleet = Fleet::new(options, Arc::new(leasehold_control::clock::SystemClock))
        .await
        .expect("fleet");
    let addr = fleet.start_taking_pushes("w1", 10).expect("socket");
    let (before, _) = wait_for(&fleet.view(), Duration::from_secs(10), |h| {
        h.held_by.get("w1") == Some(&2)
    })
    .await;
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("sender");
    for forged in ["invented-stream", "leasehold#observer"] {
        sender
            .send_to(&leasehold_stream::handoff::encode(forged), addr)
            .expect("send");
    }
    // Several doorbell polls and scans: time enough to act on the push.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = fleet.holdings().await.expect("holdings");
    assert_eq!(after.held_by.get("w1"), Some(&2), "{after:?}");
    assert_eq!(after.acquisitions, before.acquisitions, "{after:?}");
    fleet.stop_all().await;
}
