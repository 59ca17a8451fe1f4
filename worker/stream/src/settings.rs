//! The stream worker's variables, read once with every problem reported at once.

use std::time::Duration;

use leasehold_control::settings::{LeaseSettings, lease_settings};
use leasehold_platform::settings::{
    ConfigError, Documented, Env, Fallback, Lookup, Parser, Setting, parse,
};
use leasehold_telemetry::transport::ShipperConfig;

use crate::book::{ChecksumRule, KeeperOptions, Precision};
use crate::numbering::{SeqScope, SeqSource};
use crate::runner::BookCheck;
use crate::runner::RunnerConfig;
use crate::sequence::{JumpBound, ResumeMode, SeqStep};
use crate::upstream::config::NO_POINTER;
use crate::upstream::history::{HistoryConfig, SnapshotEndpoint};
use crate::upstream::{DataMatch, FEED_SUBSCRIBE_TEMPLATE, SeqRange, WebSocketUpstreamConfig};
use crate::worker::{DiscoveryMode, StreamWorkerConfig};
use leasehold_sink::SinkOptions;

/// The `UPSTREAM_URL` variable.
pub const UPSTREAM_URL: Setting<String> = Setting::new(
    "UPSTREAM_URL",
    parse::TEXT,
    Fallback::Unset,
    "upstream WebSocket URL, `ws://` or `wss://` (required); `{stream_id}` is substituted if \
     present; logs and errors show it with its userinfo and query redacted",
);
/// The `UPSTREAM_SUBSCRIBE` variable.
pub const UPSTREAM_SUBSCRIBE: Setting<String> = Setting::new(
    "UPSTREAM_SUBSCRIBE",
    parse::TEXT,
    Fallback::Value(|| FEED_SUBSCRIBE_TEMPLATE.to_owned()),
    "text sent after connecting, with `{stream_id}` and `{from_seq}` substituted; empty sends \
     nothing",
)
.with_empty_as_a_value();
/// The `UPSTREAM_SEQ_POINTER` variable.
pub const UPSTREAM_SEQ_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_SEQ_POINTER",
    parse::TEXT,
    Fallback::Value(|| "/seq".to_owned()),
    "JSON pointer to the event's sequence number; `none`: frames carry no sequence and the \
     worker numbers them (Kraken v2 `book`, Kraken v1): each connection's first in-band \
     snapshot takes the number after the highest the stream has used, and every later frame \
     of the connection the next. Needs `UPSTREAM_RESUME=snapshot` with \
     `UPSTREAM_SNAPSHOT_MATCH` \
     ([upstreams.md](upstreams.md#books-without-a-stream-sequence)). *`none` is an addition \
     of the fourth wave.*",
);
/// The `UPSTREAM_SEQ_SCOPE` variable.
pub const UPSTREAM_SEQ_SCOPE: Setting<SeqScope> = Setting::new(
    "UPSTREAM_SEQ_SCOPE",
    SEQ_SCOPE_PARSER,
    Fallback::Value(|| SeqScope::Stream),
    "`stream`: the sequence at `UPSTREAM_SEQ_POINTER` is the stream's on every connection; \
     `connection`: it starts over on every connection (Coinbase Advanced Trade \
     `sequence_num`), so each connection's first in-band snapshot continues the stream's \
     numbers and holes inside a connection stay holes. `connection` needs \
     `UPSTREAM_RESUME=snapshot` with `UPSTREAM_SNAPSHOT_MATCH` and one stream per connection. \
     *Addition of the fourth wave.*",
);
/// The `UPSTREAM_SEQ_FIRST_POINTER` variable.
pub const UPSTREAM_SEQ_FIRST_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_SEQ_FIRST_POINTER",
    parse::TEXT,
    Fallback::Unset,
    "JSON pointer to the first sequence a frame covers (an order book's diff: Binance spot \
     `/U`, with `UPSTREAM_SEQ_POINTER=/u`): the frame covers first..=seq and continues the \
     stream when first ≤ last + 1 (the first diff after a snapshot reaches back over it); \
     first > last + 1 is a gap of last + 1..=first − 1, whatever `UPSTREAM_SEQ_STEP` says \
     (update ids inside a diff skip, the diffs do not). Not with `UPSTREAM_SEQ_PREV_POINTER` \
     ([upstreams.md](upstreams.md#frames-that-cover-a-range)). *Addition of the fourth wave.*",
);
/// The `UPSTREAM_SEQ_PREV_POINTER` variable.
pub const UPSTREAM_SEQ_PREV_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_SEQ_PREV_POINTER",
    parse::TEXT,
    Fallback::Unset,
    "JSON pointer to the upstream's own statement of the previous frame's last sequence \
     (Binance USD-M futures `/pu`): the frame covers prev + 1..=seq, so it continues the \
     stream when prev = last (prev < last: it reaches back over what was written) and prev > \
     last is a gap of last + 1..=prev. Not with `UPSTREAM_SEQ_FIRST_POINTER`. *Addition of \
     the fourth wave.*",
);
/// The `UPSTREAM_ID_POINTER` variable.
pub const UPSTREAM_ID_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_ID_POINTER",
    parse::TEXT,
    Fallback::Value(|| "/event_id".to_owned()),
    "JSON pointer to the event id (string or number), the sink's de-duplication key; `none`: \
     the sequence is the id (a book whose frames have no id). *`none` is an addition of the \
     fourth wave.*",
);
/// The `UPSTREAM_MAX_FRAME_BYTES` variable.
pub const UPSTREAM_MAX_FRAME_BYTES: Setting<usize> = Setting::new(
    "UPSTREAM_MAX_FRAME_BYTES",
    parse::SIZE,
    Fallback::Value(|| 1 << 20),
    "larger frames are counted and skipped",
);
/// The `UPSTREAM_TS_POINTER` variable.
pub const UPSTREAM_TS_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_TS_POINTER",
    parse::TEXT,
    Fallback::Unset,
    "JSON pointer to the event's own time in unix ms (the feed simulator: `/ts_ms`); when \
     set, `leasehold_stream_event_lag_seconds` reports now minus that time",
);
/// The `UPSTREAM_IDLE_TIMEOUT_MS` variable.
pub const UPSTREAM_IDLE_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "UPSTREAM_IDLE_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(15_000)),
    "the worker sends a WebSocket ping every third of this and reconnects (reason `idle`) \
     when nothing, data or pong, arrives for this long: a half-open connection or a frozen \
     upstream; `leasehold_stream_last_event_age_seconds` shows the silence meanwhile",
);
/// `replay`, `backfill` or `live`.
const RESUME_PARSER: Parser<ResumeMode> = Parser {
    parse: |raw| {
        ResumeMode::parse(raw).ok_or_else(|| "must be replay, backfill, live or snapshot".into())
    },
    show: |mode| mode.as_str().to_owned(),
};
/// `none`, `kraken` or `okx`.
const CHECKSUM_PARSER: Parser<ChecksumRule> = Parser {
    parse: |raw| ChecksumRule::parse(raw).ok_or_else(|| "must be none, kraken or okx".into()),
    show: |rule| rule.as_str().to_owned(),
};
/// `price_decimals,qty_decimals`.
const PRECISION_PARSER: Parser<Precision> = Parser {
    parse: |raw| {
        let (price, qty) = raw
            .split_once(',')
            .ok_or_else(|| "must be price_decimals,qty_decimals (e.g. 1,8)".to_owned())?;
        let decimals = |text: &str| {
            text.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= 18)
                .ok_or_else(|| "must be price_decimals,qty_decimals, each 0 to 18".to_owned())
        };
        Ok(Precision {
            price_decimals: decimals(price)?,
            qty_decimals: decimals(qty)?,
        })
    },
    show: |p| format!("{},{}", p.price_decimals, p.qty_decimals),
};
/// `contiguous` or `increasing`.
const SEQ_STEP_PARSER: Parser<SeqStep> = Parser {
    parse: |raw| SeqStep::parse(raw).ok_or_else(|| "must be contiguous or increasing".into()),
    show: |step| step.as_str().to_owned(),
};
/// `stream` or `connection`.
const SEQ_SCOPE_PARSER: Parser<SeqScope> = Parser {
    parse: |raw| SeqScope::parse(raw).ok_or_else(|| "must be stream or connection".into()),
    show: |scope| scope.as_str().to_owned(),
};
/// `/pointer=value[,/pointer=value…]`.
const DATA_MATCH_PARSER: Parser<Vec<DataMatch>> = Parser {
    parse: DataMatch::parse_list,
    show: |list| {
        list.iter()
            .map(DataMatch::to_string)
            .collect::<Vec<_>>()
            .join(",")
    },
};

