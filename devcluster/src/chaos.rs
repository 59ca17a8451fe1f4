//! Chaos for `dev`: one action every period on a random stream worker (crash,
//! pause, roll) or on the broker pool (a crashed broker worker), so takeovers,
//! fencing and pool refills show on the dashboard.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::pool::PoolRuntime;
use crate::{Slot, StreamShared};

/// One chaos action every `every`, on a random worker or the pool.
pub(crate) async fn run(
    slots: Arc<tokio::sync::Mutex<Vec<Slot>>>,
    shared: Arc<StreamShared>,
    pool: Arc<PoolRuntime>,
    every: Duration,
    lease: Duration,
    stop: CancellationToken,
) {
    let mut round: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        round += 1;
        let action = rand::random_range(0..4u8);
        if action == 3 {
            pool.crash_random_worker().await;
            continue;
        }
        let mut slots = slots.lock().await;
        let index = rand::random_range(0..slots.len());
        let slot = &mut slots[index];
        let Some(running) = slot.running.take() else {
            continue;
        };
        match action {
            0 => {
                println!(
                    "chaos #{round}: crash {} (no release: its streams wait for expiry)",
                    running.owner_id
                );
                running.gate.fail();
                running.shutdown.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), running.task).await;
                if let Err(err) = shared.start(slot) {
                    tracing::error!(error = %err, "cannot restart a worker");
                }
            }
            1 => {
                // Past the lease, the skew margin and a discovery round, so a
                // peer has taken the streams over (with a higher token) by the
                // time the held writes go through.
                let pause = lease + Duration::from_secs(4);
                println!(
                    "chaos #{round}: pause {} for {} s (a zombie: its held writes meet a newer token)",
                    running.owner_id,
                    pause.as_secs()
                );
                let number = running.gate.block();
                let gate = running.gate.clone();
                slot.running = Some(running);
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    gate.end_pause(number);
                });
            }
            _ => {
                println!(
                    "chaos #{round}: roll {} (drain and hand off, then a new worker)",
                    running.owner_id
                );
                running.gate.open();
                running.shutdown.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), running.task).await;
                if let Err(err) = shared.start(slot) {
                    tracing::error!(error = %err, "cannot restart a worker");
                }
            }
        }
    }
}
