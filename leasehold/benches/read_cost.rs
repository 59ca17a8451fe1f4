//! Lease-table read (and election write) units per hour spent by the readers
//! that only show or count: the dashboard's collector and the cluster observer
//! (its scan and its election), before and after paced, eventually consistent
//! scans and the observer's look-before-write.
//!
//! ```text
//! cargo bench -p leasehold --bench read_cost            # -- --contenders 100
//! ```
//!
//! No server: DynamoDB's capacity rules are applied to the records the stores
//! really write (computed, not read from a server's `ConsumedCapacity`). Each table (1,000 and 10,000 streams) is built on the in-memory
//! store through the store's own writes (acquire, release, acquire by another
//! worker, renew carrying a checkpoint: every attribute a stream record can
//! have), plus a presence record per worker, the doorbell and the observer
//! record. Item size follows DynamoDB's rules (attribute name bytes + value:
//! a string's UTF-8 bytes, a number's ⌈significant digits / 2⌉ + 1 bytes). A
//! Scan page of 1,000 items costs ⌈page bytes / 4 KiB⌉ read units strongly
//! consistent, half that eventually consistent; a GetItem of an item under 4 KiB
//! 1 or 0.5; a write of an item under 1 KiB one write unit, refused or not.
//!
//! Before: the dashboard scanned strongly every 2 s, the observer every 15 s,
//! and every contender tried the observer acquire each renew interval (10 s).
//! After: both scans eventually consistent and paced by `ScanPacing` with the
//! defaults (`DASHBOARD_SCAN_ITEMS_PER_SECOND`, `SIDECAR_OBSERVER_SCAN_ITEMS_PER_SECOND`),
//! and the election measured: `contenders` sidecars run the real
//! `observer::contend` for one simulated hour on tokio's paused clock over a
//! counting store.
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_control::clock::{Clock, PausedClock};
use leasehold_control::keeper::{KeeperConfig, LeaseKeeper};
use leasehold_control::schema::{self, AttrValue, RawItem};
use leasehold_control::store::intercept::{Intercepted, Interceptor, StoreOp};
use leasehold_control::store::memory::MemoryLeaseStore;
use leasehold_control::store::{
    AcquireRequest, Consistency, LeaseError, LeaseStore, ReleaseRequest, RenewRequest, list_all,
};
use leasehold_dashboard::collector::CollectorSettings;
use leasehold_platform::settings::fixed_lookup;
use leasehold_telemetry::LogSink;
use tokio_util::sync::CancellationToken;

const T0: i64 = 1_800_000_000_000;
const LEASE_MS: i64 = 30_000;
const PAGE: usize = 1_000;
const HOUR: f64 = 3_600.0;
/// Streams per worker (`MAX_STREAMS` default).
const PER_WORKER: usize = 100;

fn main() {
    let contenders = std::env::args()
        .skip_while(|a| a != "--contenders")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(100usize);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let dashboard = CollectorSettings::default().pacing();
    let observer = leasehold_sidecar::settings::parse(&fixed_lookup(&[("OWNER_ID", "bench")]))
        .expect("default sidecar settings")
        .observer_pacing;
    println!(
        "read cost: dashboard paced {:?} base at {}/s, observer {:?} base at {}/s, {contenders} observer contenders, renew every 10 s",
        dashboard.base, dashboard.items_per_second, observer.base, observer.items_per_second
    );
    let election = runtime.block_on(election_hour(contenders));
    println!(
        "election, measured over one simulated hour: {} writes ({} refused), {} eventually consistent GetItems",
        election.writes, election.refused, election.looks
    );
    let election_before_writes = contenders as f64 * HOUR / 10.0;
    println!();
    println!(
        "| streams | item size (avg) | scan: strong / eventual RU | dashboard RU/h before → after | observer scan RU/h before → after | election WU/h before → after | election RU/h before → after | total RU/h before → after |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for streams in [1_000, 10_000] {
        let table = runtime.block_on(table(streams));
        let pages = runtime.block_on(page_bytes(&table));
        let items: usize = pages.iter().map(|(n, _)| n).sum();
        let bytes: u64 = pages.iter().map(|(_, b)| b).sum();
        let strong: f64 = pages.iter().map(|(_, b)| b.div_ceil(4096) as f64).sum();
        let eventual = strong / 2.0;
        let dash_before = HOUR / 2.0 * strong;
        let dash_after = HOUR / dashboard.interval(items).as_secs_f64() * eventual;
        let obs_before = HOUR / 15.0 * strong;
        let obs_after = HOUR / observer.interval(items).as_secs_f64() * eventual;
        let looks_after = election.looks as f64 * 0.5;
        let total_before = dash_before + obs_before;
        let total_after = dash_after + obs_after + looks_after;
        println!(
            "| {streams} ({items} items) | {} B | {strong:.0} / {eventual:.1} | {dash_before:.0} → **{dash_after:.0}** (every 2 s → {:?}) | {obs_before:.0} → **{obs_after:.0}** (every 15 s → {:?}) | {election_before_writes:.0} → **{}** | 0 → **{looks_after:.0}** | {total_before:.0} → **{total_after:.0}** |",
            bytes / items as u64,
            dashboard.interval(items),
            observer.interval(items),
            election.writes,
        );
    }
}