/// The `UPSTREAM_RESUME` variable.
pub const UPSTREAM_RESUME: Setting<ResumeMode> = Setting::new(
    "UPSTREAM_RESUME",
    RESUME_PARSER,
    Fallback::Value(|| ResumeMode::Replay),
    "what a missed range becomes ([upstreams.md](upstreams.md)): `replay` — the upstream \
     resumes from any sequence, so a hole is asked for again by reconnecting from the last \
     confirmed sequence (our feed simulator); `backfill` — the upstream starts live, the \
     missed range is read from `UPSTREAM_BACKFILL_URL` while live events are held (at most \
     100,000; reading pauses beyond), then the held events follow in order; `live` — the \
     upstream starts live and cannot replay: the range is recorded as a gap marker in the \
     sink and the stream goes on. `snapshot` — an order book \
     ([upstreams.md](upstreams.md#order-books)): a stream with nothing to continue, a hole, a \
     reset or a checksum failure re-synchronises from a snapshot (`UPSTREAM_SNAPSHOT_URL`) \
     while the diffs are held; the snapshot entry is written, then the held diffs after it. \
     *`snapshot` is an addition of the fourth wave.* In `live` and `backfill` a stream never \
     written (no checkpoint, empty sink) starts at the live position",
);
/// The `UPSTREAM_SEQ_STEP` variable.
pub const UPSTREAM_SEQ_STEP: Setting<SeqStep> = Setting::new(
    "UPSTREAM_SEQ_STEP",
    SEQ_STEP_PARSER,
    Fallback::Value(|| SeqStep::Contiguous),
    "`contiguous`: every sequence is used, a skipped one is missing data; `increasing`: holes \
     are normal (a sequence shared by several channels, sparse ids), only a sequence at or \
     below the last one is a replay, and no hole is ever a gap (in `backfill` the only range \
     fetched is the one between the last event and a new connection's first)",
);
/// The `UPSTREAM_MAX_JUMP` variable.
pub const UPSTREAM_MAX_JUMP: Setting<u64> = Setting::new(
    "UPSTREAM_MAX_JUMP",
    parse::COUNT,
    Fallback::Value(|| crate::runner::JUMP_BOUND.max),
    "a frame more than this ahead of the stream's last sequence is not taken at its word: it \
     waits for the next frames. A frame back near the stream discards it \
     (`leasehold_upstream_frames_skipped_total{reason=\"jump\"}`, a warning in the log): one \
     status frame whose timestamp sits at the sequence pointer no longer moves the stream \
     past everything real. `UPSTREAM_RESET_AFTER` frames in a row beyond the bound, each \
     within it of the one before, make the jump real: they are written in order, after a gap \
     marker where the mode writes one. `0`: unbounded (set it for sequences that are \
     nanosecond timestamps). A stream's very first frame is taken at its word",
);
/// The `UPSTREAM_RESET_AFTER` variable.
pub const UPSTREAM_RESET_AFTER: Setting<u64> = Setting::new(
    "UPSTREAM_RESET_AFTER",
    parse::POSITIVE,
    Fallback::Value(|| u64::from(crate::runner::JUMP_BOUND.confirm_after)),
    "frames in a row that make a sequence reset: each below the stream's last sequence and \
     above the one before (the upstream started over, e.g. an exchange restart). The frames \
     of such a run wait; once it is long enough a reset entry starts a new epoch in the sink \
     (the lease's token is lifted, [redis.md](redis.md)) and they are written after it \
     (`leasehold_stream_resets_total`, alert `LeaseholdStreamSequenceReset`); a run that \
     stops climbing or climbs back past the stream was replays (`reason=\"duplicate\"`). Also \
     the frames in a row that confirm a jump past `UPSTREAM_MAX_JUMP`",
);
/// The `STREAM_HOLD_MAX_BYTES` variable.
pub const STREAM_HOLD_MAX_BYTES: Setting<usize> = Setting::new(
    "STREAM_HOLD_MAX_BYTES",
    parse::SIZE,
    Fallback::Value(|| crate::runner::HOLD_MAX_BYTES),
    "bytes of live frames a stream holds at most while a backfill fills the range before them \
     (as well as 100,000 frames); at the bound reading that stream's upstream pauses until \
     the backfill catches up: one order-book snapshot can weigh as much as ten thousand \
     trades, so a count alone is no bound. A worker backfilling 100 streams at once holds 1.6 \
     GiB at most with the default. Each pause is observed in \
     `leasehold_stream_backfill_wait_seconds{reason=\"hold\"}`",
);
/// The `BACKFILL_CONCURRENCY` variable.
pub const BACKFILL_CONCURRENCY: Setting<usize> = Setting::new(
    "BACKFILL_CONCURRENCY",
    parse::SIZE,
    Fallback::Value(|| crate::upstream::history::BACKFILL_CONCURRENCY),
    "history requests in flight at most per worker, over all its streams (`backfill`): a \
     worker that takes over many streams backfills them a few at a time instead of firing \
     every request at the exchange's rate limit. A `Retry-After` up to 15 minutes is waited \
     in full; a longer one (Binance's `418` ban) gives the range up at once, recorded as a \
     gap, because asking before the server's time only extends a ban. Waits for a slot and \
     for a `Retry-After` are observed in `leasehold_stream_backfill_wait_seconds` (`reason` = \
     `concurrency`, `retry_after`)",
);
/// The `UPSTREAM_DATA_MATCH` variable.
pub const UPSTREAM_DATA_MATCH: Setting<Vec<DataMatch>> = Setting::new(
    "UPSTREAM_DATA_MATCH",
    DATA_MATCH_PARSER,
    Fallback::Unset,
    "`/pointer=value[,/pointer=value…]` (split at each alternative's first `=`): a frame is \
     data when the value at one pointer is that text (numbers, booleans and null as JSON \
     writes them), or, for a bare `/pointer` without `=value`, when the pointer leads to \
     anything (*a bare pointer is an addition of the fourth wave*); any other frame is a \
     control frame (subscription acknowledgement, heartbeat, status, ping reply): counted as \
     `leasehold_upstream_frames_skipped_total{reason=\"control\"}`, never warned about, never \
     written. A frame that matches but lacks the sequence is `missing_field`; an error frame \
     (`{\"error\": …}`) still ends the connection. At most 5 distinct pointers",
);
/// The `UPSTREAM_SNAPSHOT_MATCH` variable.
pub const UPSTREAM_SNAPSHOT_MATCH: Setting<Vec<DataMatch>> = Setting::new(
    "UPSTREAM_SNAPSHOT_MATCH",
    DATA_MATCH_PARSER,
    Fallback::Unset,
    "`/pointer=value` or a bare `/pointer` (one): with `UPSTREAM_RESUME=snapshot`, a data \
     frame for which it holds is the book's snapshot, sent in the stream after a subscribe \
     (Bybit v5 `/type=snapshot`, OKX `/action=snapshot`, Kraken v2 `/type=snapshot`, Coinbase \
     `/events/0/type=snapshot`, Kraken v1 `/1/as`); it must also pass `UPSTREAM_DATA_MATCH` \
     if that is set. Instead of `UPSTREAM_SNAPSHOT_URL` (one of the two is required in \
     `snapshot` mode, not both). *Addition of the fourth wave.*",
);
/// The `UPSTREAM_STREAMS_PER_CONNECTION` variable.
pub const UPSTREAM_STREAMS_PER_CONNECTION: Setting<usize> = Setting::new(
    "UPSTREAM_STREAMS_PER_CONNECTION",
    parse::SIZE,
    Fallback::Value(|| 1),
    "held streams one upstream connection carries (1: a connection per stream, as before). \
     Above 1 the worker fills a connection before it opens another and subscribes and \
     unsubscribes as leases come and go; each stream keeps its own machine, and a cut is each \
     stream's own hole. For live upstreams only (`live`, `backfill`, `snapshot`: refused with \
     `replay`); requires `UPSTREAM_ROUTE_POINTER`. A stream whose machine stops reading \
     (4,096 frames queued) is dropped from the connection, and its resume mode covers the \
     hole, rather than stall the others ([upstreams.md](upstreams.md#shared-connections)). \
     *Fourth wave.*",
);
/// The `UPSTREAM_ROUTE_POINTER` variable.
pub const UPSTREAM_ROUTE_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_ROUTE_POINTER",
    parse::TEXT,
    Fallback::Unset,
    "JSON pointer to the field that names a frame's stream on a shared connection (Binance \
     combined `/stream`, Bybit `/topic`, Coinbase `/product_id`, Kraken v2 `/data/0/symbol`); \
     a frame for no held stream is counted (`reason=\"control\"`) and dropped. *Fourth wave.*",
);
/// The `UPSTREAM_ROUTE_TEMPLATE` variable.
pub const UPSTREAM_ROUTE_TEMPLATE: Setting<String> = Setting::new(
    "UPSTREAM_ROUTE_TEMPLATE",
    parse::TEXT,
    Fallback::Value(|| "{stream_id}".to_owned()),
    "a stream's name in that field and in `{stream_ids_json}`: `{stream_id}`, \
     `{stream_id_upper}` (`{stream_id}@depth@100ms`, `orderbook.50.{stream_id_upper}`). \
     *Fourth wave.*",
);
/// The `UPSTREAM_SUBSCRIBE_BATCH` variable.
pub const UPSTREAM_SUBSCRIBE_BATCH: Setting<usize> = Setting::new(
    "UPSTREAM_SUBSCRIBE_BATCH",
    parse::SIZE,
    Fallback::Value(|| 1),
    "streams named in one subscribe or unsubscribe message on a shared connection, where the \
     template has `{stream_ids_json}` (the JSON array of rendered route names; Bybit takes \
     10, Binance a list); a template with only `{stream_id}` is sent once per stream. \
     `{request_id}` numbers each message (our addition, for the exchange's acknowledgement). \
     An error frame that names a stream ends that stream's subscription only. *Fourth wave.*",
);
/// The `UPSTREAM_SUBSCRIBES_PER_SECOND` variable.
pub const UPSTREAM_SUBSCRIBES_PER_SECOND: Setting<usize> = Setting::new(
    "UPSTREAM_SUBSCRIBES_PER_SECOND",
    parse::SIZE,
    Fallback::Value(|| 0),
    "subscribe and unsubscribe messages one shared connection sends in any rolling second at \
     most (0: no limit). Binance closes a connection past 5 incoming messages a second, pings \
     and pongs included: set 3 (the worker's own ping and its pong to Binance's ping can fall \
     in the same second as the subscribes; with 4, a simulated cold start of 100 workers had \
     18 of them cut, BENCHMARKS.md \"Connect limits\"). *Fourth wave.*",
);
/// The `UPSTREAM_MAX_CONNECTION_AGE_MS` variable.
pub const UPSTREAM_MAX_CONNECTION_AGE_MS: Setting<Duration> = Setting::new(
    "UPSTREAM_MAX_CONNECTION_AGE_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::ZERO),
    "0: never; otherwise a connection is replaced before this age (up to a tenth earlier, \
     spread by stream, so streams connected together do not reconnect together): a new \
     connection subscribes the stream (within `UPSTREAM_CONNECTS_PER_MINUTE`) and both run \
     until the new one continues what the old one handed on (it repeats a sequence the old \
     one delivered, or the old one catches up with its first); then the old one closes. No \
     gap, no duplicate. If they have not met within 10 s, or the old one ends first, the new \
     one takes over as it is and the resume mode judges any hole. On a shared connection \
     every stream moves this way, each when the new connection meets it. Needs a sequence \
     that is the stream's on every connection (not with `UPSTREAM_SEQ_POINTER=none` or \
     `UPSTREAM_SEQ_SCOPE=connection`) ([upstreams.md](upstreams.md#planned-reconnects)). \
     Binance cuts at 24 h: set 23 h.",
);
/// The `UPSTREAM_BOOK_CHECKSUM` variable.
pub const UPSTREAM_BOOK_CHECKSUM: Setting<ChecksumRule> = Setting::new(
    "UPSTREAM_BOOK_CHECKSUM",
    CHECKSUM_PARSER,
    Fallback::Value(|| ChecksumRule::None),
    "`none`, `kraken` or `okx` (`UPSTREAM_RESUME=snapshot` only): the worker keeps the book \
     as exact decimal strings and checks every update's CRC32 as the exchange documents it \
     (Kraken: top 10 asks then bids, `.` and leading zeros removed; OKX: top 25 interleaved, \
     signed). The format is read from the first snapshot (Kraken v1 or v2). A mismatch, or a \
     book message it cannot read, counts in `leasehold_stream_checksum_failures_total` and \
     re-synchronises the book (the failed update is stored as received; the new snapshot \
     entry carries `reason=checksum` from the update after it). *Addition of the fourth \
     wave.*",
);
/// The `UPSTREAM_BOOK_DEPTH` variable.
pub const UPSTREAM_BOOK_DEPTH: Setting<usize> = Setting::new(
    "UPSTREAM_BOOK_DEPTH",
    parse::SIZE,
    Fallback::Value(|| 0),
    "levels a side of the subscribed book, for `UPSTREAM_BOOK_CHECKSUM` (0: every level). \
     Kraken stops sending removals for levels pushed past the subscribed depth, so set it to \
     that depth. *Our addition.*",
);
/// The `UPSTREAM_BOOK_PRECISION` variable.
pub const UPSTREAM_BOOK_PRECISION: Setting<Precision> = Setting::new(
    "UPSTREAM_BOOK_PRECISION",
    PRECISION_PARSER,
    Fallback::Unset,
    "`price_decimals,qty_decimals` of the pair (Kraken's `price_precision`, `qty_precision`); \
     required for `kraken` checksums on Kraken v2, whose numbers lose the trailing zeros its \
     checksum counts. *Our addition.*",
);
/// The `UPSTREAM_UNSUBSCRIBE` variable.
pub const UPSTREAM_UNSUBSCRIBE: Setting<String> = Setting::new(
    "UPSTREAM_UNSUBSCRIBE",
    parse::TEXT,
    Fallback::Unset,
    "text that ends a stream's subscription on its connection, with `UPSTREAM_SUBSCRIBE`'s \
     placeholders (Bybit `{\"op\":\"unsubscribe\",\"args\":[\"orderbook.50.{stream_id}\"]}`). \
     With `UPSTREAM_SNAPSHOT_MATCH`, a new in-band snapshot is asked for by sending it, then \
     the subscribe, on the same connection; without it, by reconnecting. *Addition of the \
     fourth wave (§10.3 names it for shared connections, not built yet).*",
);
/// The `UPSTREAM_PING_TEXT` variable.
pub const UPSTREAM_PING_TEXT: Setting<String> = Setting::new(
    "UPSTREAM_PING_TEXT",
    parse::TEXT,
    Fallback::Unset,
    "an application-level ping sent as a text frame every `UPSTREAM_PING_INTERVAL_MS` (for \
     upstreams that drop clients who do not, e.g. `{\"op\":\"ping\"}`); its replies are \
     control frames (a reply that is not JSON, such as `pong`, counts as control while this \
     is set). WebSocket pings and `UPSTREAM_IDLE_TIMEOUT_MS` work as before",
);
/// The `UPSTREAM_PING_INTERVAL_MS` variable.
pub const UPSTREAM_PING_INTERVAL_MS: Setting<Duration> = Setting::new(
    "UPSTREAM_PING_INTERVAL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(10_000)),
    "how often `UPSTREAM_PING_TEXT` is sent",
);
/// The `UPSTREAM_CONNECTS_PER_MINUTE` variable.
pub const UPSTREAM_CONNECTS_PER_MINUTE: Setting<usize> = Setting::new(
    "UPSTREAM_CONNECTS_PER_MINUTE",
    parse::SIZE,
    Fallback::Value(|| 0),
    "upstream connections this worker opens at most in any rolling minute, over all its \
     streams (0: no limit). Exchanges limit new connections per address (Binance: 300 per 5 \
     minutes per IP) and refuse every connection for minutes past it; set it to the \
     exchange's limit per minute divided by the workers behind one address (Binance, 4 \
     workers behind one NAT address: 15). A connect past it waits for the oldest of the \
     minute's connects to leave the window (in the order asked), counted in \
     `leasehold_upstream_connects_throttled_total`. A rolling window, like the exchanges' \
     own: a token bucket with a burst could pass their limit. Until connections are shared \
     (§10.3, not built), each stream's (re)connect is one connection. *Addition of the fourth \
     wave.*",
);
/// The `UPSTREAM_BACKFILL_URL` variable.
pub const UPSTREAM_BACKFILL_URL: Setting<String> = Setting::secret(
    "UPSTREAM_BACKFILL_URL",
    parse::TEXT,
    Fallback::Unset,
    "history endpoint for `UPSTREAM_RESUME=backfill` (required there, refused otherwise): \
     `http://` or `https://` with `{stream_id}`, `{stream_id_upper}` (upper-cased, as REST \
     APIs spell symbols), `{from_seq}` (required) and `{to_seq}`, read page by page until the \
     range is closed; items past `{to_seq}` are dropped. Each request has a 10 s timeout; 5xx \
     and connection errors are retried with jittered backoff, 429 and 418 after their \
     `Retry-After`, 8 failed requests a page (about 30 s) before the rest of the range is \
     recorded as a gap (`backfill_exhausted`); other 4xx give up at once. It may carry an API \
     key: never printed, logged with its query redacted",
);
/// The `UPSTREAM_SNAPSHOT_URL` variable.
pub const UPSTREAM_SNAPSHOT_URL: Setting<String> = Setting::secret(
    "UPSTREAM_SNAPSHOT_URL",
    parse::TEXT,
    Fallback::Unset,
    "an order book's REST snapshot for `UPSTREAM_RESUME=snapshot` (required there, refused \
     otherwise): `http://` or `https://` with `{stream_id}` and `{stream_id_upper}` (Binance \
     spot `https://api.binance.com/api/v3/depth?symbol={stream_id_upper}&limit=1000`). Read \
     under `BACKFILL_CONCURRENCY` with the backfill's timeout and retries; a snapshot that \
     cannot be read or is older than the held diffs is fetched again after the reconnect \
     backoff, for as long as the stream is held (a book has nothing valid to write without \
     one). It may carry an API key: never printed, logged with its query redacted. *Addition \
     of the fourth wave.*",
);
/// The `UPSTREAM_SNAPSHOT_SEQ_POINTER` variable.
pub const UPSTREAM_SNAPSHOT_SEQ_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_SNAPSHOT_SEQ_POINTER",
    parse::TEXT,
    Fallback::Value(|| "/lastUpdateId".to_owned()),
    "JSON pointer to a REST snapshot's sequence: the last update the book contains. Held \
     diffs whose last sequence is at or below it are dropped; the first one after it must \
     cover it + 1 (`UPSTREAM_SEQ_FIRST_POINTER`: first ≤ it + 1; `UPSTREAM_SEQ_PREV_POINTER`: \
     prev ≤ it), else the snapshot is too old and another is fetched. *Addition of the fourth \
     wave.*",
);
/// The `UPSTREAM_BACKFILL_ITEMS_POINTER` variable.
pub const UPSTREAM_BACKFILL_ITEMS_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_BACKFILL_ITEMS_POINTER",
    parse::TEXT,
    Fallback::Value(String::new),
    "JSON pointer to the array of items in a history response (empty: the body is the array)",
);
/// The `UPSTREAM_BACKFILL_SEQ_POINTER` variable.
pub const UPSTREAM_BACKFILL_SEQ_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_BACKFILL_SEQ_POINTER",
    parse::TEXT,
    Fallback::Derived("UPSTREAM_SEQ_POINTER's value"),
    "JSON pointer, inside a history item, to its sequence (history APIs name fields \
     differently from their streams)",
);
/// The `UPSTREAM_BACKFILL_ID_POINTER` variable.
pub const UPSTREAM_BACKFILL_ID_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_BACKFILL_ID_POINTER",
    parse::TEXT,
    Fallback::Derived("UPSTREAM_ID_POINTER's value"),
    "JSON pointer, inside a history item, to its id",
);
/// The `UPSTREAM_BACKFILL_TS_POINTER` variable.
pub const UPSTREAM_BACKFILL_TS_POINTER: Setting<String> = Setting::new(
    "UPSTREAM_BACKFILL_TS_POINTER",
    parse::TEXT,
    Fallback::Derived("UPSTREAM_TS_POINTER's value"),
    "JSON pointer, inside a history item, to its time in unix ms",
);
/// The `SINK_URL` variable.
pub const SINK_URL: Setting<String> = Setting::secret(
    "SINK_URL",
    leasehold_sink::url::SINK_URL_PARSER,
    Fallback::Unset,
    "`redis://…`, `rediss://…`, `redis+unix://…` (Redis Streams sink on one primary), \
     `redis+cluster://[user:password@]host:port[,host:port…]` or `rediss+cluster://…` (Redis \
     Cluster, ElastiCache cluster mode or Serverless; the seed nodes) or `memory:` \
     (in-process); required; may hold a password: never printed",
);
/// The `SINK_MAX_LEN` variable.
pub const SINK_MAX_LEN: Setting<u64> = Setting::new(
    "SINK_MAX_LEN",
    parse::COUNT,
    Fallback::Value(|| leasehold_sink::DEFAULT_MAX_LEN),
    "approximate cap on events kept per sink stream (`XADD MAXLEN ~`). Size it as events per \
     second × the seconds a reader may fall behind: the default is about 2.8 h of a 10 \
     events/s stream and about 40 MB of Redis per stream at 300-byte frames (memory ≈ events \
     × (frame bytes + ~100)). 0 keeps everything until Redis, which must run `noeviction`, \
     refuses writes; the worker warns at start",
);
/// The `SINK_MAX_FAILURES` variable.
pub const SINK_MAX_FAILURES: Setting<u32> = Setting::new(
    "SINK_MAX_FAILURES",
    parse::ATTEMPTS,
    Fallback::Value(|| 10),
    "consecutive sink refusals (a wrong key type, a script or auth error) after which the \
     worker releases the stream for another worker to try, counted in \
     `leasehold_sink_give_ups_total`; an unreachable sink is retried with backoff while the \
     lease holds",
);
/// The `STREAM_IDS` variable.
pub const STREAM_IDS: Setting<Vec<String>> = Setting::new(
    "STREAM_IDS",
    parse::LIST,
    Fallback::Unset,
    "comma-separated streams the worker registers at start (idempotent); others come from \
     `leases add`",
);
/// The `MAX_STREAMS` variable.
pub const MAX_STREAMS: Setting<usize> = Setting::new(
    "MAX_STREAMS",
    parse::SIZE,
    Fallback::Value(|| 100),
    "most streams one worker holds, whatever its fair share",
);
/// The `DISCOVERY_INTERVAL_MS` variable.
pub const DISCOVERY_INTERVAL_MS: Setting<Duration> = Setting::new(
    "DISCOVERY_INTERVAL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(5_000)),
    "how often the worker scans the lease table (±20 % jitter); with \
     `DISCOVERY_MODE=assigned`, how often the assigner scans and every worker queries its own \
     streams",
);
/// `scan` or `assigned`.
const DISCOVERY_MODE_PARSER: Parser<DiscoveryMode> = Parser {
    parse: |raw| DiscoveryMode::parse(raw).ok_or_else(|| "must be scan or assigned".into()),
    show: |mode| mode.as_str().to_owned(),
};
/// The `DISCOVERY_MODE` variable.
pub const DISCOVERY_MODE: Setting<DiscoveryMode> = Setting::new(
    "DISCOVERY_MODE",
    DISCOVERY_MODE_PARSER,
    Fallback::Value(|| DiscoveryMode::Scan),
    "`scan`: every worker scans the lease table and balances by itself. `assigned`: one \
     elected worker (the `leasehold#assigner` lease) scans, eventually consistent, and writes \
     each stream's `assignee`; the others `Query` the `assignee-index` for their own streams, \
     so reads do not grow with streams × workers \
     ([lease-table.md](lease-table.md#assigned-discovery-discovery_modeassigned)). Needs the \
     index (`leasehold table create` adds it) and `dynamodb:Query` on it. *Addition of the \
     third wave.*",
);
/// The `HANDOFF_POLL_MS` variable.
pub const HANDOFF_POLL_MS: Setting<Duration> = Setting::new(
    "HANDOFF_POLL_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(250)),
    "how often the hand-off doorbell is read (one `GetItem`)",
);
/// The `HANDOFF_LISTEN` variable.
pub const HANDOFF_LISTEN: Setting<std::net::SocketAddr> = Setting::new(
    "HANDOFF_LISTEN",
    parse::SOCKET_ADDR,
    Fallback::Unset,
    "UDP `IP:PORT` (port 0 picks one) for pushed hand-offs: a draining peer sends each \
     released stream to the least-loaded worker, which takes it at once \
     ([lease-table.md](lease-table.md#pushed-hand-offs-handoff_addr)); announced as \
     `handoff_addr`, an unspecified IP as the ECS task's address (else 127.0.0.1). Unset: \
     hand-offs wait for the doorbell and a scan",
);
/// The `HANDOFF_PREPARE_TIMEOUT_MS` variable.
pub const HANDOFF_PREPARE_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "HANDOFF_PREPARE_TIMEOUT_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::from_millis(5_000)),
    "with `HANDOFF_LISTEN`, every graceful hand-off (a drain's, a balancing hand-back) \
     overlaps: the successor subscribes the stream first (a `leasehold-prepare` datagram) and \
     answers with the first sequence it holds (`leasehold-ready`); the draining worker writes \
     until the sink confirmed everything before that sequence, then releases and pushes the \
     stream; the successor's runner starts on the subscription it made, so a `live` stream \
     loses nothing. This is the wait for the answer, and then for the writing, at most; after \
     it the stream is released as it is. 0: no overlap. Not for streams the worker numbers \
     itself ([upstreams.md](upstreams.md#overlapping-hand-offs)). In scan discovery a peer \
     that scans first can still take the stream instead of the prepared successor.",
);
/// The `DRAIN_TIMEOUT_MS` variable.
pub const DRAIN_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "DRAIN_TIMEOUT_MS",
    parse::POSITIVE_MILLIS,
    Fallback::Value(|| Duration::from_millis(20_000)),
    "on SIGTERM, time to finish in-flight batches before leases are released anyway; keep it \
     below the task's `stopTimeout` (the original specification's example task definition \
     uses 60 s)",
);
/// The `BATCH_MAX_EVENTS` variable.
pub const BATCH_MAX_EVENTS: Setting<usize> = Setting::new(
    "BATCH_MAX_EVENTS",
    parse::SIZE,
    Fallback::Value(|| crate::runner::BATCH_MAX_EVENTS),
    "most events per sink write; a batch fills only while the stream's previous one is on its \
     way (one in flight per stream), so a quiet stream's batches stay small",
);
/// The `BATCH_MAX_DELAY_MS` variable.
pub const BATCH_MAX_DELAY_MS: Setting<Duration> = Setting::new(
    "BATCH_MAX_DELAY_MS",
    parse::MILLIS,
    Fallback::Value(|| Duration::from_millis(20)),
    "accepted for compatibility, no longer used: a batch is written as soon as the stream's \
     previous one landed (one batch in flight per stream, [redis.md](redis.md)) and holds \
     whatever arrived meanwhile, up to `BATCH_MAX_EVENTS` (see \
     [deviations.md](deviations.md))",
);
/// The `SINK_WAIT_REPLICAS` variable.
pub const SINK_WAIT_REPLICAS: Setting<u64> = Setting::new(
    "SINK_WAIT_REPLICAS",
    parse::COUNT,
    Fallback::Value(|| 0),
    "replicas that must have a batch (`WAIT n`, sent in the batch's round trip) before it is \
     confirmed and the checkpoint may cover it; fewer within `SINK_WAIT_TIMEOUT_MS` and the \
     write counts as failed and is sent again (de-duplicated). 0 confirms on the primary's \
     reply: a failover can then lose a tail, which the re-open finds and refills or marks \
     `sink_lost` ([redis.md](redis.md)). Above 0 the sink spreads its streams over 8 \
     connections, since `WAIT` holds the connection it is sent on: a replica falling behind \
     holds the streams of one connection, not every stream's writes one after another. The \
     shipped ACL allows `WAIT` for the `stream-worker` user",
);
/// The `SINK_WAIT_TIMEOUT_MS` variable.
pub const SINK_WAIT_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "SINK_WAIT_TIMEOUT_MS",
    parse::MILLIS,
    Fallback::Value(|| leasehold_sink::DEFAULT_WAIT_TIMEOUT),
    "how long a batch waits for `SINK_WAIT_REPLICAS` replicas",
);
/// The `SINK_TIMEOUT_MS` variable.
pub const SINK_TIMEOUT_MS: Setting<Duration> = Setting::new(
    "SINK_TIMEOUT_MS",
    parse::MILLIS,
    Fallback::Value(|| leasehold_sink::DEFAULT_REPLY_TIMEOUT),
    "how long a sink write waits for Redis's reply before it counts as failed and is retried \
     (de-duplicated); every stream's batches queue on one Redis, so keep it well above a busy \
     moment's queue (the Redis client's own default, 500 ms, made a loaded worker resend \
     batches that were only queued). *Addition to the contract.*",
);
/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[
    &UPSTREAM_URL,
    &UPSTREAM_SUBSCRIBE,
    &UPSTREAM_SEQ_POINTER,
    &UPSTREAM_SEQ_SCOPE,
    &UPSTREAM_SEQ_FIRST_POINTER,
    &UPSTREAM_SEQ_PREV_POINTER,
    &UPSTREAM_ID_POINTER,
    &UPSTREAM_MAX_FRAME_BYTES,
    &UPSTREAM_IDLE_TIMEOUT_MS,
    &UPSTREAM_TS_POINTER,
    &UPSTREAM_RESUME,
    &UPSTREAM_SEQ_STEP,
    &UPSTREAM_MAX_JUMP,
    &UPSTREAM_RESET_AFTER,
    &UPSTREAM_DATA_MATCH,
    &UPSTREAM_SNAPSHOT_MATCH,
    &UPSTREAM_UNSUBSCRIBE,
    &UPSTREAM_STREAMS_PER_CONNECTION,
    &UPSTREAM_ROUTE_POINTER,
    &UPSTREAM_ROUTE_TEMPLATE,
    &UPSTREAM_SUBSCRIBE_BATCH,
    &UPSTREAM_SUBSCRIBES_PER_SECOND,
    &UPSTREAM_MAX_CONNECTION_AGE_MS,
    &UPSTREAM_BOOK_CHECKSUM,
    &UPSTREAM_BOOK_DEPTH,
    &UPSTREAM_BOOK_PRECISION,
    &UPSTREAM_PING_TEXT,
    &UPSTREAM_PING_INTERVAL_MS,
    &UPSTREAM_CONNECTS_PER_MINUTE,
    &UPSTREAM_BACKFILL_URL,
    &UPSTREAM_BACKFILL_ITEMS_POINTER,
    &UPSTREAM_BACKFILL_SEQ_POINTER,
    &UPSTREAM_BACKFILL_ID_POINTER,
    &UPSTREAM_BACKFILL_TS_POINTER,
    &UPSTREAM_SNAPSHOT_URL,
    &UPSTREAM_SNAPSHOT_SEQ_POINTER,
    &BACKFILL_CONCURRENCY,
    &STREAM_HOLD_MAX_BYTES,
    &SINK_URL,
    &SINK_MAX_LEN,
    &SINK_TIMEOUT_MS,
    &SINK_WAIT_REPLICAS,
    &SINK_WAIT_TIMEOUT_MS,
    &SINK_MAX_FAILURES,
    &STREAM_IDS,
    &MAX_STREAMS,
    &DISCOVERY_INTERVAL_MS,
    &DISCOVERY_MODE,
    &HANDOFF_POLL_MS,
    &HANDOFF_LISTEN,
    &HANDOFF_PREPARE_TIMEOUT_MS,
    &DRAIN_TIMEOUT_MS,
    &BATCH_MAX_EVENTS,
    &BATCH_MAX_DELAY_MS,
];

