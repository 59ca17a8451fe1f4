//! What an exchange server imitates and how it behaves: the shape, the rate,
//! the first id, retention, cuts and forced history failures.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::FeedError;

/// Ids stay exact in JSON readers that use doubles, and id arithmetic (ids
/// times four for sequences) cannot overflow in a thousand years at
/// [`MAX_RATE`].
const MAX_FIRST_ID: u64 = 1 << 53;
const MAX_RATE: f64 = 1_000_000.0;

/// Which exchange's public market-data API a server imitates: a trade stream,
/// an order book's diff stream with its REST snapshot, or an order book whose
/// snapshots come in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExchangeShape {
    /// Binance spot raw trade stream and `historicalTrades`.
    BinanceTrade,
    /// Binance spot aggregate trade stream and `aggTrades`.
    BinanceAggTrade,
    /// Coinbase Exchange feed, `matches` and `heartbeat` channels.
    CoinbaseMatches,
    /// Kraken spot WebSocket v2, `trade` channel.
    KrakenTrade,
    /// Bybit v5 public spot, `publicTrade` topics.
    BybitPublicTrade,
    /// Binance spot diff depth stream (`<symbol>@depth`, `<symbol>@depth@100ms`)
    /// and the order book snapshot `GET /api/v3/depth`.
    BinanceDepth,
    /// Binance USD-M futures diff depth stream (`<symbol>@depth@100ms` …,
    /// chained by `pu`) and the order book snapshot `GET /fapi/v1/depth`.
    BinanceFuturesDepth,
    /// Bybit v5 public spot `orderbook.50.<SYMBOL>`: a snapshot after every
    /// subscribe, then deltas with contiguous `u`.
    BybitOrderbook,
    /// OKX v5 public `books`: a snapshot after every subscribe, then updates
    /// chained by `prevSeqId`, each with OKX's CRC32 checksum.
    OkxBooks,
    /// Coinbase Advanced Trade `level2` (messages on channel `l2_data`): a
    /// snapshot after every subscribe, then updates; `sequence_num` counts
    /// the connection's messages.
    CoinbaseLevel2,
    /// Kraken spot WebSocket v2 `book`: a snapshot after every subscribe,
    /// then updates of the subscribed depth, each with Kraken's CRC32
    /// checksum and no sequence at all.
    KrakenBook,
}

impl ExchangeShape {
    /// Every shape.
    pub const ALL: [ExchangeShape; 11] = [
        ExchangeShape::BinanceTrade,
        ExchangeShape::BinanceAggTrade,
        ExchangeShape::CoinbaseMatches,
        ExchangeShape::KrakenTrade,
        ExchangeShape::BybitPublicTrade,
        ExchangeShape::BinanceDepth,
        ExchangeShape::BinanceFuturesDepth,
        ExchangeShape::BybitOrderbook,
        ExchangeShape::OkxBooks,
        ExchangeShape::CoinbaseLevel2,
        ExchangeShape::KrakenBook,
    ];

