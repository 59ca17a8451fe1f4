//! Real recorded exchange sessions (`testdata/recordings/`) replayed through
//! real worker processes: a `leasehold stream-worker` (with its sidecar),
//! moto and Redis, and the recording server (`support::recording`) playing
//! the exchange, cut three times through the replay.
//!
//! `worker/stream/tests/it/recorded_books.rs` shows the book code agrees
//! with the recordings in memory; here the worker has to get there over
//! real connections that break: what the sink holds must be the recording's
//! books, not merely books that look plausible. Checked per stream:
//! 1. the book rebuilt from the sink after the run is the recording's at the
//!    same position (its last update);
//! 2. every snapshot entry is the recording's book at its position;
//! 3. after each snapshot, every recorded update follows once, in order, as
//!    received (Binance: the `pu` chain; Kraken: the recorded frames);
//! 4. each later snapshot names the updates it replaces (`gap_from` = the
//!    previous entry + 1) when some were missed;
//! 5. (Kraken) every recorded checksum verified in the worker.
//!
//! Plus the worker's counters (one reconnect per cut, one snapshot counted
//! per snapshot entry) and `leasehold book --json` agreeing with the
//! recording's best bid and ask.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::recording::{
    BinanceFutures, BinanceSymbol, KRAKEN_DEPTH, Kraken, KrakenPair, RecordingServer,
    assert_same_book, clear_sink, counter_by_reason,
};
use crate::support::{Cluster, run_leasehold, serial};
use leasehold_sink::memory::StoredEvent;
use leasehold_stream::book::{Book, BookFormat, BookKeeper, ChecksumRule, KeeperOptions, Verdict};
use leasehold_telemetry::GapReason;

/// Server cuts per run.
const CUTS: usize = 3;
/// The ~30 s sessions replayed in this: the Binance symbols send a diff
/// every ~20 ms, the busiest Kraken pair an update every ~7 ms; a reconnect
/// (up to a few hundred ms of backoff) misses some, and three cuts fit with
/// a second and more between them.
const REPLAY: Duration = Duration::from_secs(6);

/// What a run left: the sink's entries by stream and the sidecar's counters.
struct Run {
    entries: BTreeMap<String, Vec<StoredEvent>>,
    /// `leasehold_websocket_reconnects_total` by reason.
    reconnects: BTreeMap<String, u64>,
    /// `leasehold_stream_snapshots_total` by reason.
    snapshots: BTreeMap<String, u64>,
    /// `leasehold_stream_checksum_failures_total`.
    checksum_failures: u64,
    /// `leasehold book STREAM --json` for the first stream, after the run.
    cli_book: serde_json::Value,
    logs: String,
}

async fn metrics(cluster: &Cluster) -> String {
    let sidecar = &cluster.sidecars["w1"].http;
    let (_, _, body) = leasehold_testkit::http_get(sidecar, "/metrics")
        .await
        .expect("the sidecar answers");
    body
}