/// Everything `leasehold stream-worker` needs.
#[derive(Debug, Clone)]
pub struct StreamWorkerSettings {
    /// Lease table and keeper timings.
    pub lease: LeaseSettings,
    /// The upstream adapter.
    pub upstream: WebSocketUpstreamConfig,
    /// The upstream's history (`UPSTREAM_RESUME=backfill`) or its order
    /// book's snapshots (`snapshot`).
    pub history: Option<HistoryConfig>,
    /// `SINK_URL` (may hold a password: never print it).
    pub sink_url: leasehold_platform::settings::Redacted<String>,
    /// Sink sizing.
    pub sink: SinkOptions,
    /// Discovery, balancing, drain.
    pub worker: StreamWorkerConfig,
    /// Batching.
    pub runner: RunnerConfig,
    /// Where and how this worker ships its telemetry.
    pub shipper: ShipperConfig,
    /// `HANDOFF_LISTEN`: bind there and take pushed hand-offs.
    pub handoff_listen: Option<std::net::SocketAddr>,
}

/// The history a `backfill` worker reads; its variables mean nothing otherwise
/// (and a backfill URL without `backfill` is refused: it would be ignored).
fn history_config(
    env: &mut Env,
    upstream: &WebSocketUpstreamConfig,
    resume: ResumeMode,
) -> Option<HistoryConfig> {
    let snapshot_url = env.optional(&UPSTREAM_SNAPSHOT_URL);
    if resume == ResumeMode::Snapshot {
        let Some(url_template) = snapshot_url else {
            if upstream.snapshot_match.is_none() {
                env.problem(
                    UPSTREAM_SNAPSHOT_URL.name,
                    "or UPSTREAM_SNAPSHOT_MATCH is required with UPSTREAM_RESUME=snapshot (where \
                     the book's snapshot comes from)",
                );
            }
            return None;
        };
        if upstream.snapshot_match.is_some() {
            env.problem(
                UPSTREAM_SNAPSHOT_MATCH.name,
                "is set with UPSTREAM_SNAPSHOT_URL: a book's snapshots come from one of them",
            );
        }
        let config = HistoryConfig {
            concurrency: env.get(&BACKFILL_CONCURRENCY),
            snapshot: Some(SnapshotEndpoint {
                url_template,
                seq_pointer: env.get(&UPSTREAM_SNAPSHOT_SEQ_POINTER),
            }),
            ..HistoryConfig::default()
        };
        for problem in config.validate() {
            env.problem("snapshot", problem);
        }
        if env.optional(&UPSTREAM_BACKFILL_URL).is_some() {
            env.problem(
                UPSTREAM_BACKFILL_URL.name,
                "is set but UPSTREAM_RESUME is not backfill (it would be ignored)",
            );
        }
        return Some(config);
    }
    if snapshot_url.is_some() {
        env.problem(
            UPSTREAM_SNAPSHOT_URL.name,
            "is set but UPSTREAM_RESUME is not snapshot (it would be ignored)",
        );
    }
    let url = env.optional(&UPSTREAM_BACKFILL_URL);
    if resume != ResumeMode::Backfill {
        if url.is_some() {
            env.problem(
                UPSTREAM_BACKFILL_URL.name,
                "is set but UPSTREAM_RESUME is not backfill (it would be ignored)",
            );
        }
        return None;
    }
    let Some(url_template) = url else {
        env.problem(
            UPSTREAM_BACKFILL_URL.name,
            "is required with UPSTREAM_RESUME=backfill (where the history is read)",
        );
        return None;
    };
    let config = HistoryConfig {
        url_template,
        items_pointer: env.get(&UPSTREAM_BACKFILL_ITEMS_POINTER),
        seq_pointer: env
            .optional(&UPSTREAM_BACKFILL_SEQ_POINTER)
            .unwrap_or_else(|| upstream.seq_pointer.clone()),
        id_pointer: env
            .optional(&UPSTREAM_BACKFILL_ID_POINTER)
            .unwrap_or_else(|| upstream.id_pointer.clone()),
        ts_pointer: env
            .optional(&UPSTREAM_BACKFILL_TS_POINTER)
            .or_else(|| upstream.ts_pointer.clone()),
        concurrency: env.get(&BACKFILL_CONCURRENCY),
        ..HistoryConfig::default()
    };
    for problem in config.validate() {
        env.problem("backfill", problem);
    }
    Some(config)
}