/// A table of `streams` records as the stores write them, plus reserved records.
async fn table(streams: usize) -> MemoryLeaseStore {
    let store = MemoryLeaseStore::new();
    let workers = streams.div_ceil(PER_WORKER);
    // Owner ids are ECS task ids (32 hex digits), the stream worker's default.
    let owner = |w: usize| {
        format!(
            "{:032x}",
            0x5eed_0000_0000_0000_u128 * 7 + w as u128 * 7_919
        )
    };
    let acquire = |stream: &str, owner: String, now_ms: i64| AcquireRequest {
        stream_id: stream.to_owned(),
        owner_id: owner,
        now_ms,
        lease_ms: LEASE_MS,
        skew_margin_ms: 1_000,
        sidecar_url: None,
        handoff_addr: None,
        max_streams: None,
        session_token: None,
    };
    for i in 0..streams {
        // Market-data style ids, e.g. `binance:btcusdt-00042@trade`.
        let stream = format!("binance:btcusdt-{i:05}@trade");
        let (first, second) = (owner(i % workers), owner((i + 1) % workers));
        let t = T0 + i as i64;
        let held = store
            .acquire(&acquire(&stream, first.clone(), t))
            .await
            .unwrap();
        store
            .release(&ReleaseRequest {
                checkpoint: None,
                stream_id: stream.clone(),
                owner_id: first,
                fence_token: held.fence_token,
                now_ms: t + 5_123,
                successor: None,
            })
            .await
            .unwrap();
        let held = store
            .acquire(&acquire(&stream, second.clone(), t + 5_377))
            .await
            .unwrap();
        store
            .renew(&RenewRequest {
                stream_id: stream,
                owner_id: second,
                fence_token: held.fence_token,
                now_ms: t + 15_377,
                lease_ms: LEASE_MS,
                checkpoint: Some(48_213_977 + i as u64 * 131),
            })
            .await
            .unwrap();
    }
    for w in 0..workers {
        store
            .acquire(&acquire(&schema::worker_presence(&owner(w)), owner(w), T0))
            .await
            .unwrap();
    }
    store.bump(schema::HANDOFF_DOORBELL, T0).await.unwrap();
    store
        .acquire(&acquire(
            schema::OBSERVER_LEASE,
            "ip-10-0-12-34.eu-west-1.compute.internal".into(),
            T0,
        ))
        .await
        .unwrap();
    store
}

/// (items, bytes) of each Scan page of 1,000 items.
async fn page_bytes(store: &MemoryLeaseStore) -> Vec<(usize, u64)> {
    let keys: Vec<String> = list_all(store, PAGE, Consistency::Eventual)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().stream_id)
        .collect();
    keys.chunks(PAGE)
        .map(|page| {
            let bytes = page
                .iter()
                .map(|key| item_size(&store.get_raw(key).unwrap()))
                .sum();
            (page.len(), bytes)
        })
        .collect()
}

/// DynamoDB's item size: attribute names plus values.
fn item_size(item: &RawItem) -> u64 {
    item.iter()
        .map(|(name, value)| {
            name.len() as u64
                + match value {
                    AttrValue::S(s) => s.len() as u64,
                    AttrValue::N(n) => number_size(n),
                    AttrValue::Other(_) => unreachable!("the stores write S and N only"),
                }
        })
        .sum()
}

/// ⌈significant digits / 2⌉ + 1: leading and trailing zeroes are trimmed.
fn number_size(n: &str) -> u64 {
    let digits = n.trim_start_matches('-').replace('.', "");
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len() as u64;
    significant.max(1).div_ceil(2) + 1
}

#[derive(Debug, Default)]
struct Election {
    writes: u64,
    refused: u64,
    looks: u64,
}

/// `contenders` sidecars contending for the observer lease for one hour.
async fn election_hour(contenders: usize) -> Election {
    let table = Arc::new(Intercepted::new(
        Arc::new(MemoryLeaseStore::new()),
        Counting::default(),
    ));
    let clock: Arc<dyn Clock> = Arc::new(PausedClock::starting_at(T0));
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for index in 0..contenders {
        let keeper = LeaseKeeper::new(
            table.clone(),
            clock.clone(),
            Arc::new(LogSink),
            KeeperConfig {
                owner_id: format!("sidecar-{index:03}"),
                ..KeeperConfig::default()
            },
        );
        let (clock, stop) = (clock.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            // A winner holds (its keeper renews) until the end.
            if let Some(_lease) =
                leasehold_sidecar::observer::contend(&keeper, clock.as_ref(), &stop).await
            {
                stop.cancelled().await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Election {
        writes: table.interceptor().writes.load(Ordering::SeqCst),
        refused: table.interceptor().refused.load(Ordering::SeqCst),
        looks: table.interceptor().looks.load(Ordering::SeqCst),
    }
}

/// Counts the election's writes (and those the store refused) and its looks
/// (single-record reads; listings are not counted).
#[derive(Default)]
struct Counting {
    writes: AtomicU64,
    refused: AtomicU64,
    looks: AtomicU64,
}

#[async_trait]
impl Interceptor for Counting {
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        if matches!(op, StoreOp::Get { .. }) {
            self.looks.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn after(&self, op: StoreOp<'_>, outcome: Result<(), &LeaseError>) {
        if op.is_write() {
            self.writes.fetch_add(1, Ordering::SeqCst);
            if outcome.is_err() {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}
