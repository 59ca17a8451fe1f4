//! Discovery as input scripts: no runtime, no store, time passed in.

use super::*;

const INTERVAL: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(500);

fn actions(discovery: &mut Discovery) -> Vec<Action> {
    std::iter::from_fn(|| discovery.poll_action()).collect()
}

fn done(discovery: &mut Discovery, now: Instant) {
    discovery.handle(
        Input::PassDone {
            succeeded: true,
            jitter: 1.0,
            due: None,
        },
        now,
    );
}

fn probe(stream: &str) -> Probe {
    Probe {
        stream: stream.into(),
        lapsing_owner: Some("w2".into()),
    }
}

#[test]
fn a_scanning_worker_announces_itself_then_scans_strongly_one_poll_later() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    assert_eq!(
        actions(&mut discovery),
        [Action::RingDoorbell, Action::ReadDoorbell]
    );
    discovery.handle(Input::DoorbellRead(7), t0);
    assert_eq!(discovery.poll_timeout(), Some(t0 + POLL));
    discovery.handle_timeout(t0 + POLL);
    assert_eq!(
        actions(&mut discovery),
        [Action::ReadDoorbell, Action::Scan(Consistency::Strong)]
    );
}

#[test]
fn a_due_scan_reads_eventually_and_a_rung_doorbell_asks_for_a_strong_one_now() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    actions(&mut discovery);
    discovery.handle(Input::DoorbellRead(7), t0);
    discovery.handle_timeout(t0 + POLL);
    actions(&mut discovery);
    done(&mut discovery, t0 + POLL);
    // The same value: nothing asked for; the scan comes an interval later.
    discovery.handle(Input::DoorbellRead(7), t0 + POLL);
    discovery.handle_timeout(t0 + POLL * 2);
    assert_eq!(actions(&mut discovery), [Action::ReadDoorbell]);
    discovery.handle(Input::DoorbellRead(7), t0 + POLL * 2);
    discovery.handle_timeout(t0 + POLL + INTERVAL);
    assert!(actions(&mut discovery).contains(&Action::Scan(Consistency::Eventual)));
    done(&mut discovery, t0 + POLL + INTERVAL);
    // A peer released something: scan now, strongly.
    let later = t0 + POLL * 2 + INTERVAL;
    discovery.handle(Input::DoorbellRead(8), later);
    assert_eq!(discovery.poll_timeout(), Some(later));
    discovery.handle_timeout(later);
    assert_eq!(actions(&mut discovery), [Action::Scan(Consistency::Strong)]);
}

#[test]
fn a_failed_pass_is_retried_at_the_next_interval_still_strongly() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    actions(&mut discovery);
    discovery.handle_timeout(t0 + POLL);
    actions(&mut discovery);
    discovery.handle(
        Input::PassDone {
            succeeded: false,
            jitter: 0.8,
            due: None,
        },
        t0 + POLL,
    );
    let next = t0 + POLL + INTERVAL.mul_f64(0.8);
    discovery.handle(Input::DoorbellRead(0), t0 + POLL);
    discovery.handle_timeout(next);
    assert!(actions(&mut discovery).contains(&Action::Scan(Consistency::Strong)));
}

#[test]
fn a_scanning_worker_rings_for_what_it_released_to_nobody_and_looks_again_soon() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    actions(&mut discovery);
    discovery.handle_timeout(t0 + POLL);
    actions(&mut discovery);
    done(&mut discovery, t0 + POLL);
    let t1 = t0 + Duration::from_secs(2);
    discovery.handle(Input::StreamEnded(Ended::Released), t1);
    assert_eq!(actions(&mut discovery), [Action::RingDoorbell]);
    discovery.handle(Input::StreamEnded(Ended::HandedOn), t1);
    discovery.handle(Input::StreamEnded(Ended::Other), t1);
    assert_eq!(actions(&mut discovery), []);
    discovery.handle_timeout(t1 + POLL);
    assert!(actions(&mut discovery).contains(&Action::Scan(Consistency::Strong)));
}

#[test]
fn pushes_and_probes_are_checked_against_the_share_when_scanning() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    actions(&mut discovery);
    discovery.handle(Input::Pushed(vec!["a".into(), "b".into()]), t0);
    discovery.handle(Input::ProbeDue(probe("c")), t0);
    assert_eq!(
        actions(&mut discovery),
        [
            Action::AcquireIfRoom(vec!["a".into(), "b".into()]),
            Action::ProbeShare(probe("c")),
        ]
    );
}

#[test]
fn an_assigned_worker_reads_no_doorbell_and_follows_its_assignments() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Assigned, INTERVAL, POLL, t0);
    assert_eq!(actions(&mut discovery), []);
    assert_eq!(discovery.poll_timeout(), Some(t0 + POLL));
    discovery.handle_timeout(t0 + POLL);
    assert_eq!(actions(&mut discovery), [Action::FollowAssignments]);
    // The assigner must plan again before the interval (a presence lapses).
    let due = t0 + Duration::from_secs(3);
    discovery.handle(
        Input::PassDone {
            succeeded: true,
            jitter: 1.0,
            due: Some(due),
        },
        t0 + POLL,
    );
    assert_eq!(discovery.poll_timeout(), Some(due));
    // A release rings nothing: pushes and the assigner find it.
    discovery.handle(Input::StreamEnded(Ended::Released), t0 + POLL);
    assert_eq!(actions(&mut discovery), []);
    // A sink that gave up rings in both modes: peers may reach it.
    discovery.handle(Input::StreamEnded(Ended::SinkGaveUp), t0 + POLL);
    assert_eq!(actions(&mut discovery), [Action::RingDoorbell]);
}

#[test]
fn an_assigned_worker_takes_what_is_advised_to_it_and_chooses_successors_before_a_drain() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Assigned, INTERVAL, POLL, t0);
    discovery.handle(Input::Pushed(vec!["a".into()]), t0);
    discovery.handle(Input::ProbeDue(probe("c")), t0);
    discovery.handle(Input::Drain, t0);
    assert_eq!(
        actions(&mut discovery),
        [
            Action::TakeAdvised {
                streams: vec!["a".into()],
                pushed: true
            },
            Action::TakeAdvised {
                streams: vec!["c".into()],
                pushed: false
            },
            Action::ChooseSuccessors,
        ]
    );
    assert_eq!(discovery.poll_timeout(), None);
}

#[test]
fn a_draining_scanner_stops_looking() {
    let t0 = Instant::now();
    let mut discovery = Discovery::new(DiscoveryMode::Scan, INTERVAL, POLL, t0);
    actions(&mut discovery);
    discovery.handle(Input::DoorbellRead(1), t0);
    discovery.handle(Input::Drain, t0);
    assert_eq!(actions(&mut discovery), []);
    assert_eq!(discovery.poll_timeout(), None);
}