/// `lookup` with `OWNER_ID` defaulting to the ECS task id (what the console,
/// the dashboard and StopTask name) when unset or empty; `parse` then falls
/// back to the host name without a task.
pub fn owner_from_task<'a>(
    lookup: Lookup<'a>,
    task: Option<&'a leasehold_platform::ecs::TaskMetadata>,
) -> impl Fn(&str) -> Option<String> + 'a {
    move |name: &str| match lookup(name) {
        Some(owner) if name == "OWNER_ID" && owner.is_empty() => task_id(task),
        None if name == "OWNER_ID" => task_id(task),
        other => other,
    }
}

fn task_id(task: Option<&leasehold_platform::ecs::TaskMetadata>) -> Option<String> {
    task.and_then(|metadata| metadata.task_id().map(str::to_owned))
}

impl StreamWorkerSettings {
    /// Sets `sidecar_url` as the telemetry settings derive it: the explicit
    /// `SIDECAR_URL`, else the task's own address (never fatal when it
    /// cannot be derived).
    pub fn derive_sidecar_url(
        &mut self,
        lookup: Lookup,
        task: Option<&leasehold_platform::ecs::TaskMetadata>,
    ) -> Result<(), ConfigError> {
        let explicit = self.worker.sidecar_url.take();
        let mut env = Env::new(lookup);
        let derived = leasehold_telemetry::settings::sidecar_url_from(&mut env, explicit, task);
        self.worker.sidecar_url = env.finish(derived)?;
        Ok(())
    }
}

