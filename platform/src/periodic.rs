//! "Every period until cancelled": the one loop behind every periodic task
//! (collector refresh, sidecar upkeep, pool manager and maintenance passes).

use std::future::Future;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Runs `pass` at once and then every `period` until `stop` is cancelled. A pass
/// that overruns delays the next one instead of bunching them up, and a pass in
/// progress is finished (not dropped) when `stop` fires.
pub async fn every<F, Fut>(period: Duration, stop: CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let passes = try_once_or_every(Some(period), stop, || {
        let pass = pass();
        async move {
            pass.await;
            Ok::<(), std::convert::Infallible>(())
        }
    });
    match passes.await {
        Ok(()) => {}
        Err(never) => match never {},
    }
}

/// One pass when `period` is `None` (a scheduled task), else a pass at once and
/// every `period` until `stop`, as [`every`]. The first failing pass ends it.
pub async fn try_once_or_every<F, Fut, E>(
    period: Option<Duration>,
    stop: CancellationToken,
    mut pass: F,
) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let Some(period) = period else {
        return pass().await;
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => pass().await?,
        }
    }
}

/// Runs `pass` at once and again each time the period it returned has passed
/// since it started, until `stop` is cancelled: a loop whose period follows
/// what the pass found (a scan paced by the table's size). A pass that overruns
/// its period is followed by the next at once, never by several; a pass in
/// progress is finished when `stop` fires.
pub async fn paced<F, Fut>(stop: CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Duration>,
{
    loop {
        let started = tokio::time::Instant::now();
        let period = pass().await;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(started + period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn runs_at_once_then_every_period_until_cancelled() {
        let passes = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let passes = passes.clone();
            let stop = stop.clone();
            async move {
                every(Duration::from_secs(5), stop, || {
                    passes.fetch_add(1, Ordering::SeqCst);
                    async {}
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(12_500)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "at 0 s, 5 s and 10 s");
        stop.cancel();
        task.await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "nothing after cancel");
    }

    #[tokio::test(start_paused = true)]
    async fn paced_waits_the_period_each_pass_returns_from_its_start() {
        let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let origin = tokio::time::Instant::now();
        let task = tokio::spawn({
            let starts = starts.clone();
            let stop = stop.clone();
            async move {
                paced(stop, || {
                    let starts = starts.clone();
                    async move {
                        let n = {
                            let mut starts = starts.lock().unwrap();
                            starts.push(origin.elapsed().as_secs());
                            starts.len() as u64
                        };
                        // Each pass takes 1 s and asks for a longer period;
                        // the fourth overruns its 1 s period by 2 s.
                        let work = if n == 4 { 3 } else { 1 };
                        tokio::time::sleep(Duration::from_secs(work)).await;
                        Duration::from_secs(if n == 4 { 1 } else { 2 * n })
                    }
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(17_500)).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(*starts.lock().unwrap(), vec![0, 2, 6, 12, 15]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_period_runs_once_and_a_failure_ends_the_loop() {
        let passes = AtomicU32::new(0);
        let once = try_once_or_every(None, CancellationToken::new(), || {
            passes.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), ()>(()) }
        });
        assert_eq!(once.await, Ok(()));
        assert_eq!(passes.load(Ordering::SeqCst), 1);
        let failing = try_once_or_every(
            Some(Duration::from_secs(1)),
            CancellationToken::new(),
            || {
                let n = passes.fetch_add(1, Ordering::SeqCst);
                async move { if n == 3 { Err(n) } else { Ok(()) } }
            },
        );
        assert_eq!(
            failing.await,
            Err(3),
            "the third pass of the loop fails and ends it"
        );
    }
}