/// Starts one worker on `streams` against `server`, cuts every connection
/// `CUTS` times through the replay, waits for the replay to end and for
/// `done` to hold for every stream's entries, then stops the worker.
/// `None` when the test servers are not configured (skip).
async fn run(
    server: &RecordingServer,
    streams: &[String],
    done: impl Fn(&str, &[StoredEvent]) -> bool,
) -> Option<Run> {
    let mut cluster = Cluster::start_on(server.ws_url(), streams.to_vec()).await?;
    clear_sink(&cluster.redis, streams).await;
    let settings = server.worker_settings();
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cluster.start_worker_with_sidecar("w1", &settings);

    // Each instrument's replay starts with its first connection (or
    // subscription): cut while every one of them is under way.
    let waiting = Instant::now();
    let starts = loop {
        let starts: Option<Vec<_>> = server.started(streams).into_iter().collect();
        if let Some(starts) = starts {
            break starts;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "not every stream connected: {:?}\n{}",
            server.started(streams),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (first, last) = (*starts.iter().min().unwrap(), *starts.iter().max().unwrap());
    let window = (first + server.replay()).saturating_duration_since(last);
    assert!(
        window >= server.replay() / 2,
        "the streams started {:?} apart: no common replay to cut",
        last - first
    );
    for cut in 1..=CUTS {
        let at = last + window * cut as u32 / (CUTS as u32 + 1);
        tokio::time::sleep_until(at).await;
        assert_eq!(
            server.cut_all(),
            streams.len(),
            "cut {cut}: a connection per stream is open\n{}",
            cluster.logs()
        );
    }

    let waiting = Instant::now();
    loop {
        let mut pending = Vec::new();
        for stream in streams {
            if !done(stream, &cluster.sink_entries(stream).await) {
                pending.push(stream.as_str());
            }
        }
        if server.ended(streams) && pending.is_empty() {
            break;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "the sink does not end with the recording's last update for {pending:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The sidecar counts what the worker reports, a moment later.
    let mut entries = BTreeMap::new();
    for stream in streams {
        entries.insert(stream.clone(), cluster.sink_entries(stream).await);
    }
    let written = entries.values().flatten().filter(|e| e.snapshot).count() as u64;
    let waiting = Instant::now();
    let body = loop {
        let body = metrics(&cluster).await;
        let reconnects: u64 = counter_by_reason(&body, "leasehold_websocket_reconnects_total")
            .values()
            .sum();
        let snapshots: u64 = counter_by_reason(&body, "leasehold_stream_snapshots_total")
            .values()
            .sum();
        if (reconnects >= (CUTS * streams.len()) as u64 && snapshots >= written)
            || waiting.elapsed() > Duration::from_secs(5)
        {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let (status, output) = run_leasehold(
        &["book", &streams[0], "--json"],
        &[("SINK_URL".to_owned(), cluster.redis.clone())],
        None,
    );
    assert!(status.success(), "leasehold book: {output}");
    // Stdout (the JSON) comes first in the output; anything after it is stderr.
    let cli_book = serde_json::Deserializer::from_str(&output)
        .into_iter::<serde_json::Value>()
        .next()
        .unwrap()
        .unwrap_or_else(|e| panic!("leasehold book --json: {e}: {output}"));

    cluster.stop_workers();
    let logs = cluster.logs();
    for stream in streams {
        // What the sink holds once the worker stopped (its drain wrote
        // anything it still held).
        entries.insert(stream.clone(), cluster.sink_entries(stream).await);
    }
    Some(Run {
        entries,
        reconnects: counter_by_reason(&body, "leasehold_websocket_reconnects_total"),
        snapshots: counter_by_reason(&body, "leasehold_stream_snapshots_total"),
        checksum_failures: counter_by_reason(&body, "leasehold_stream_checksum_failures_total")
            .values()
            .sum(),
        cli_book,
        logs,
    })
}

impl Run {
    /// The worker's counters agree with the sink: one reconnect per cut and
    /// stream (no reconnect loop), one snapshot counted per snapshot entry,
    /// none for a checksum.
    fn check_counters(&self, streams: usize) {
        let reconnects: u64 = self.reconnects.values().sum();
        assert_eq!(
            reconnects,
            (CUTS * streams) as u64,
            "one reconnect per cut and stream: {:?}\n{}",
            self.reconnects,
            self.logs
        );
        let written = self
            .entries
            .values()
            .flatten()
            .filter(|e| e.snapshot)
            .count() as u64;
        let counted: u64 = self.snapshots.values().sum();
        assert_eq!(
            counted, written,
            "snapshots counted {:?}, entries {written}",
            self.snapshots
        );
        assert_eq!(self.snapshots.get("checksum").copied().unwrap_or(0), 0);
        assert_eq!(self.checksum_failures, 0, "{}", self.logs);
    }

    /// One line for `--nocapture`: what the run did.
    fn report(&self, name: &str, later_books: usize, server: &RecordingServer, started: Instant) {
        eprintln!(
            "{name}: {} entries in {} streams, {later_books} books after the cuts, {} \
             connections, reconnects {:?}, snapshots {:?}, {:.1?}",
            self.entries.values().map(Vec::len).sum::<usize>(),
            self.entries.len(),
            server.connections(),
            self.reconnects,
            self.snapshots,
            started.elapsed()
        );
    }

    /// `leasehold book STREAM --json` shows `book`'s best bid and ask.
    fn check_cli(&self, stream: &str, book: &Book) {
        let level = |level: Option<leasehold_stream::book::Level>| {
            let level = level.unwrap();
            serde_json::json!([level.price.as_str(), level.qty.as_str()])
        };
        assert_eq!(self.cli_book["stream_id"], stream, "{}", self.cli_book);
        assert_eq!(
            self.cli_book["best_bid"],
            level(book.best_bid()),
            "{stream}"
        );
        assert_eq!(
            self.cli_book["best_ask"],
            level(book.best_ask()),
            "{stream}"
        );
    }
}

/// Entries are a book first, then nothing but book messages and books that
/// replace missed ones: no bare gap marker, no reset, positions increasing.
fn check_shape(stream: &str, entries: &[StoredEvent]) {
    assert!(!entries.is_empty(), "{stream}: nothing written");
    let first = &entries[0];
    assert!(
        first.snapshot && first.gap.is_none(),
        "{stream}: the first entry is a book with nothing before it: {first:?}"
    );
    for entry in entries {
        assert!(
            entry.reset.is_none() && (entry.snapshot || entry.gap.is_none()),
            "{stream}: a reset or a bare gap marker: {entry:?}"
        );
        if !entry.snapshot {
            assert_eq!(
                entry.event_id,
                entry.seq.to_string(),
                "{stream}: the id is the sequence"
            );
        }
    }
    assert!(
        entries.windows(2).all(|w| w[0].seq < w[1].seq),
        "{stream}: positions increase"
    );
}

/// A later snapshot at `entry` after `previous` names what it replaces.
#[track_caller]
fn check_gap(stream: &str, previous: &StoredEvent, entry: &StoredEvent, missed: bool) {
    match entry.gap {
        Some(gap) => {
            assert_eq!(
                gap.from,
                previous.seq + 1,
                "{stream}: {entry:?} after {previous:?}"
            );
            assert_eq!(gap.reason, GapReason::NoReplay, "{stream}: {entry:?}");
        }
        None => assert!(
            !missed,
            "{stream}: a book replacing missed updates says nothing: {entry:?}"
        ),
    }
}

/// Binance USD-M futures (the REST snapshot, then diffs chained by `pu`),
/// all four symbols.
fn check_binance(stream: &str, symbol: &BinanceSymbol, entries: &[StoredEvent]) -> usize {
    const F: BookFormat = BookFormat::Binance;
    check_shape(stream, entries);
    // The first book is the recorded REST body, stored as served, unless
    // the worker asked only once the first diff after it was due (20 to 70
    // ms into the replay, by symbol).
    if entries[0].seq == symbol.snapshot_id {
        assert_eq!(
            entries[0].payload, symbol.snapshot,
            "{stream}: the recorded snapshot"
        );
    }
    let mut book = Book::new();
    // The index of the recorded diff that must come next.
    let mut next = 0;
    let mut later_books = 0;
    for (i, entry) in entries.iter().enumerate() {
        let message = F.read_message(entry.payload.as_bytes()).unwrap().unwrap();
        let range = F.sequence_range(entry.payload.as_bytes()).unwrap().unwrap();
        if entry.snapshot {
            // (2) the book the recording gives at its lastUpdateId.
            assert_eq!(range.last, entry.seq, "{stream}: {entry:?}");
            let recorded = symbol.book_at(entry.seq).unwrap_or_else(|| {
                panic!("{stream}: book at {}: no point of the recording", entry.seq)
            });
            book = Book::rebuild(F, None, entry.payload.as_bytes(), [""; 0]).unwrap();
            assert_same_book(
                &book,
                &recorded,
                &format!("{stream}: the book at {}", entry.seq),
            );
            if i > 0 {
                // (4) diffs between the entry before and this book were missed.
                let previous = &entries[i - 1];
                let missed = symbol.diffs[next..].iter().any(|d| d.last <= entry.seq);
                assert!(missed, "{stream}: a book at {} replaces nothing", entry.seq);
                check_gap(stream, previous, entry, missed);
                later_books += 1;
            }
            next = symbol.first_after(entry.seq);
            continue;
        }
        // (3) the next recorded diff, as received, chained to what is before.
        let recorded = symbol
            .diffs
            .get(next)
            .unwrap_or_else(|| panic!("{stream}: {entry:?} after the recording's last diff"));
        assert_eq!(
            (entry.seq, entry.payload.as_str()),
            (recorded.last, recorded.body.as_str()),
            "{stream}: entry {i} is not recorded diff {next}"
        );
        let before = entries[i - 1].seq;
        match entries[i - 1].snapshot {
            // The first diff after a book covers its id + 1.
            true => assert!(
                range.prev.unwrap() <= before && before < range.last,
                "{stream}: entry {i} does not cover the book's id + 1"
            ),
            false => assert_eq!(range.prev, Some(before), "{stream}: pu of entry {i}"),
        }
        book.apply(&message);
        next += 1;
    }
    // (1) the sink ends at the recording's end, with the recording's book.
    let end = symbol.diffs.last().unwrap().last;
    assert_eq!(entries.last().unwrap().seq, end, "{stream}");
    let recorded = symbol.book_at(end).unwrap();
    assert_same_book(
        &book,
        &recorded,
        &format!("{stream}: the book after the run"),
    );
    later_books
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binance_futures_books_in_the_sink_are_the_recordings_through_three_cuts() {
    let _serial = serial().await;
    let started = Instant::now();
    let recording = Arc::new(BinanceFutures::load());
    let server = RecordingServer::binance_futures(recording.clone(), REPLAY).await;
    // Stream ids are the symbols as the WebSocket path spells them; the
    // busiest first (the one `leasehold book` reads).
    let mut streams: Vec<String> = recording.symbols.keys().cloned().collect();
    streams.sort_by_key(|s| std::cmp::Reverse(recording.symbols[s].diffs.len()));
    let done = |stream: &str, entries: &[StoredEvent]| {
        let end = recording.symbols[stream].diffs.last().unwrap().last;
        entries.last().is_some_and(|e| e.seq == end)
    };
    let Some(run) = run(&server, &streams, done).await else {
        return;
    };
    assert_eq!(server.cuts(), (CUTS * streams.len()) as u64);
    run.check_counters(streams.len());
    let mut later_books = 0;
    for stream in &streams {
        later_books += check_binance(stream, &recording.symbols[stream], &run.entries[stream]);
    }
    // A reconnect faster than the next diff needs no book, so not every cut
    // brings one; most do, and none brings two.
    assert!(
        later_books > 0 && later_books <= CUTS * streams.len(),
        "{later_books} books after {CUTS} cuts of {} streams",
        streams.len()
    );
    let symbol = &recording.symbols[&streams[0]];
    run.check_cli(
        &streams[0],
        &symbol.book_at(symbol.diffs.last().unwrap().last).unwrap(),
    );
    run.report("binance futures", later_books, &server, started);
}

/// A Kraken snapshot the server made verifies the recorded update after it:
/// the book it holds is the one Kraken computed that update's checksum on.
#[track_caller]
fn check_synthesized(pair: &KrakenPair, due: usize, body: &str) {
    let options = KeeperOptions {
        depth: Some(KRAKEN_DEPTH),
        precision: None,
    };
    let mut keeper = BookKeeper::new(BookFormat::KrakenV1, ChecksumRule::Kraken, options).unwrap();
    assert_eq!(keeper.on_frame(body.as_bytes()), Ok(Verdict::Snapshot));
    let what = format!("{}: the server's book after update {due}", pair.pair);
    assert_same_book(keeper.book(), &pair.book_after(due), &what);
    if let Some((_, update)) = pair.updates.get(due) {
        assert_eq!(
            keeper.on_frame(update.as_bytes()),
            Ok(Verdict::Applied),
            "{}: update {due} after a snapshot made at {due}",
            pair.pair
        );
    }
}

/// Kraken v1 (a snapshot in the stream after every subscribe, updates with
/// checksums, no sequence: the worker numbers frames).
fn check_kraken(
    stream: &str,
    pair: &KrakenPair,
    entries: &[StoredEvent],
    served: &[crate::support::recording::Served],
) -> usize {
    const F: BookFormat = BookFormat::KrakenV1;
    check_shape(stream, entries);
    assert_eq!(
        entries[0].payload, pair.snapshot,
        "{stream}: the recorded snapshot first"
    );
    let mut book = Book::with_depth(KRAKEN_DEPTH);
    // The index of the recorded update that must come next.
    let mut next = 0;
    let mut later_books = 0;
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            // Counted: a connection's first book takes the number after the
            // stream's last, and the frames after it the next ones.
            assert_eq!(entry.seq, entries[i - 1].seq + 1, "{stream}: entry {i}");
        }
        let message = F.read_message(entry.payload.as_bytes()).unwrap().unwrap();
        if entry.snapshot {
            // Where the replay was when the server made it.
            let due = served
                .iter()
                .find(|s| s.body == entry.payload)
                .unwrap_or_else(|| panic!("{stream}: a book the server never sent: {entry:?}"))
                .due;
            assert!(due >= next, "{stream}: a book older than what was written");
            // (2)
            book = Book::rebuild(F, Some(KRAKEN_DEPTH), entry.payload.as_bytes(), [""; 0]).unwrap();
            let what = format!("{stream}: the book after update {due}");
            assert_same_book(&book, &pair.book_after(due), &what);
            if i > 0 {
                // (4)
                check_gap(stream, &entries[i - 1], entry, due > next);
                later_books += 1;
            }
            next = due;
            continue;
        }
        // (3)
        let recorded = pair
            .updates
            .get(next)
            .unwrap_or_else(|| panic!("{stream}: {entry:?} after the recording's last update"));
        assert_eq!(
            entry.payload, recorded.1,
            "{stream}: entry {i} is not recorded update {next}"
        );
        book.apply(&message);
        next += 1;
    }
    // (1)
    assert_eq!(
        next,
        pair.updates.len(),
        "{stream}: the sink ends before the recording"
    );
    let what = format!("{stream}: the book after the run");
    assert_same_book(&book, &pair.book_after(next), &what);
    later_books
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kraken_v1_books_in_the_sink_are_the_recordings_through_three_cuts() {
    let _serial = serial().await;
    let started = Instant::now();
    let recording = Arc::new(Kraken::load());
    // The server's snapshots away from the start, checked before any worker
    // sees one: a sample of positions of every pair (each parsed as the
    // worker does, equal to the book code's, and verifying the next update).
    for pair in recording.pairs.values() {
        for due in (0..=pair.updates.len())
            .step_by(97)
            .chain([pair.updates.len()])
        {
            check_synthesized(pair, due, &pair.snapshot_after(due));
        }
    }
    let server = RecordingServer::kraken(recording.clone(), REPLAY).await;
    // Stream ids are the pairs as Kraken spells them (`XMR/USD`); the
    // busiest first (the one `leasehold book` reads).
    let mut streams: Vec<String> = recording.pairs.keys().cloned().collect();
    streams.sort_by_key(|s| std::cmp::Reverse(recording.pairs[s].updates.len()));
    let done = |stream: &str, entries: &[StoredEvent]| {
        let pair = &recording.pairs[stream];
        let Some(last) = entries.last() else {
            return false;
        };
        match last.snapshot {
            // A pair whose last update came before a cut ends with a book.
            true => server
                .served(stream)
                .iter()
                .any(|s| s.body == last.payload && s.due == pair.updates.len()),
            false => pair.updates.last().is_some_and(|(_, u)| *u == last.payload),
        }
    };
    let Some(run) = run(&server, &streams, done).await else {
        return;
    };
    assert_eq!(server.cuts(), (CUTS * streams.len()) as u64);
    run.check_counters(streams.len());
    let mut later_books = 0;
    for stream in &streams {
        let pair = &recording.pairs[stream];
        let served = server.served(stream);
        for snapshot in &served {
            check_synthesized(pair, snapshot.due, &snapshot.body);
        }
        later_books += check_kraken(stream, pair, &run.entries[stream], &served);
        // (5) no book came for a checksum.
        assert!(
            run.entries[stream]
                .iter()
                .all(|e| e.gap.is_none_or(|g| g.reason != GapReason::Checksum)),
            "{stream}: a checksum failed"
        );
    }
    // A pair with nothing due between a cut and its resubscribe still gets
    // a book (a subscribe always brings one): one per cut and stream.
    assert_eq!(later_books, CUTS * streams.len(), "books after the cuts");
    let pair = &recording.pairs[&streams[0]];
    run.check_cli(&streams[0], &pair.book_after(pair.updates.len()));
    run.report("kraken v1", later_books, &server, started);
}