/// Whose numbers the stream's sequence is (`UPSTREAM_SEQ_SCOPE`,
/// `UPSTREAM_SEQ_POINTER=none`): the worker's only where an in-band
/// snapshot anchors each connection.
fn seq_source(env: &mut Env, upstream: &WebSocketUpstreamConfig, resume: ResumeMode) -> SeqSource {
    let scope = env.get(&UPSTREAM_SEQ_SCOPE);
    let counted = upstream.seq_pointer == NO_POINTER;
    let source = match (counted, scope) {
        (true, _) => SeqSource::Counted,
        (false, SeqScope::Connection) => SeqSource::Connection,
        (false, SeqScope::Stream) => SeqSource::Stream,
    };
    if source.renumbers() && (resume != ResumeMode::Snapshot || upstream.snapshot_match.is_none()) {
        let setting = if counted {
            UPSTREAM_SEQ_POINTER.name
        } else {
            UPSTREAM_SEQ_SCOPE.name
        };
        env.problem(
            setting,
            "needs UPSTREAM_RESUME=snapshot with UPSTREAM_SNAPSHOT_MATCH: the worker's numbers \
             start from each connection's first book",
        );
    }
    if counted && upstream.range.is_some() {
        env.problem(
            UPSTREAM_SEQ_POINTER.name,
            "is none but a frame's range start is set (UPSTREAM_SEQ_FIRST_POINTER or \
             UPSTREAM_SEQ_PREV_POINTER)",
        );
    }
    if source.renumbers() && !upstream.max_connection_age.is_zero() {
        env.problem(
            UPSTREAM_MAX_CONNECTION_AGE_MS.name,
            "is set but the worker numbers the stream (UPSTREAM_SEQ_POINTER=none or \
             UPSTREAM_SEQ_SCOPE=connection): a new connection cannot be matched to the old one",
        );
    }
    if source == SeqSource::Connection && upstream.streams_per_connection > 1 {
        env.problem(
            UPSTREAM_SEQ_SCOPE.name,
            "is connection but UPSTREAM_STREAMS_PER_CONNECTION is above 1: a sequence shared by \
             the connection's streams has holes in each of them",
        );
    }
    source
}

