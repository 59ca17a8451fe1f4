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