    /// The shape's name on command lines (`binance-trade` …).
    pub fn name(self) -> &'static str {
        match self {
            ExchangeShape::BinanceTrade => "binance-trade",
            ExchangeShape::BinanceAggTrade => "binance-agg-trade",
            ExchangeShape::CoinbaseMatches => "coinbase-matches",
            ExchangeShape::KrakenTrade => "kraken-trade",
            ExchangeShape::BybitPublicTrade => "bybit-public-trade",
            ExchangeShape::BinanceDepth => "binance-depth",
            ExchangeShape::BinanceFuturesDepth => "binance-futures-depth",
            ExchangeShape::BybitOrderbook => "bybit-orderbook",
            ExchangeShape::OkxBooks => "okx-books",
            ExchangeShape::CoinbaseLevel2 => "coinbase-level2",
            ExchangeShape::KrakenBook => "kraken-book",
        }
    }

    /// A stream id that works with the shape's worked settings (Binance:
    /// lower case, so `{stream_id}` fits the stream URL and
    /// `{stream_id_upper}` the REST symbol).
    pub fn example_stream_id(self) -> &'static str {
        match self {
            ExchangeShape::BinanceTrade
            | ExchangeShape::BinanceAggTrade
            | ExchangeShape::BinanceDepth
            | ExchangeShape::BinanceFuturesDepth => "btcusdt",
            ExchangeShape::CoinbaseMatches | ExchangeShape::CoinbaseLevel2 => "BTC-USD",
            ExchangeShape::KrakenTrade | ExchangeShape::KrakenBook => "BTC/USD",
            ExchangeShape::BybitPublicTrade | ExchangeShape::BybitOrderbook => "BTCUSDT",
            ExchangeShape::OkxBooks => "BTC-USDT",
        }
    }

    /// Whether the shape has a REST history (the Binance trade shapes).
    pub fn serves_history(self) -> bool {
        matches!(
            self,
            ExchangeShape::BinanceTrade | ExchangeShape::BinanceAggTrade
        )
    }

    /// Whether the shape is an order book with a REST snapshot: a diff
    /// stream and `UPSTREAM_SNAPSHOT_URL` (the Binance depth shapes;
    /// `UPSTREAM_RESUME=snapshot`).
    pub fn serves_snapshot(self) -> bool {
        matches!(
            self,
            ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth
        )
    }

    /// Whether the shape is an order book whose snapshots come in the stream
    /// after each subscribe (Bybit, OKX, Coinbase `level2`, Kraken `book`;
    /// `UPSTREAM_RESUME=snapshot` with `UPSTREAM_SNAPSHOT_MATCH`).
    pub fn snapshot_in_band(self) -> bool {
        matches!(
            self,
            ExchangeShape::BybitOrderbook
                | ExchangeShape::OkxBooks
                | ExchangeShape::CoinbaseLevel2
                | ExchangeShape::KrakenBook
        )
    }

    /// Whether the shape is an order book at all (a REST or an in-band
    /// snapshot): [`ExchangeServer::book_at`](super::ExchangeServer::book_at)
    /// answers for it.
    pub fn has_book(self) -> bool {
        self.serves_snapshot() || self.snapshot_in_band()
    }

    /// Whether the shape serves Binance's combined stream `/stream`
    /// ([`ExchangeServer::combined_url`](super::ExchangeServer::combined_url)):
    /// the Binance depth shapes.
    pub fn has_combined_stream(self) -> bool {
        matches!(
            self,
            ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth
        )
    }

    /// Whether updates carry a checksum of the book (OKX, Kraken), which
    /// [`ExchangeServer::corrupt_next_checksum`](super::ExchangeServer::corrupt_next_checksum)
    /// can break.
    pub fn has_checksum(self) -> bool {
        matches!(self, ExchangeShape::OkxBooks | ExchangeShape::KrakenBook)
    }

    /// Whether the shape's frames carry an id that names what they hold
    /// (a trade id, an update id, `u`, `seqId`): Coinbase's `level2`
    /// numbers the messages of a connection (`sequence_num`, from 0 on each
    /// one) and Kraken's `book` nothing, so
    /// [`ExchangeServer::frame`](super::ExchangeServer::frame) and
    /// [`ExchangeServer::book_at`](super::ExchangeServer::book_at) take the
    /// fake's own numbers for them.
    pub fn frames_carry_ids(self) -> bool {
        !matches!(
            self,
            ExchangeShape::CoinbaseLevel2 | ExchangeShape::KrakenBook
        )
    }

    /// Whether clients send application-level pings (Kraken, Bybit, OKX),
    /// which [`ExchangeConfig::silent_cut_after`] watches.
    pub fn has_app_ping(self) -> bool {
        matches!(
            self,
            ExchangeShape::KrakenTrade
                | ExchangeShape::BybitPublicTrade
                | ExchangeShape::BybitOrderbook
                | ExchangeShape::OkxBooks
                | ExchangeShape::KrakenBook
        )
    }
}

