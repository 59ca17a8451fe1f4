//! Exchange-shaped fake market-data servers: the trade streams, subscribe
//! messages, acknowledgements, heartbeats, pings and REST history of five
//! public exchange APIs, Binance's order-book diff streams with their REST
//! snapshots, and the Bybit, OKX, Coinbase (`level2`) and Kraken (`book`)
//! order books whose snapshots come in the stream, so tests, benchmarks and
//! `leasehold dev --feed exchange` meet the
//! frames the stream worker is configured for without the internet. Each is a
//! real server: one port, each connection its own task, bounded memory, clean
//! shutdown through a [`CancellationToken`].
//!
//! # What every shape does
//!
//! - **Live start, no replay.** Ids (trade ids, aggregate ids, order-book
//!   updates) advance at
//!   [`ExchangeConfig::rate`] per second per symbol from the server's start, the
//!   first being [`ExchangeConfig::first_id`] (so nothing starts at 1 until a
//!   restart, below). Every
//!   connection starts at the next id due and nothing a client asks for is
//!   replayed: a client that reconnects after 2 s has missed about 2 s of ids.
//!   The only way back is the Binance trade shapes' REST history (and, for
//!   the order books, a fresh REST snapshot, or for Bybit, OKX, Coinbase and
//!   Kraken a new subscribe, which sends a new snapshot).
//! - **Computed, not stored.** A trade is a pure function of (symbol, id) and
//!   the server's start time (or last restart), and so are an order book's
//!   diffs and the book after any update id; [`ExchangeServer::frame`],
//!   [`ExchangeServer::history_item`] and [`ExchangeServer::book_at`] give
//!   exactly what is served for any id.
//! - **Any symbol** the exchange's own spelling rules allow (Binance: lower
//!   case in stream names, upper case in REST; the others upper case, as
//!   their documentation writes them); others are refused the exchange's way.
//! - **Cuts.** [`ExchangeConfig::cut_every`] cuts each connection after that
//!   long, [`ExchangeServer::cut_all`] cuts every open one now, and
//!   [`ExchangeConfig::silent_cut_after`] cuts a Kraken, Bybit or OKX client
//!   that sent no application ping for that long. The n-th connection accepted (in
//!   [`ExchangeServer::connections_accepted`] order) is cut with a close frame
//!   (1001) when n is odd and by dropping the socket, without one, when n is
//!   even: real exchanges do both.
//! - **Restarts.** [`ExchangeServer::restart`] imitates an exchange service
//!   restart: every open connection is cut (as by `cut_all`) and ids start
//!   over at 1 for every symbol, due from now at the same rate with trade
//!   times from now (aggregate trade ranges, Coinbase and Bybit sequences
//!   start over with them). Connections opened afterwards stream the new ids;
//!   the Binance REST history serves only the new ids (a `fromId` from before
//!   the restart is past the new head: an empty page); `head`, `frame`,
//!   `history_item`, `ts_ms` and `oldest_kept` answer for the new ids. Bybit
//!   documents that after a service restart its order-book update id starts
//!   again at `u=1`; Binance and others restart trade ids rarely, but a fake
//!   that can do it lets a test see a client notice the ids going backwards
//!   and recover. [`ExchangeServer::restarts`] counts them. Order books start
//!   over too: update id 1 is the first diff of the new timeline, applied to
//!   the same fixed initial book (Bybit, OKX, Coinbase and Kraken books: the
//!   first snapshot after a restart that a client subscribes in time for is
//!   at id 1, and its updates continue from 2 or from `prevSeqId` 1).
//! - **Bounded.** Frames are computed when due, a client is not read while
//!   more than 1,024 answers wait for it, client messages are limited to
//!   64 KiB (larger ones end the connection), subscriptions to 64 symbols per
//!   connection, sessions to 4,096, a REST page to 1,000 items, and an order
//!   book to 200 price levels a side, 50 for Bybit's `orderbook.50`, 25 for
//!   Kraken's `book` (nothing of it is stored: see below).
//!
//! # Shapes
//!
//! ## Binance trade and aggregate trade ([`ExchangeShape::BinanceTrade`], [`ExchangeShape::BinanceAggTrade`])
//!
//! Modelled on Binance's spot "WebSocket Streams" page (Trade Streams,
//! Aggregate Trade Streams; trade frames without `b` and `a`, removed on
//! 2024-06-18 per the changelog), the REST "Market Data endpoints" page (Old
//! trade lookup `GET /api/v3/historicalTrades`, Compressed/Aggregate trades
//! list `GET /api/v3/aggTrades`) and "General API Information" and "Error
//! codes" (429 and 418 with `Retry-After`, `{"code","msg"}` errors).
//! Simplified: raw streams only (`/ws/<symbol>@trade`; no combined
//! `/stream?streams=`); stream requests sent on the socket (`SUBSCRIBE`,
//! `LIST_SUBSCRIPTIONS`…) are answered but change nothing; no server ping
//! frames every 20 s and no 24 h disconnect (use `cut_every`); one port serves
//! both the stream and the REST API (Binance uses two hosts); an unknown
//! stream name is refused with HTTP 400. History pages ascend from `fromId`
//! (the newest `limit` without it), `limit` is clamped to 1..=1000 (default
//! 500), ids past the head are not served (an empty page), and — Binance keeps
//! every trade, so its documentation has no answer for this — a `fromId` older
//! than [`ExchangeConfig::history_retention`] gets the page from the oldest id
//! kept, as Binance answers for a `fromId` before a symbol's first trade: the
//! first item's id is then above `fromId`, and a client can tell what it lost.
//! `aggTrades` refuses `startTime`/`endTime` (not modelled); unknown
//! parameters get `-1104`, as on Binance.
//!
//! ## Coinbase matches ([`ExchangeShape::CoinbaseMatches`])
//!
//! Modelled on Coinbase Exchange's "WebSocket Feed" overview and "WebSocket
//! Channels" pages (`matches`, `heartbeat`). One endpoint `/`; a `subscribe`
//! (channel names or `{"name","product_ids"}` objects) is answered with the
//! `subscriptions` list, then a `last_match` per newly followed product, then
//! `match` frames: `trade_id` contiguous per product, `sequence` increasing
//! with holes (the product's sequence is shared with order-book events of
//! channels the client does not follow), `heartbeat` frames once a second per
//! product with their own `sequence` and `last_trade_id`; bad requests get
//! `{"type":"error","message","reason"}` and the connection stays open; no
//! subscribe within 5 s closes it. Simplified: only `matches` and `heartbeat`
//! (other channels are refused as not modelled); no authentication fields;
//! times are RFC 3339 strings, so the worked settings have no time pointer.
//! No REST history: Coinbase's trades endpoint pages newest-first by `after`
//! cursors, which is not the ascending-from-an-id backfill the worker does.
//!
//! ## Kraken trade, WebSocket v2 ([`ExchangeShape::KrakenTrade`])
//!
//! Modelled on Kraken's "Spot WebSocket v2" pages (trade, ping, heartbeat,
//! status). Endpoint `/v2`; a `status` frame on connect; `subscribe` to
//! `trade` answered per symbol with the `method`/`result`/`success`/`time_in`/
//! `time_out` acknowledgement, then (unless `"snapshot":false`) a `snapshot` of
//! the last up to 50 trades, then one trade per `update` frame, `trade_id`
//! contiguous per symbol, prices and quantities as JSON numbers, timestamps as
//! RFC 3339 strings; `{"channel":"heartbeat"}` after a second without other
//! frames; `ping` answered with `pong` (with `req_id` when given).
//! Simplified: only the `trade` channel; no batching of several trades in an
//! update; an empty snapshot (no trade yet) is not sent; error texts follow
//! Kraken's style but not every exact message.
//!
//! ## Bybit public trade, v5 spot ([`ExchangeShape::BybitPublicTrade`])
//!
//! Modelled on Bybit's v5 "Connect" and "Trade" (WebSocket public) pages.
//! Endpoint `/v5/public/spot`; `{"op":"subscribe","args":["publicTrade.<SYMBOL>"]}`
//! acknowledged with `success`/`ret_msg`/`conn_id`/`op` (and `req_id` when
//! given); data frames `{"topic","type":"snapshot","ts","data":[…]}` whose
//! items carry `T`, `s`, `S`, `v`, `p`, `i` (the trade id, a string, contiguous
//! per symbol), `BT`, `RPI` and `seq` (the cross sequence: increasing with
//! holes). Trades come in match packages of 1 to 4 trades that share `T` and
//! `seq` and one frame, which goes out when its last trade is due (so the head
//! moves a package at a time). `{"op":"ping"}` answered with
//! `ret_msg":"pong"`. Bybit asks clients to ping every 20 s and cuts silent
//! ones; here that is [`ExchangeConfig::silent_cut_after`]. Simplified: `L`
//! is left out (Bybit documents it for derivatives only); only `publicTrade`
//! topics; a request with one bad arg is refused whole; error texts follow
//! Bybit's style but not every exact message.
//!
//! ## Binance diff depth ([`ExchangeShape::BinanceDepth`], [`ExchangeShape::BinanceFuturesDepth`])
//!
//! Modelled on Binance's spot "WebSocket Streams" page (Diff. Depth Stream,
//! "How to manage a local order book correctly") and "Market Data endpoints"
//! (Order book `GET /api/v3/depth`), and on the USD-M futures "Diff. Book Depth
//! Streams", "How to manage a local order book correctly" and "Order Book"
//! (`GET /fapi/v1/depth`) pages. Spot streams `/ws/<symbol>@depth` and
//! `/ws/<symbol>@depth@100ms`; futures `/ws/<symbol>@depth`, `@depth@500ms`
//! and `@depth@100ms`. Frames are `depthUpdate` events: spot
//! `{"e","E","s","U","u","b","a"}` with update ids contiguous per symbol
//! (a frame's `U` is the previous frame's `u` + 1); futures
//! `{"e","E","T","s","U","u","pu","b","a"}` whose ids are shared across
//! symbols on Binance, so here they advance by 1 to 7 per update and only
//! `pu` (the previous frame's `u`) chains them. `b` and `a` list
//! `["price","qty"]` decimal strings (spot 8 decimals for both; futures 2 for
//! prices, 3 for quantities), each price once with its absolute quantity,
//! `"0.00000000"` (`"0.000"`) removing the level. The REST snapshot
//! `{"lastUpdateId","bids","asks"}` (futures with `E` and `T` after
//! `lastUpdateId`) is the book as of the newest update due, which may sit
//! inside a frame not sent yet: Binance's rule (drop diffs whose `u` is at or
//! below `lastUpdateId`; the first kept one covers `lastUpdateId + 1`) is
//! what joins it to the diffs. `limit` is rounded up to Binance's values
//! (spot 5, 10, 20, 50, 100, 500, 1000, 5000, default 100; futures up to
//! 1000, default 500); `symbol` and `limit` are checked like the history's
//! parameters, and [`ExchangeConfig::history_status_override`] fails
//! snapshots as it fails history pages.
//!
//! The book is computed, not stored: [`ExchangeConfig::rate`] updates per
//! second per symbol, each setting one price level's quantity (one in eight
//! deletes it) on a grid of 200 levels a side, 0.10 apart around a mid price
//! of the symbol's own, so the book never crosses. Updates visit the levels
//! in cycles that set each level once, in an order drawn per symbol and
//! cycle, so the book after any update id is found in closed form (no fold,
//! no per-symbol cache, the same cost at any id);
//! [`ExchangeServer::book_at`] gives it, and folding the snapshot and the
//! diffs gives the same. A frame folds 1 to 5 consecutive updates and goes
//! out when its last one is due ([`ExchangeServer::head`] is that frame's
//! `u`). Simplified: one frame cadence set by the rate, whatever the stream
//! name's speed; the spot REST depth
//! takes only the listed `limit`s (Binance now takes any 1 to 5000); no
//! partial book depth streams (`@depth5`…); the futures `T` of a frame is its
//! last update's time and `E` up to 2 ms later.
//!
//! Both depth shapes also serve Binance's combined stream `GET /stream`
//! ([`ExchangeServer::combined_url`], [`ExchangeServer::worked_settings_shared`]):
//! streams subscribed on the socket with `{"method":"SUBSCRIBE","params":[…],"id":N}`
//! (and `UNSUBSCRIBE`, which stops them), answered `{"result":null,"id":N}`,
//! each frame wrapped `{"stream":"<name>","data":{…}}`. Like Binance it closes
//! (1008, with a reason) a connection that sends more than 5 messages in any
//! second (futures: 10; ping and pong frames count) or listens to more than
//! 1,024 streams ([`ExchangeServer::limit_closes`] counts them).
//!
//! ## Bybit order book, v5 spot ([`ExchangeShape::BybitOrderbook`])
//!
//! Modelled on Bybit's v5 "Connect" and "Orderbook" (WebSocket public) pages.
//! Endpoint `/v5/public/spot`; `{"op":"subscribe","args":["orderbook.50.<SYMBOL>"]}`
//! (and `unsubscribe`, which stops the topic's frames) acknowledged as for the
//! trade shape (`success`/`ret_msg`/`conn_id`/`req_id`/`op`). After every
//! subscribe: one `{"topic","type":"snapshot","ts","data":{"s","b","a","u","seq"},"cts"}`
//! holding the whole book (at most 50 levels a side), then `"type":"delta"`
//! frames holding the levels that changed, `["price","qty"]` strings (prices
//! with 2 decimals, quantities with 6), `"0"` removing a level. `u` is
//! contiguous per topic (a delta's `u` is the previous frame's + 1), `seq`
//! (the cross sequence) increases with holes, `cts` is the frame's matching
//! time and `ts` up to 2 ms later. A restart starts `u` over at 1, as Bybit
//! documents after a service restart. `{"op":"ping"}` answered with
//! `ret_msg":"pong"`, silent clients cut by
//! [`ExchangeConfig::silent_cut_after`]. The book is the depth shapes'
//! computed book on a 50-level grid (0.10 apart) and a frame folds 1 to 5
//! updates, so [`ExchangeServer::book_at`] with a `u` gives the book after
//! that frame and [`ExchangeServer::frame`] the delta with that `u`.
//! Simplified: only depth 50 (1, 200 and 1000 are refused as not modelled);
//! the snapshot is sent when the next frame is due (up to five updates'
//! time after the subscribe, never at once), as the book after that frame,
//! so its `u` is above every delta sent before the subscribe; no periodic
//! re-sent snapshots; a delta may remove a level that was not held (a
//! harmless no-op for a client); a request with one bad arg is refused whole.
//!
//! ## OKX order book, v5 public ([`ExchangeShape::OkxBooks`])
//!
//! Modelled on OKX's v5 API "WebSocket" overview (connect, `ping`/`pong`,
//! subscribe, unsubscribe, error events) and "Order book channel" (`books`,
//! its checksum and `seqId` rules). Endpoint `/ws/v5/public`;
//! `{"op":"subscribe","args":[{"channel":"books","instId":"BTC-USDT"}]}`
//! answered per arg with `{"event":"subscribe","arg":{…},"connId"}` (with the
//! request's `id` first when given); `unsubscribe` likewise, and it stops the
//! book's frames. Bad requests get `{"event":"error","code","msg","connId"}`
//! (60012 for a malformed request, 60018 for a channel or instrument that does
//! not exist) and the connection stays open. After every subscribe: one
//! `{"arg":{…},"action":"snapshot","data":[{"asks","bids","ts","checksum","prevSeqId":-1,"seqId"}]}`
//! holding the whole book (OKX sends 400 levels; here the book's up to 200),
//! then `"action":"update"` frames holding the levels that changed. Rows are
//! `["price","size","0","orders"]` strings (the third, liquidated orders, is
//! deprecated and always "0"), numbers without trailing zeros (`"27000.1"`,
//! `"27000"`, `"0.5"`), size `"0"` (with 0 orders) removing a level; `ts` is
//! a string of unix ms. `seqId` increases by 1 to 5 a frame (OKX's ids are
//! not contiguous) and every update's `prevSeqId` is the previous frame's
//! `seqId`. `checksum` is OKX's CRC32 of the book after the message: the best
//! 25 bids and asks interleaved `bid price:bid size:ask price:ask size:…`
//! (a side with fewer levels is left out where it runs out), joined by `:`,
//! as a signed 32-bit integer. [`ExchangeServer::corrupt_next_checksum`]
//! makes the next update sent carry a wrong one, once. The text `ping` is
//! answered with `pong`; OKX closes connections that stay silent 30 s, here a
//! client that sent no `ping` for [`ExchangeConfig::silent_cut_after`].
//! [`ExchangeServer::book_at`] with a `seqId` gives the book after that
//! frame, and [`ExchangeServer::frame`] the update whose
//! `(prevSeqId, seqId]` holds an id. Simplified: only `books` (`books5`,
//! `bbo-tbt`, `books-l2-tbt`… are refused as not modelled); no login, no
//! `channel-conn-count` events; the snapshot is sent when the next frame is
//! due, as for Bybit; no empty "no change" updates with `seqId` equal to
//! `prevSeqId` (OKX sends them after a long quiet spell; here the book
//! changes at the configured rate) and no `seqId` reset below `prevSeqId`
//! on a live connection (a restart cuts connections and starts `seqId` over
//! at 1); a subscribe to a book already followed is acknowledged and starts
//! it over with a new snapshot; an unsubscribe of a book not followed is
//! acknowledged; a request with one bad arg is refused whole.
//!
//! ## Coinbase order book, Advanced Trade `level2` ([`ExchangeShape::CoinbaseLevel2`])
//!
//! Modelled on Coinbase's Advanced Trade "WebSocket Overview" (one market-data
//! endpoint, `wss://advanced-trade-ws.coinbase.com`; a subscribe within 5 s
//! or the connection is closed) and its "Level 2 order book" channel page.
//! Endpoint `/`; `{"type":"subscribe","product_ids":["BTC-USD"],"channel":"level2"}`
//! (and `unsubscribe`, which stops the products' messages) answered with
//! `{"channel":"subscriptions","client_id":"","timestamp","sequence_num","events":[{"subscriptions":{"level2":[…]}}]}`
//! listing every product followed. After every subscribe: one
//! `{"channel":"l2_data","client_id":"","timestamp","sequence_num","events":[{"type":"snapshot","product_id","updates":[…]}]}`
//! holding the whole book (at most 200 levels a side), then `"type":"update"`
//! messages holding the levels that changed; each item is
//! `{"side":"bid"|"offer","event_time","price_level","new_quantity"}`,
//! prices with 2 decimals, quantities with 8, `new_quantity` `"0"` removing
//! the level (an absolute size, not a delta). `sequence_num` counts every
//! message the connection sends, the acknowledgements included, from 0 on
//! each connection: the acknowledgement goes out before the snapshot, so on
//! a connection following one product its `l2_data` messages are numbered
//! contiguously from 1 (and on from the next number after an unsubscribe
//! and a subscribe). The messages name no number of the book; the fake
//! numbers its frames `first_id + f` for [`ExchangeServer::book_at`],
//! [`ExchangeServer::frame`] (whose `sequence_num` is 0) and
//! [`ExchangeServer::head`]. `timestamp` and every `event_time` are the
//! frame's time, RFC 3339 with µs. Bad requests get
//! `{"type":"error","message"}` and the connection stays open; no subscribe
//! within 5 s closes it (1008). Simplified: only `level2` (`heartbeats`,
//! `ticker`, `market_trades`… are refused as not modelled); no JWT; one
//! product per message; the snapshot is sent when the next frame is due, as
//! for Bybit; a subscribe to a product already followed starts it over with
//! a new snapshot (the documentation does not say); no channel closes for
//! want of heartbeats.
//!
//! ## Kraken order book, WebSocket v2 ([`ExchangeShape::KrakenBook`])
//!
//! Modelled on Kraken's "Spot WebSocket v2" `book` page and its "Book
//! checksum (WebSocket v2)" guide. Endpoint `/v2`; a `status` frame on
//! connect; `{"method":"subscribe","params":{"channel":"book","symbol":["BTC/USD"],"depth":10},"req_id":N}`
//! (`depth` one of 10, 25, 100, 500, 1000, default 10; `snapshot` default
//! true) answered per symbol with
//! `{"method":"subscribe","result":{"channel":"book","depth","snapshot","symbol"},"success":true,"time_in","time_out"}`
//! (with `req_id` when given), then
//! `{"channel":"book","type":"snapshot","data":[{"symbol","bids","asks","checksum"}]}`
//! holding the best `depth` levels, then `"type":"update"` frames whose one
//! data item also carries `timestamp` (the frame's time, RFC 3339 with µs).
//! Levels are `{"price":…,"qty":…}` JSON numbers without trailing zeros
//! (`27000.1`, `27000`, `1.5`; the pair's precision is 1 and 8 decimals),
//! `"qty":0` removing a level. Kraken keeps a subscriber's book at the
//! subscribed depth: an update lists the levels of the best `depth` that
//! changed or came into it, and a removal for each level of it the frame
//! deleted, but a level pushed out of it by better ones is not removed (the
//! client truncates its book to the depth after each update) and a frame
//! that changed nothing within the depth is not sent. `checksum` is Kraken's
//! CRC32 (unsigned) of the book after the message: the best 10 asks, lowest
//! first, then the best 10 bids, highest first, each price and quantity at
//! the pair's decimals with the point and then the leading zeros removed,
//! whatever the depth. [`ExchangeServer::corrupt_next_checksum`] makes the
//! next update sent carry a wrong one, once. Frames carry no sequence at
//! all; the fake numbers its frames `first_id + f` for
//! [`ExchangeServer::book_at`] (the whole book: a subscriber's is its best
//! `depth` levels), [`ExchangeServer::frame`] (the update at depth 10, empty
//! when the frame changed nothing there) and [`ExchangeServer::head`]. `ping`,
//! `heartbeat` and error answers as for the trade shape; `unsubscribe` stops a
//! book and is answered with `result` `{"channel":"book","depth","symbol"}`.
//! Simplified: only `book` (`trade`, `level3`… are refused as not modelled);
//! the book has 25 levels a side, so depths above 25 get all of it; the
//! snapshot is sent when the next frame is due, as for Bybit; one symbol per
//! frame; a frame lists each level once (Kraken may list a price twice).