/// Reads the stream worker's settings; `lookup` gives flags precedence over the environment.
pub fn parse(lookup: Lookup) -> Result<StreamWorkerSettings, ConfigError> {
    let mut env = Env::new(lookup);
    let lease = lease_settings(&mut env);
    let url = env
        .required(&UPSTREAM_URL, "(the upstream WebSocket URL)")
        .unwrap_or_default();
    let mut upstream = WebSocketUpstreamConfig::for_feed(&url);
    upstream.subscribe_template = env.get(&UPSTREAM_SUBSCRIBE);
    upstream.seq_pointer = env.get(&UPSTREAM_SEQ_POINTER);
    upstream.range = match (
        env.optional(&UPSTREAM_SEQ_FIRST_POINTER),
        env.optional(&UPSTREAM_SEQ_PREV_POINTER),
    ) {
        (Some(first), None) => Some(SeqRange::First(first)),
        (None, Some(prev)) => Some(SeqRange::Prev(prev)),
        (None, None) => None,
        (Some(_), Some(_)) => {
            env.problem(
                UPSTREAM_SEQ_PREV_POINTER.name,
                format!(
                    "set {} or this, not both (two ways of saying where a frame's range starts)",
                    UPSTREAM_SEQ_FIRST_POINTER.name
                ),
            );
            None
        }
    };
    upstream.id_pointer = env.get(&UPSTREAM_ID_POINTER);
    upstream.max_frame_bytes = env.get(&UPSTREAM_MAX_FRAME_BYTES);
    upstream.idle_timeout = env.get(&UPSTREAM_IDLE_TIMEOUT_MS);
    upstream.ts_pointer = env.optional(&UPSTREAM_TS_POINTER);
    upstream.data_match = env.optional(&UPSTREAM_DATA_MATCH).unwrap_or_default();
    upstream.ping_text = env.optional(&UPSTREAM_PING_TEXT);
    upstream.ping_interval = env.get(&UPSTREAM_PING_INTERVAL_MS);
    upstream.connects_per_minute = env.get(&UPSTREAM_CONNECTS_PER_MINUTE);
    upstream.unsubscribe_template = env.optional(&UPSTREAM_UNSUBSCRIBE).unwrap_or_default();
    upstream.streams_per_connection = env.get(&UPSTREAM_STREAMS_PER_CONNECTION).max(1);
    upstream.route_pointer = env.optional(&UPSTREAM_ROUTE_POINTER);
    upstream.route_template = env.get(&UPSTREAM_ROUTE_TEMPLATE);
    upstream.subscribe_batch = env.get(&UPSTREAM_SUBSCRIBE_BATCH).max(1);
    upstream.subscribes_per_second =
        u32::try_from(env.get(&UPSTREAM_SUBSCRIBES_PER_SECOND)).unwrap_or(u32::MAX);
    upstream.max_connection_age = env.get(&UPSTREAM_MAX_CONNECTION_AGE_MS);
    let resume = env.get(&UPSTREAM_RESUME);
    if upstream.streams_per_connection > 1 && resume == ResumeMode::Replay {
        env.problem(
            UPSTREAM_STREAMS_PER_CONNECTION.name,
            "is above 1 but UPSTREAM_RESUME is replay: a shared connection cannot replay each \
             stream from its own position",
        );
    }
    upstream.snapshot_match = match env.optional(&UPSTREAM_SNAPSHOT_MATCH) {
        None => None,
        Some(_) if resume != ResumeMode::Snapshot => {
            env.problem(
                UPSTREAM_SNAPSHOT_MATCH.name,
                "is set but UPSTREAM_RESUME is not snapshot (it would be ignored)",
            );
            None
        }
        Some(mut alternatives) if alternatives.len() == 1 => alternatives.pop(),
        Some(_) => {
            env.problem(UPSTREAM_SNAPSHOT_MATCH.name, "must be one /pointer=value");
            None
        }
    };
    let seq_source = seq_source(&mut env, &upstream, resume);
    let history = history_config(&mut env, &upstream, resume);
    if !url.is_empty()
        && let Err(errors) = upstream.validate()
    {
        for error in errors {
            // Most problems name their setting; the rest are the upstream's.
            match error.split_once(": ") {
                Some((setting, problem)) if setting.starts_with("UPSTREAM_") => {
                    env.problem(setting, problem)
                }
                _ => env.problem("upstream", error),
            }
        }
    }
    let sink_url = env
        .required(&SINK_URL, "(redis://…, rediss://… or memory:)")
        .unwrap_or_default()
        .into();
    let sink = SinkOptions {
        max_len: env.get(&SINK_MAX_LEN),
        reply_timeout: env.get(&SINK_TIMEOUT_MS),
        wait_replicas: u32::try_from(env.get(&SINK_WAIT_REPLICAS)).unwrap_or(u32::MAX),
        wait_timeout: env.get(&SINK_WAIT_TIMEOUT_MS),
    };
    let register = env.optional(&STREAM_IDS).unwrap_or_default();
    if register
        .iter()
        .any(|s| s.starts_with(leasehold_control::schema::RESERVED_PREFIX))
    {
        env.problem(
            STREAM_IDS.name,
            "stream ids cannot start with the reserved prefix leasehold#",
        );
    }
    let worker = StreamWorkerConfig {
        max_streams: env.get(&MAX_STREAMS),
        discovery_interval: env.get(&DISCOVERY_INTERVAL_MS),
        discovery_mode: env.get(&DISCOVERY_MODE),
        handoff_poll: env.get(&HANDOFF_POLL_MS),
        drain_timeout: env.get(&DRAIN_TIMEOUT_MS),
        handoff_prepare_timeout: env.get(&HANDOFF_PREPARE_TIMEOUT_MS),
        register,
        // Explicit only here; the binary derives it on ECS when unset.
        sidecar_url: env.optional(&leasehold_telemetry::settings::SIDECAR_URL),
    };
    let book_check = BookCheck {
        rule: env.get(&UPSTREAM_BOOK_CHECKSUM),
        options: KeeperOptions {
            depth: Some(env.get(&UPSTREAM_BOOK_DEPTH)).filter(|depth| *depth > 0),
            precision: env.optional(&UPSTREAM_BOOK_PRECISION),
        },
    };
    if book_check.rule != ChecksumRule::None && resume != ResumeMode::Snapshot {
        env.problem(
            UPSTREAM_BOOK_CHECKSUM.name,
            "is set but UPSTREAM_RESUME is not snapshot (only a book has a checksum)",
        );
    }
    let runner = RunnerConfig {
        batch_max_events: env.get(&BATCH_MAX_EVENTS),
        sink_max_failures: env.get(&SINK_MAX_FAILURES),
        resume,
        seq_step: env.get(&UPSTREAM_SEQ_STEP),
        seq_source,
        snapshots_in_band: upstream.snapshot_match.is_some(),
        book_check,
        jump: JumpBound {
            max: env.get(&UPSTREAM_MAX_JUMP),
            confirm_after: u32::try_from(env.get(&UPSTREAM_RESET_AFTER)).unwrap_or(u32::MAX),
        },
        hold_max_bytes: env.get(&STREAM_HOLD_MAX_BYTES),
        ..RunnerConfig::default()
    };
    let shipper =
        leasehold_telemetry::settings::shipper(&mut env, "stream-worker", &lease.keeper.owner_id);
    let handoff_listen = env.optional(&HANDOFF_LISTEN);
    env.finish(StreamWorkerSettings {
        lease,
        upstream,
        history,
        sink_url,
        sink,
        worker,
        runner,
        shipper,
        handoff_listen,
    })
}