impl fmt::Display for ExchangeShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExchangeShape {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ExchangeShape::ALL
            .into_iter()
            .find(|shape| shape.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ExchangeShape::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "unknown exchange shape {name:?} (one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Makes the next `times` history requests fail with `status`, for tests of a
/// client's backoff. 429 and 418 carry `Retry-After: retry_after_secs`, as
/// Binance's do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryOverride {
    /// The HTTP status (400 to 599).
    pub status: u16,
    /// How many requests it applies to.
    pub times: u64,
    /// `Retry-After` seconds on 429 and 418.
    pub retry_after_secs: u64,
}

impl HistoryOverride {
    /// `times` answers 429 with `Retry-After: 1`.
    pub fn too_many_requests(times: u64) -> Self {
        HistoryOverride {
            status: 429,
            times,
            retry_after_secs: 1,
        }
    }

    /// `times` answers 418 (an IP ban) with `Retry-After: 1`.
    pub fn banned(times: u64) -> Self {
        HistoryOverride {
            status: 418,
            ..HistoryOverride::too_many_requests(times)
        }
    }

    /// `times` answers 500.
    pub fn server_error(times: u64) -> Self {
        HistoryOverride {
            status: 500,
            ..HistoryOverride::too_many_requests(times)
        }
    }
}

/// How an exchange server behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeConfig {
    /// Which exchange it imitates.
    pub shape: ExchangeShape,
    /// Ids (trades, aggregates, order-book updates) per second per symbol;
    /// positive.
    pub rate: f64,
    /// The first id (trade id, aggregate id, order-book update id); at least 1.
    pub first_id: u64,
    /// Newest ids the REST history serves (0: none); Binance trade shapes only.
    pub history_retention: u64,
    /// Cut each connection after this long.
    pub cut_every: Option<Duration>,
    /// Cut a client that sent no application ping for this long (Kraken,
    /// Bybit and OKX only; Bybit documents 20 s between pings, OKX a `ping`
    /// within 30 s).
    pub silent_cut_after: Option<Duration>,
    /// Fail the first history (or order-book snapshot) requests (changed while
    /// running with
    /// [`set_history_override`](super::ExchangeServer::set_history_override)).
    pub history_status_override: Option<HistoryOverride>,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            shape: ExchangeShape::BinanceTrade,
            rate: 10.0,
            first_id: 5_000,
            history_retention: 10_000,
            cut_every: None,
            silent_cut_after: None,
            history_status_override: None,
        }
    }
}

impl ExchangeConfig {
    pub(super) fn check(&self) -> Result<(), FeedError> {
        let refuse = |message: String| Err(FeedError::Config(message));
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            return refuse(format!(
                "rate must be a positive number of trades per second up to {MAX_RATE}, got {}",
                self.rate
            ));
        }
        if !(1..=MAX_FIRST_ID).contains(&self.first_id) {
            return refuse(format!("first_id must be 1 to 2^53, got {}", self.first_id));
        }
        if self.cut_every.is_some_and(|d| d.is_zero()) {
            return refuse("cut_every must be positive".into());
        }
        match self.silent_cut_after {
            Some(d) if d.is_zero() => return refuse("silent_cut_after must be positive".into()),
            Some(_) if !self.shape.has_app_ping() => {
                return refuse(format!(
                    "silent_cut_after needs a shape whose clients ping (Kraken, Bybit, OKX), not {}",
                    self.shape
                ));
            }
            _ => {}
        }
        if let Some(forced) = self.history_status_override
            && !(400..=599).contains(&forced.status)
        {
            return refuse(format!(
                "history_status_override.status must be 400 to 599, got {}",
                forced.status
            ));
        }
        Ok(())
    }
}