mod binance;
mod bybit;
mod coinbase;
mod coinbase_level2;
mod combined;
mod config;
mod depth;
mod inband;
mod kraken;
mod kraken_book;
mod model;
mod server;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::FeedError;
pub use config::{ExchangeConfig, ExchangeShape, HistoryOverride};
use server::Shared;

/// One side of an order book, best level first (bids highest, asks lowest):
/// `(price, quantity)` as the frames and the REST snapshot spell them.
pub type BookSide = Vec<(String, String)>;

/// A running exchange server.
#[derive(Debug)]
pub struct ExchangeServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ExchangeServer {
    /// Binds `addr` (port 0 in tests) and serves in a spawned task until
    /// `shutdown` is cancelled.
    pub async fn start(
        addr: SocketAddr,
        config: ExchangeConfig,
        shutdown: CancellationToken,
    ) -> Result<ExchangeServer, FeedError> {
        config.check()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| FeedError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| FeedError::Bind { addr, source })?;
        let shared = Arc::new(Shared::new(config, shutdown));
        let routes = match config.shape {
            ExchangeShape::BinanceTrade | ExchangeShape::BinanceAggTrade => {
                binance::routes(config.shape)
            }
            ExchangeShape::CoinbaseMatches => coinbase::routes(),
            ExchangeShape::KrakenTrade => kraken::routes(),
            ExchangeShape::BybitPublicTrade => bybit::routes(),
            ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth => {
                depth::routes(config.shape)
            }
            ExchangeShape::BybitOrderbook => inband::bybit_routes(),
            ExchangeShape::OkxBooks => inband::okx_routes(),
            ExchangeShape::CoinbaseLevel2 => coinbase_level2::routes(),
            ExchangeShape::KrakenBook => kraken_book::routes(),
        };
        let router: Router = routes
            .fallback(|| async { server::plain(StatusCode::NOT_FOUND, "not found") })
            .with_state(shared.clone());
        let task = tokio::spawn(server::accept_loop(listener, router, shared.clone()));
        tracing::info!(%local_addr, shape = %config.shape, rate = config.rate, "exchange server listening");
        Ok(ExchangeServer {
            local_addr,
            shared,
            task,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &ExchangeConfig {
        &self.shared.config
    }

    fn host(&self) -> SocketAddr {
        let mut addr = self.local_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr
    }

    /// The WebSocket URL, with `{stream_id}` where the exchange puts the
    /// symbol in the URL (Binance: `ws://HOST/ws/{stream_id}@trade`; the
    /// depth shapes `ws://HOST/ws/{stream_id}@depth@100ms`).
    pub fn ws_url(&self) -> String {
        let host = self.host();
        match self.shared.config.shape {
            ExchangeShape::BinanceTrade => format!("ws://{host}/ws/{{stream_id}}@trade"),
            ExchangeShape::BinanceAggTrade => format!("ws://{host}/ws/{{stream_id}}@aggTrade"),
            ExchangeShape::CoinbaseMatches | ExchangeShape::CoinbaseLevel2 => {
                format!("ws://{host}/")
            }
            ExchangeShape::KrakenTrade | ExchangeShape::KrakenBook => format!("ws://{host}/v2"),
            ExchangeShape::BybitPublicTrade | ExchangeShape::BybitOrderbook => {
                format!("ws://{host}/v5/public/spot")
            }
            ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth => {
                format!("ws://{host}/ws/{{stream_id}}@depth@100ms")
            }
            ExchangeShape::OkxBooks => format!("ws://{host}/ws/v5/public"),
        }
    }

    /// The REST order book snapshot URL template (`{stream_id_upper}`; the
    /// largest useful `limit`, 1,000: the book has at most 200 levels a
    /// side), for the depth shapes.
    pub fn snapshot_url(&self) -> Option<String> {
        let path = match self.shared.config.shape {
            ExchangeShape::BinanceDepth => "api/v3/depth",
            ExchangeShape::BinanceFuturesDepth => "fapi/v1/depth",
            _ => return None,
        };
        Some(format!(
            "http://{}/{path}?symbol={{stream_id_upper}}&limit=1000",
            self.host()
        ))
    }

    /// The REST history URL template (`{stream_id_upper}`, `{from_seq}`; a
    /// page of 1,000), for shapes that serve history with a retention.
    pub fn history_url(&self) -> Option<String> {
        let config = &self.shared.config;
        if !config.shape.serves_history() || config.history_retention == 0 {
            return None;
        }
        let path = match config.shape {
            ExchangeShape::BinanceAggTrade => "aggTrades",
            _ => "historicalTrades",
        };
        Some(format!(
            "http://{}/api/v3/{path}?symbol={{stream_id_upper}}&fromId={{from_seq}}&limit=1000",
            self.host()
        ))
    }

    /// The newest id served so far (the same for every symbol; `first_id - 1`
    /// before the first). For Bybit trades, the last id of the newest
    /// complete match package; for the Binance depth shapes, the update-id
    /// head: the last update id (`u`) of the newest frame due (the REST
    /// snapshot may already be a few updates further, inside the next frame);
    /// for the Bybit and OKX books, the id (`u`, `seqId`) of the newest frame
    /// due; for the Coinbase and Kraken books, the fake's number of it.
    pub fn head(&self, _symbol: &str) -> u64 {
        let timeline = self.shared.timeline();
        match self.shared.config.shape {
            ExchangeShape::BybitPublicTrade => bybit::complete_head(&timeline, timeline.head()),
            shape if shape.has_book() => depth::complete_head(&timeline, shape, timeline.head()),
            _ => timeline.head(),
        }
    }

    /// The exact order book of `symbol` after update id `update_id` (book
    /// shapes, in the shape's own numbering: Binance `u`, Bybit `u`, OKX
    /// `seqId`, for Coinbase and Kraken, whose frames name no id, the fake's
    /// `first_id + frame`; the whole book, of which a Kraken subscriber sees
    /// the best `depth` levels; the initial book before the first id, and for an id between
    /// two ids the book after the lower one): every level held, bids highest
    /// first, asks lowest first, `(price, quantity)` spelled as the frames and
    /// the snapshots spell them. Computed for any id, past or ahead of the
    /// head, of the current timeline (after a restart, the new one). Trade
    /// shapes have no book: two empty sides.
    pub fn book_at(&self, symbol: &str, update_id: u64) -> (BookSide, BookSide) {
        let shape = self.shared.config.shape;
        if !shape.has_book() {
            return (Vec::new(), Vec::new());
        }
        depth::book(
            &self.shared.timeline(),
            shape,
            &symbol.to_ascii_uppercase(),
            update_id,
        )
    }

    /// The oldest id the REST history serves now (`None`: it serves nothing).
    pub fn oldest_kept(&self) -> Option<u64> {
        if !self.shared.config.shape.serves_history() {
            return None;
        }
        let timeline = self.shared.timeline();
        binance::oldest_kept(&self.shared, &timeline, timeline.head())
    }

    /// The exact WebSocket frame that carries id `id` of `symbol`: Binance's
    /// trade or aggTrade frame, Coinbase's `match` (its `last_match` is the same
    /// with that type), Kraken's `update`, Bybit's package frame, the
    /// `depthUpdate` whose updates cover update id `id` (spot `U <= id <= u`,
    /// futures `pu < id <= u`), Bybit's order-book `delta` with `u = id`,
    /// OKX's `update` with `prevSeqId < id <= seqId` (with its true checksum;
    /// the snapshot a subscribe gets is not a `frame`), Coinbase's `l2_data`
    /// `update` of frame `id` (the fake's numbering) with `sequence_num` 0 (a
    /// connection numbers it), Kraken's `update` of frame `id` at depth 10
    /// (with empty `bids` and `asks` when it changed nothing in the best 10
    /// levels: that one is never sent). `symbol` as the
    /// frames spell it (Binance also takes the lower-case stream spelling).
    pub fn frame(&self, symbol: &str, id: u64) -> String {
        let timeline = &*self.shared.timeline();
        match self.shared.config.shape {
            shape @ (ExchangeShape::BinanceTrade | ExchangeShape::BinanceAggTrade) => {
                binance::frame(timeline, shape, &symbol.to_ascii_uppercase(), id)
            }
            ExchangeShape::CoinbaseMatches => coinbase::frame(timeline, symbol, id),
            ExchangeShape::KrakenTrade => kraken::frame(timeline, symbol, id),
            ExchangeShape::BybitPublicTrade => bybit::frame(timeline, symbol, id),
            shape @ (ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth) => {
                depth::frame(timeline, shape, &symbol.to_ascii_uppercase(), id)
            }
            shape @ (ExchangeShape::BybitOrderbook | ExchangeShape::OkxBooks) => {
                inband::frame(timeline, shape, &symbol.to_ascii_uppercase(), id)
            }
            ExchangeShape::CoinbaseLevel2 => coinbase_level2::frame(timeline, symbol, id),
            ExchangeShape::KrakenBook => kraken_book::frame(timeline, symbol, id),
        }
    }

    /// The exact REST history item of id `id` of `symbol` (Binance trade
    /// shapes).
    pub fn history_item(&self, symbol: &str, id: u64) -> Option<String> {
        let shape = self.shared.config.shape;
        shape.serves_history().then(|| {
            binance::history_item(
                &self.shared.timeline(),
                shape,
                &symbol.to_ascii_uppercase(),
                id,
            )
        })
    }

    /// The trade time of `id` in unix ms (Binance `T`, Bybit `T`; Coinbase and
    /// Kraken write the same instant as RFC 3339 with µs); for the book
    /// shapes, the time of the frame carrying update id `id` (spot `E`,
    /// futures `T`, Bybit `cts` (`ts` is up to 2 ms later), OKX `ts`,
    /// Coinbase `timestamp`, Kraken's update `timestamp`).
    pub fn ts_ms(&self, id: u64) -> u64 {
        let timeline = &*self.shared.timeline();
        match self.shared.config.shape {
            ExchangeShape::BybitPublicTrade => bybit::time_ms(timeline, id),
            shape if shape.has_book() => depth::time_ms(timeline, shape, id),
            _ => timeline.time_us(id) / 1000,
        }
    }

    /// Cuts every open connection now (see the module doc for how); returns
    /// how many.
    pub fn cut_all(&self) -> usize {
        self.shared.cut_all()
    }

    /// Imitates an exchange service restart: every open connection is cut
    /// (as by [`cut_all`](Self::cut_all); returns how many) and ids start
    /// over at 1 for every symbol, due at [`ExchangeConfig::rate`] from now
    /// with trade times from now. Connections opened afterwards stream the
    /// new ids, the REST history serves only them, and [`head`](Self::head),
    /// [`frame`](Self::frame), [`history_item`](Self::history_item),
    /// [`ts_ms`](Self::ts_ms) and [`oldest_kept`](Self::oldest_kept) answer
    /// for the new timeline. Order books start over from the initial book
    /// with update id 1 (the REST snapshot and [`book_at`](Self::book_at)
    /// answer for the new ids).
    pub fn restart(&self) -> usize {
        self.shared.restart()
    }

    /// Makes the next OKX or Kraken `update` frame sent, on whichever
    /// connection, carry a wrong checksum (exactly once; a snapshot is never corrupted,
    /// and a restart or a cut does not clear a pending one), so a client that
    /// checks checksums detects it on that update and resynchronises. The
    /// book and the ids are untouched: [`frame`](Self::frame) still gives the
    /// true frame. Returns false, changing nothing, for shapes without
    /// checksums ([`ExchangeShape::has_checksum`]).
    pub fn corrupt_next_checksum(&self) -> bool {
        if !self.shared.config.shape.has_checksum() {
            return false;
        }
        self.shared.corrupt_next_checksum();
        true
    }

    /// Restarts so far ([`restart`](Self::restart)).
    pub fn restarts(&self) -> u64 {
        self.shared.restarts()
    }

    /// Sends `frame` as it is to every open connection (a status frame, a
    /// bogus one); returns how many connections it went to.
    pub fn inject(&self, frame: &str) -> usize {
        self.shared.inject(frame)
    }

    /// Replaces the history override (`None` clears it).
    pub fn set_history_override(&self, value: Option<HistoryOverride>) {
        self.shared.set_history_override(value);
    }

    /// WebSocket connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted()
    }

    /// WebSocket connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_sessions()
    }