#[cfg(test)]
mod tests {
    use leasehold_platform::settings::fixed_lookup as lookup;

    use super::*;

    #[test]
    fn minimal_configuration_uses_the_defaults() {
        let settings = parse(&lookup(&[
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
            ("STREAM_IDS", "a, b,,c"),
        ]))
        .unwrap();
        assert_eq!(settings.worker.register, ["a", "b", "c"]);
        assert_eq!(settings.sink.max_len, 100_000);
        assert_eq!(settings.worker.discovery_interval, Duration::from_secs(5));
        assert_eq!(settings.upstream.seq_pointer, "/seq");
        assert_eq!(
            settings.upstream.subscribe_template,
            FEED_SUBSCRIBE_TEMPLATE
        );
        assert_eq!(settings.shipper.capacity, 65_536);
    }

    /// The config structs' `Default`s are what an unset environment gives, so
    /// code built with `..Default::default()` behaves as a deployed worker.
    #[test]
    fn config_defaults_are_the_settings_defaults() {
        let settings = parse(&lookup(&[
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
        ]))
        .unwrap();
        let worker = StreamWorkerConfig::default();
        assert_eq!(settings.worker.max_streams, worker.max_streams);
        assert_eq!(
            settings.worker.discovery_interval,
            worker.discovery_interval
        );
        assert_eq!(settings.worker.handoff_poll, worker.handoff_poll);
        assert_eq!(settings.worker.drain_timeout, worker.drain_timeout);
        let runner = RunnerConfig::default();
        assert_eq!(settings.runner.batch_max_events, runner.batch_max_events);
        assert_eq!(settings.runner.sink_max_failures, runner.sink_max_failures);
        let keeper = leasehold_control::keeper::KeeperConfig::default();
        assert_eq!(settings.lease.keeper.lease, keeper.lease);
        assert_eq!(settings.lease.keeper.renew_interval, keeper.renew_interval);
        assert_eq!(settings.lease.keeper.safety_margin, keeper.safety_margin);
        assert_eq!(settings.lease.keeper.skew_margin, keeper.skew_margin);
        let sink = SinkOptions::default();
        assert_eq!(settings.sink.reply_timeout, sink.reply_timeout);
        assert_eq!(settings.sink.wait_timeout, sink.wait_timeout);
        assert_eq!(settings.sink.max_len, sink.max_len);
    }

