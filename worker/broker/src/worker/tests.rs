use super::*;

#[tokio::test(start_paused = true)]
async fn schedule_health_checks_only_idle_connections_and_times_out() {
    let start = Instant::now();
    let mut schedule = Schedule::new(start, Duration::from_secs(1800), Duration::from_secs(60));
    assert_eq!(schedule.due(start), Due::Wait(Duration::from_secs(60)));
    tokio::time::advance(Duration::from_secs(50)).await;
    schedule.activity(Instant::now());
    tokio::time::advance(Duration::from_secs(20)).await;
    // 70 s since start, but only 20 s since the last request: not due.
    assert_eq!(
        schedule.due(Instant::now()),
        Due::Wait(Duration::from_secs(40))
    );
    tokio::time::advance(Duration::from_secs(40)).await;
    assert_eq!(schedule.due(Instant::now()), Due::HealthCheck);
    schedule.health_checked(Instant::now());
    assert_eq!(
        schedule.due(Instant::now()),
        Due::Wait(Duration::from_secs(60))
    );
    tokio::time::advance(Duration::from_secs(1800)).await;
    assert_eq!(schedule.due(Instant::now()), Due::IdleTimeout);
}

#[tokio::test(start_paused = true)]
async fn idle_deadline_bounds_the_wait() {
    let start = Instant::now();
    let schedule = Schedule::new(start, Duration::from_secs(10), Duration::from_secs(60));
    assert_eq!(schedule.due(start), Due::Wait(Duration::from_secs(10)));
}

#[tokio::test(start_paused = true)]
async fn the_holder_deadline_runs_from_the_last_confirmed_heartbeat() {
    let claimed = Instant::now();
    let holder = Holder::new(claimed, Duration::from_secs(30), Duration::from_secs(5));
    tokio::time::advance(Duration::from_secs(24)).await;
    assert!(
        holder.time_left(Instant::now()).is_some(),
        "within TTL − heartbeat"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        holder.time_left(Instant::now()).is_none(),
        "heartbeats failed for 25 s: the mark may have expired"
    );
    // A heartbeat sent 2 s ago and confirmed now restores it, from its send time.
    holder.confirmed(Instant::now() - Duration::from_secs(2));
    assert!(holder.time_left(Instant::now()).is_some());
    tokio::time::advance(Duration::from_secs(23)).await;
    assert!(holder.time_left(Instant::now()).is_none());
    // A late confirmation of an older heartbeat never moves the deadline back.
    let before = Instant::now();
    holder.confirmed(before);
    holder.confirmed(before - Duration::from_secs(10));
    assert!(holder.time_left(Instant::now()).is_some());
}

#[tokio::test(start_paused = true)]
async fn an_order_call_is_cut_to_the_time_left_before_the_holder_deadline() {
    let holder = Holder::new(
        Instant::now(),
        Duration::from_secs(30),
        Duration::from_secs(5),
    );
    assert_eq!(
        holder.time_left(Instant::now()),
        Some(Duration::from_secs(25))
    );
    tokio::time::advance(Duration::from_secs(22)).await;
    assert_eq!(
        holder.time_left(Instant::now()),
        Some(Duration::from_secs(3)),
        "a 10 s order timeout is cut to the 3 s left"
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(holder.time_left(Instant::now()), None);
}