    /// Connections the server cut (cut_all, cut_every, silent clients).
    pub fn cuts(&self) -> u64 {
        self.shared.cuts()
    }

    /// WebSocket messages received from clients on every connection (text,
    /// binary, ping and pong frames).
    pub fn messages_received(&self) -> u64 {
        self.shared.messages()
    }

    /// Connections closed for breaking a limit (the combined stream's
    /// messages per second or streams per connection).
    pub fn limit_closes(&self) -> u64 {
        self.shared.limit_closes()
    }

    /// Binance's combined stream endpoint, `ws://HOST/stream`, for the depth
    /// shapes (`None` for the others).
    pub fn combined_url(&self) -> Option<String> {
        self.shared
            .config
            .shape
            .has_combined_stream()
            .then(|| format!("ws://{}/stream", self.host()))
    }

    /// The stream worker's settings for carrying `per_connection` streams on
    /// each connection to the combined endpoint ([`combined_url`](Self::combined_url)):
    /// the depth shape's [`worked_settings`](Self::worked_settings) with the
    /// frame pointers under `/data`, the subscribe and unsubscribe templates
    /// with `{stream_ids_json}` and routing by `/stream`. Empty for shapes
    /// without a combined endpoint.
    pub fn worked_settings_shared(&self, per_connection: usize) -> Vec<(&'static str, String)> {
        let Some(url) = self.combined_url() else {
            return Vec::new();
        };
        let mut settings: Vec<(&'static str, String)> = self
            .worked_settings()
            .into_iter()
            .filter_map(|(name, value)| match name {
                "UPSTREAM_URL" | "UPSTREAM_SUBSCRIBE" => None,
                "UPSTREAM_SEQ_POINTER"
                | "UPSTREAM_SEQ_FIRST_POINTER"
                | "UPSTREAM_SEQ_PREV_POINTER"
                | "UPSTREAM_ID_POINTER"
                | "UPSTREAM_TS_POINTER"
                | "UPSTREAM_DATA_MATCH" => Some((name, format!("/data{value}"))),
                _ => Some((name, value)),
            })
            .collect();
        let mut set = |name: &'static str, value: &str| settings.push((name, value.to_owned()));
        set("UPSTREAM_URL", &url);
        set(
            "UPSTREAM_SUBSCRIBE",
            r#"{"method":"SUBSCRIBE","params":{stream_ids_json},"id":{request_id}}"#,
        );
        set(
            "UPSTREAM_UNSUBSCRIBE",
            r#"{"method":"UNSUBSCRIBE","params":{stream_ids_json},"id":{request_id}}"#,
        );
        set(
            "UPSTREAM_STREAMS_PER_CONNECTION",
            &per_connection.to_string(),
        );
        set("UPSTREAM_ROUTE_POINTER", "/stream");
        set("UPSTREAM_ROUTE_TEMPLATE", "{stream_id}@depth@100ms");
        set("UPSTREAM_SUBSCRIBE_BATCH", "200");
        // Binance closes a connection over 5 messages a second, pings and
        // pongs included: 3 leaves room for the worker's ping and a pong.
        set("UPSTREAM_SUBSCRIBES_PER_SECOND", "3");
        settings
    }

    /// History and order-book snapshot requests answered (overridden ones
    /// included).
    pub fn history_requests(&self) -> u64 {
        self.shared.history_requests()
    }

    /// The leasehold environment a user would set for this shape (the
    /// worker's variable names; stream ids like
    /// [`ExchangeShape::example_stream_id`]).
    pub fn worked_settings(&self) -> Vec<(&'static str, String)> {
        let config = &self.shared.config;
        let mut settings: Vec<(&'static str, String)> = vec![("UPSTREAM_URL", self.ws_url())];
        let mut set = |name: &'static str, value: &str| settings.push((name, value.to_owned()));
        // Kraken, Bybit and OKX clients ping; often enough that a silent cut
        // never hits.
        let ping_ms = config
            .silent_cut_after
            .map_or(10_000, |d| (d.as_millis() / 2).clamp(1, 10_000));
        match config.shape {
            shape @ (ExchangeShape::BinanceTrade | ExchangeShape::BinanceAggTrade) => {
                let (id, event, item_id, item_ts) = match shape {
                    ExchangeShape::BinanceAggTrade => ("/a", "aggTrade", "/a", "/T"),
                    _ => ("/t", "trade", "/id", "/time"),
                };
                set("UPSTREAM_SUBSCRIBE", "");
                set("UPSTREAM_SEQ_POINTER", id);
                set("UPSTREAM_ID_POINTER", id);
                set("UPSTREAM_TS_POINTER", "/T");
                set("UPSTREAM_SEQ_STEP", "contiguous");
                set("UPSTREAM_DATA_MATCH", &format!("/e={event}"));
                match self.history_url() {
                    Some(url) => {
                        set("UPSTREAM_RESUME", "backfill");
                        set("UPSTREAM_BACKFILL_URL", &url);
                        set("UPSTREAM_BACKFILL_ITEMS_POINTER", "");
                        set("UPSTREAM_BACKFILL_SEQ_POINTER", item_id);
                        set("UPSTREAM_BACKFILL_ID_POINTER", item_id);
                        set("UPSTREAM_BACKFILL_TS_POINTER", item_ts);
                    }
                    None => set("UPSTREAM_RESUME", "live"),
                }
            }
            ExchangeShape::CoinbaseMatches => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"type":"subscribe","product_ids":["{stream_id}"],"channels":["matches","heartbeat"]}"#,
                );
                // trade_id is contiguous per product (sequence, with holes,
                // would be /sequence with UPSTREAM_SEQ_STEP=increasing).
                set("UPSTREAM_SEQ_POINTER", "/trade_id");
                set("UPSTREAM_ID_POINTER", "/trade_id");
                set("UPSTREAM_RESUME", "live");
                set("UPSTREAM_SEQ_STEP", "contiguous");
                set("UPSTREAM_DATA_MATCH", "/type=match,/type=last_match");
            }
            ExchangeShape::KrakenTrade => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"method":"subscribe","params":{"channel":"trade","symbol":["{stream_id}"],"snapshot":false}}"#,
                );
                // One sequence per frame: a frame of several trades is a hole.
                set("UPSTREAM_SEQ_POINTER", "/data/0/trade_id");
                set("UPSTREAM_ID_POINTER", "/data/0/trade_id");
                set("UPSTREAM_RESUME", "live");
                set("UPSTREAM_SEQ_STEP", "increasing");
                set("UPSTREAM_DATA_MATCH", "/channel=trade");
                set("UPSTREAM_PING_TEXT", r#"{"method":"ping"}"#);
                set("UPSTREAM_PING_INTERVAL_MS", &ping_ms.to_string());
            }
            shape @ (ExchangeShape::BinanceDepth | ExchangeShape::BinanceFuturesDepth) => {
                set("UPSTREAM_SUBSCRIBE", "");
                set("UPSTREAM_RESUME", "snapshot");
                // A diff covers U..=u; futures state the previous diff's u.
                set("UPSTREAM_SEQ_POINTER", "/u");
                match shape {
                    ExchangeShape::BinanceFuturesDepth => {
                        set("UPSTREAM_SEQ_PREV_POINTER", "/pu");
                        set("UPSTREAM_TS_POINTER", "/T");
                    }
                    _ => {
                        set("UPSTREAM_SEQ_FIRST_POINTER", "/U");
                        set("UPSTREAM_TS_POINTER", "/E");
                    }
                }
                set("UPSTREAM_SEQ_STEP", "increasing");
                set("UPSTREAM_ID_POINTER", "/u");
                set("UPSTREAM_DATA_MATCH", "/e=depthUpdate");
                if let Some(url) = self.snapshot_url() {
                    set("UPSTREAM_SNAPSHOT_URL", &url);
                }
                set("UPSTREAM_SNAPSHOT_SEQ_POINTER", "/lastUpdateId");
            }
            ExchangeShape::BybitOrderbook => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"op":"subscribe","args":["orderbook.50.{stream_id}"]}"#,
                );
                // Unsubscribe then subscribe asks for a new snapshot.
                set(
                    "UPSTREAM_UNSUBSCRIBE",
                    r#"{"op":"unsubscribe","args":["orderbook.50.{stream_id}"]}"#,
                );
                set("UPSTREAM_RESUME", "snapshot");
                set("UPSTREAM_SNAPSHOT_MATCH", "/type=snapshot");
                set("UPSTREAM_DATA_MATCH", "/type=snapshot,/type=delta");
                // u is contiguous per topic (and 1 again after a restart, on
                // a snapshot).
                set("UPSTREAM_SEQ_POINTER", "/data/u");
                set("UPSTREAM_ID_POINTER", "/data/u");
                set("UPSTREAM_SEQ_STEP", "contiguous");
                set("UPSTREAM_TS_POINTER", "/ts");
                set("UPSTREAM_PING_TEXT", r#"{"op":"ping"}"#);
                set("UPSTREAM_PING_INTERVAL_MS", &ping_ms.to_string());
            }
            ExchangeShape::OkxBooks => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"op":"subscribe","args":[{"channel":"books","instId":"{stream_id}"}]}"#,
                );
                set(
                    "UPSTREAM_UNSUBSCRIBE",
                    r#"{"op":"unsubscribe","args":[{"channel":"books","instId":"{stream_id}"}]}"#,
                );
                set("UPSTREAM_RESUME", "snapshot");
                set("UPSTREAM_SNAPSHOT_MATCH", "/action=snapshot");
                set("UPSTREAM_DATA_MATCH", "/action=snapshot,/action=update");
                // seqId has holes; an update names the one before it.
                set("UPSTREAM_SEQ_POINTER", "/data/0/seqId");
                set("UPSTREAM_SEQ_PREV_POINTER", "/data/0/prevSeqId");
                set("UPSTREAM_ID_POINTER", "/data/0/seqId");
                set("UPSTREAM_SEQ_STEP", "increasing");
                set("UPSTREAM_BOOK_CHECKSUM", "okx");
                // ts is a string of ms: no UPSTREAM_TS_POINTER (the worker
                // reads a number there).
                set("UPSTREAM_PING_TEXT", "ping");
                set("UPSTREAM_PING_INTERVAL_MS", &ping_ms.to_string());
            }
            ExchangeShape::CoinbaseLevel2 => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"type":"subscribe","product_ids":["{stream_id}"],"channel":"level2"}"#,
                );
                set(
                    "UPSTREAM_UNSUBSCRIBE",
                    r#"{"type":"unsubscribe","product_ids":["{stream_id}"],"channel":"level2"}"#,
                );
                set("UPSTREAM_RESUME", "snapshot");
                set("UPSTREAM_SNAPSHOT_MATCH", "/events/0/type=snapshot");
                set("UPSTREAM_DATA_MATCH", "/channel=l2_data");
                // sequence_num counts the connection's messages from 0 (the
                // acknowledgements too): contiguous within a connection, a
                // new count on each; the event id is that sequence.
                set("UPSTREAM_SEQ_POINTER", "/sequence_num");
                set("UPSTREAM_SEQ_SCOPE", "connection");
                set("UPSTREAM_SEQ_STEP", "contiguous");
                set("UPSTREAM_ID_POINTER", "none");
                // timestamp is RFC 3339: no UPSTREAM_TS_POINTER.
            }
            ExchangeShape::KrakenBook => {
                let depth = kraken_book::DEFAULT_DEPTH;
                set(
                    "UPSTREAM_SUBSCRIBE",
                    &format!(
                        r#"{{"method":"subscribe","params":{{"channel":"book","symbol":["{{stream_id}}"],"depth":{depth}}}}}"#
                    ),
                );
                set(
                    "UPSTREAM_UNSUBSCRIBE",
                    &format!(
                        r#"{{"method":"unsubscribe","params":{{"channel":"book","symbol":["{{stream_id}}"],"depth":{depth}}}}}"#
                    ),
                );
                set("UPSTREAM_RESUME", "snapshot");
                set("UPSTREAM_SNAPSHOT_MATCH", "/type=snapshot");
                set("UPSTREAM_DATA_MATCH", "/channel=book");
                // No sequence and no id in the frames: the worker numbers them.
                set("UPSTREAM_SEQ_POINTER", "none");
                set("UPSTREAM_ID_POINTER", "none");
                set("UPSTREAM_BOOK_CHECKSUM", "kraken");
                // Kraken does not remove levels pushed below the subscribed
                // depth, and its JSON numbers lose the trailing zeros its
                // checksum counts.
                set("UPSTREAM_BOOK_DEPTH", &depth.to_string());
                set(
                    "UPSTREAM_BOOK_PRECISION",
                    &format!(
                        "{},{}",
                        kraken_book::PRICE_DECIMALS,
                        kraken_book::QTY_DECIMALS
                    ),
                );
                set("UPSTREAM_PING_TEXT", r#"{"method":"ping"}"#);
                set("UPSTREAM_PING_INTERVAL_MS", &ping_ms.to_string());
            }
            ExchangeShape::BybitPublicTrade => {
                set(
                    "UPSTREAM_SUBSCRIBE",
                    r#"{"op":"subscribe","args":["publicTrade.{stream_id}"]}"#,
                );
                set("UPSTREAM_SEQ_POINTER", "/data/0/seq");
                set("UPSTREAM_ID_POINTER", "/data/0/i");
                set("UPSTREAM_TS_POINTER", "/data/0/T");
                set("UPSTREAM_RESUME", "live");
                set("UPSTREAM_SEQ_STEP", "increasing");
                // The topic names the symbol; every data frame is a snapshot.
                set("UPSTREAM_DATA_MATCH", "/type=snapshot");
                set("UPSTREAM_PING_TEXT", r#"{"op":"ping"}"#);
                set("UPSTREAM_PING_INTERVAL_MS", &ping_ms.to_string());
            }
        }
        settings
    }

    /// Waits until the server task ended (after shutdown is cancelled),
    /// including every connection it served.
    pub async fn finished(self) {
        if let Err(error) = self.task.await {
            tracing::error!(%error, "exchange server task failed");
        }
    }
}

#[cfg(test)]
mod tests;