    #[test]
    fn a_diffs_range_is_read_from_its_first_or_its_previous_id_never_both() {
        let base = [
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
            ("UPSTREAM_SEQ_POINTER", "/u"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            parse(&lookup(&[&base[..], extra].concat())).map(|s| s.upstream.range)
        };
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(
            with(&[("UPSTREAM_SEQ_FIRST_POINTER", "/U")]).unwrap(),
            Some(SeqRange::First("/U".into()))
        );
        assert_eq!(
            with(&[("UPSTREAM_SEQ_PREV_POINTER", "/pu")]).unwrap(),
            Some(SeqRange::Prev("/pu".into()))
        );
        let both = with(&[
            ("UPSTREAM_SEQ_FIRST_POINTER", "/U"),
            ("UPSTREAM_SEQ_PREV_POINTER", "/pu"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            both.contains(
                "UPSTREAM_SEQ_PREV_POINTER: set UPSTREAM_SEQ_FIRST_POINTER or this, not both"
            ),
            "{both}"
        );
    }

    #[test]
    fn the_worker_numbers_a_stream_only_where_an_in_band_book_anchors_each_connection() {
        let base = [
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
            ("UPSTREAM_ID_POINTER", "none"),
        ];
        let in_band = [
            ("UPSTREAM_RESUME", "snapshot"),
            ("UPSTREAM_SNAPSHOT_MATCH", "/type=snapshot"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            parse(&lookup(&[&base[..], extra].concat())).map(|s| s.runner.seq_source)
        };
        let counted = [&in_band[..], &[("UPSTREAM_SEQ_POINTER", "none")]].concat();
        assert_eq!(with(&counted).unwrap(), SeqSource::Counted);
        let scoped = [&in_band[..], &[("UPSTREAM_SEQ_SCOPE", "connection")]].concat();
        assert_eq!(with(&scoped).unwrap(), SeqSource::Connection);
        assert_eq!(with(&in_band).unwrap(), SeqSource::Stream);
        let refused = |extra: &[(&'static str, &'static str)]| with(extra).unwrap_err().to_string();
        // No book to start each connection's numbers from.
        let live = refused(&[("UPSTREAM_SEQ_POINTER", "none")]);
        assert!(
            live.contains("UPSTREAM_SEQ_POINTER: needs UPSTREAM_RESUME=snapshot"),
            "{live}"
        );
        let shared = refused(
            &[
                &scoped[..],
                &[
                    ("UPSTREAM_STREAMS_PER_CONNECTION", "10"),
                    ("UPSTREAM_ROUTE_POINTER", "/product_id"),
                ],
            ]
            .concat(),
        );
        assert!(
            shared.contains("UPSTREAM_SEQ_SCOPE: is connection but"),
            "{shared}"
        );
        let ranged = refused(&[&counted[..], &[("UPSTREAM_SEQ_FIRST_POINTER", "/U")]].concat());
        assert!(
            ranged.contains("UPSTREAM_SEQ_POINTER: is none but"),
            "{ranged}"
        );
        assert!(
            refused(&[("UPSTREAM_SEQ_SCOPE", "socket")]).contains("must be stream or connection")
        );
        let aged =
            refused(&[&counted[..], &[("UPSTREAM_MAX_CONNECTION_AGE_MS", "60000")]].concat());
        assert!(
            aged.contains("UPSTREAM_MAX_CONNECTION_AGE_MS: is set but the worker numbers"),
            "{aged}"
        );
    }

    #[test]
    fn backfill_reads_its_history_with_the_stream_pointers_by_default() {
        let base = [
            ("UPSTREAM_URL", "ws://127.0.0.1:9000/ws/{stream_id}@trade"),
            ("SINK_URL", "memory:"),
            ("OWNER_ID", "w"),
            ("UPSTREAM_SEQ_POINTER", "/t"),
            ("UPSTREAM_ID_POINTER", "/t"),
            ("UPSTREAM_SUBSCRIBE", ""),
            ("UPSTREAM_DATA_MATCH", "/e=trade"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = base.to_vec();
            vars.extend_from_slice(extra);
            parse(&lookup(&vars))
        };
        // Set but empty: an exchange's raw stream wants no subscribe message.
        assert_eq!(with(&[]).unwrap().upstream.subscribe_template, "");
        let settings = with(&[
            ("UPSTREAM_RESUME", "backfill"),
            (
                "UPSTREAM_BACKFILL_URL",
                "http://127.0.0.1:9001/api?symbol={stream_id_upper}&fromId={from_seq}&key=hunter2",
            ),
            ("UPSTREAM_BACKFILL_SEQ_POINTER", "/id"),
        ])
        .unwrap();
        let history = settings.history.expect("a history");
        assert_eq!(
            (history.seq_pointer.as_str(), history.id_pointer.as_str()),
            ("/id", "/t")
        );
        assert_eq!(settings.runner.resume, ResumeMode::Backfill);
        assert_eq!(settings.upstream.data_match.len(), 1);
        let live = with(&[
            ("UPSTREAM_RESUME", "live"),
            ("UPSTREAM_SEQ_STEP", "increasing"),
        ])
        .unwrap();
        assert!(live.history.is_none());
        assert_eq!(live.runner.seq_step, SeqStep::Increasing);
        // A backfill without a history, a history without backfill, bad names:
        // each refused, and the URL (an API key) never echoed.
        let text = with(&[("UPSTREAM_RESUME", "backfill")])
            .unwrap_err()
            .to_string();
        assert!(text.contains("UPSTREAM_BACKFILL_URL"), "{text}");
        let text = with(&[(
            "UPSTREAM_BACKFILL_URL",
            "http://h/api?fromId={from_seq}&key=hunter2",
        )])
        .unwrap_err()
        .to_string();
        assert!(
            text.contains("UPSTREAM_BACKFILL_URL") && !text.contains("hunter2"),
            "{text}"
        );
        let text = with(&[
            ("UPSTREAM_RESUME", "sometimes"),
            ("UPSTREAM_SEQ_STEP", "up"),
            ("UPSTREAM_DATA_MATCH", "type=match"),
        ])
        .unwrap_err()
        .to_string();
        for name in [
            "UPSTREAM_RESUME",
            "UPSTREAM_SEQ_STEP",
            "UPSTREAM_DATA_MATCH",
        ] {
            assert!(text.contains(name), "{name}: {text}");
        }
    }

    #[test]
    fn every_problem_is_listed_and_no_secret_echoed() {
        let err = parse(&lookup(&[
            ("SINK_URL", "postgres://user:hunter2@db/x"),
            ("LEASE_SECONDS", "0"),
            ("BATCH_MAX_EVENTS", "many"),
        ]))
        .unwrap_err();
        let text = err.to_string();
        for name in [
            "UPSTREAM_URL",
            "SINK_URL",
            "LEASE_SECONDS",
            "BATCH_MAX_EVENTS",
        ] {
            assert!(text.contains(name), "{name} missing: {text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn an_unset_or_empty_owner_id_is_the_ecs_task_id() {
        let task = leasehold_platform::ecs::TaskMetadata {
            task_arn: Some("arn:aws:ecs:eu-west-1:1:task/c/abc123".into()),
            ..Default::default()
        };
        let empty = |name: &str| (name == "OWNER_ID").then(String::new);
        let lookup = owner_from_task(&empty, Some(&task));
        assert_eq!(lookup("OWNER_ID").as_deref(), Some("abc123"));
        assert_eq!(lookup("MAX_STREAMS"), None);
        let set = |name: &str| (name == "OWNER_ID").then(|| "w1".to_owned());
        assert_eq!(
            owner_from_task(&set, Some(&task))("OWNER_ID").as_deref(),
            Some("w1")
        );
        let unset = |_: &str| None;
        assert_eq!(owner_from_task(&unset, None)("OWNER_ID"), None);
    }
}
