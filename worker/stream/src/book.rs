//! Order books without I/O: how each exchange spells a book message, the
//! book kept exactly, and the checksums exchanges send to prove it.
//!
//! The shape, from the wire inwards:
//! - [`BookFormat`] reads one frame body into a [`BookMessage`] (a snapshot
//!   or a diff: ordered [`Change`]s, the exchange's checksum and sequence if
//!   it sends them), or into nothing for a heartbeat, an acknowledgement or
//!   any other frame that is not a book message. [`BookFormat::detect`]
//!   names the format of a body by its shape.
//! - [`Book`] holds bids and asks as the decimal strings received, ordered by
//!   value through [`Decimal`]: a float would change the digits a checksum is
//!   computed from, and `0.1` and `0.10` must be one price level. A snapshot
//!   replaces the book, a diff sets levels, a zero quantity removes one.
//! - [`ChecksumRule`] (`UPSTREAM_BOOK_CHECKSUM`) recomputes Kraken's or OKX's
//!   CRC32 from the book.
//! - [`BookKeeper`] is what the worker holds per stream: frame in, [`Verdict`]
//!   out. It never resets itself: after a mismatch the worker asks for a
//!   resync and calls [`BookKeeper::reset`].
//! - Readers rebuild a book from stored entries with [`Book::rebuild`]: the
//!   latest snapshot at or before a position, then the diffs after it. Which
//!   diffs follow a snapshot (Binance: `u` > `lastUpdateId`) is the sink's
//!   business; [`BookFormat::sequence_range`] exposes the numbers.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

mod checksum;
mod format;
#[cfg(test)]
mod tests;

pub use checksum::{ChecksumRule, Precision};
pub use format::BookFormat;

/// A non-negative decimal number kept as the exchange wrote it; compared by
/// value, so `"1.50"` equals `"01.5"`.
#[derive(Debug, Clone)]
pub struct Decimal(Box<str>);

impl Decimal {
    /// `text` if it is digits with at most one `.` (no sign, no exponent).
    pub fn parse(text: &str) -> Option<Decimal> {
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        let valid = !(int.is_empty() && frac.is_empty()) && digits(int) && digits(frac);
        valid.then(|| Decimal(text.into()))
    }

    /// The text as received.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the value is zero, however it is spelled.
    pub fn is_zero(&self) -> bool {
        self.0.bytes().all(|b| b == b'0' || b == b'.')
    }

    /// Integer digits without leading zeros, fraction without trailing ones:
    /// two values are equal exactly when these are.
    fn significant(&self) -> (&str, &str) {
        let (int, frac) = self.0.split_once('.').unwrap_or((&self.0, ""));
        (int.trim_start_matches('0'), frac.trim_end_matches('0'))
    }
}

impl Ord for Decimal {
    fn cmp(&self, other: &Decimal) -> Ordering {
        let (int, frac) = self.significant();
        let (other_int, other_frac) = other.significant();
        // Without leading zeros a longer integer part is a larger number;
        // fractions compare digit by digit, a missing digit being zero.
        int.len()
            .cmp(&other_int.len())
            .then_with(|| int.cmp(other_int))
            .then_with(|| frac.cmp(other_frac))
    }
}

impl PartialOrd for Decimal {
    fn partial_cmp(&self, other: &Decimal) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Decimal {
    fn eq(&self, other: &Decimal) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Decimal {}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which side of the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Buyers: best is highest.
    Bid,
    /// Sellers: best is lowest.
    Ask,
}

/// One price level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// The price.
    pub price: Decimal,
    /// The quantity resting at it.
    pub qty: Decimal,
}

/// One level as a message sets it (a zero quantity removes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The side it is on.
    pub side: Side,
    /// The price.
    pub price: Decimal,
    /// The new quantity (absolute, not a delta).
    pub qty: Decimal,
}

/// Whether a message replaces the book or changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// The whole book (to the depth the exchange sends).
    Snapshot,
    /// Level changes on top of the book kept so far.
    Diff,
}

/// The exchange's sequence numbers on a message, where it sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SequenceRange {
    /// First update the message covers (Binance `U`; else `last`).
    pub first: u64,
    /// Last update the message covers (Binance `u` or `lastUpdateId`, Bybit
    /// `u`, Coinbase `sequence_num`, OKX `seqId`).
    pub last: u64,
    /// The `last` of the message before it (Binance futures `pu`, OKX
    /// `prevSeqId`), when the exchange chains them.
    pub prev: Option<u64>,
}

/// One book message, in the exchange's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookMessage {
    /// Snapshot or diff.
    pub kind: MessageKind,
    /// The symbol, pair or product the message names, if it names one.
    pub instrument: Option<String>,
    /// Levels set, in order: a later change of a price wins.
    pub changes: Vec<Change>,
    /// The checksum the exchange computed after this message (Kraken as
    /// unsigned, OKX as signed 32-bit).
    pub checksum: Option<i64>,
    /// Sequence numbers, where the format has them.
    pub sequence: Option<SequenceRange>,
}

/// Why a frame could not be read as a book message. Never holds a body or
/// a value from one, only what was wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookError {
    /// The body is not JSON of the expected shape.
    #[error("frame is not usable JSON ({reason}, column {column})")]
    Json {
        /// What serde_json found wrong.
        reason: &'static str,
        /// Where.
        column: usize,
    },
    /// A field is missing or not of the shape the exchange documents (a
    /// level that is not `[price, quantity, …]` strings, a sequence that is
    /// not an unsigned integer, a `type` no documentation names).
    #[error("{}: `{field}` is missing or not of the documented shape", format.as_str())]
    BadField {
        /// The format read.
        format: BookFormat,
        /// The field.
        field: &'static str,
    },
    /// A price or quantity is not a plain non-negative decimal.
    #[error("a price or quantity in `{field}` is not a decimal number")]
    BadNumber {
        /// The field holding it.
        field: &'static str,
    },
    /// One frame carries book messages of several instruments.
    #[error("one frame holds book messages of several instruments")]
    MixedInstruments,
    /// A diff came while the keeper had no snapshot (first frame, or after
    /// a reset): it cannot be applied to anything.
    #[error("a diff arrived before any snapshot")]
    NoSnapshot,
    /// [`Book::rebuild`] was given something other than a snapshot first.
    #[error("the first body is not a snapshot")]
    NotSnapshot,
    /// The checksum rule cannot check this format's messages.
    #[error("checksum rule {rule} does not apply to format {format}")]
    RuleNotForFormat {
        /// The rule's name.
        rule: &'static str,
        /// The format's name.
        format: &'static str,
    },
    /// Kraken v2 sends numbers without trailing zeros, so its checksum needs
    /// the pair's decimals to put them back.
    #[error("kraken_v2 with the kraken checksum needs the pair's price and quantity decimals")]
    PrecisionRequired,
}

impl BookError {
    fn json(error: &serde_json::Error) -> BookError {
        let reason = match error.classify() {
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Eof => "truncated",
            serde_json::error::Category::Data => "unexpected shape",
            serde_json::error::Category::Io => "read error",
        };
        BookError::Json {
            reason,
            column: error.column(),
        }
    }
}

/// Bids and asks, each price once, best first when read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    bids: BTreeMap<Decimal, Decimal>,
    asks: BTreeMap<Decimal, Decimal>,
    depth: Option<usize>,
}

impl Book {
    /// An empty book that keeps every level.
    pub fn new() -> Book {
        Book::default()
    }

    /// An empty book that keeps `depth` levels a side: Kraken stops sending
    /// removals for levels pushed past the subscribed depth, so a book that
    /// kept them would later show them again and its checksum would drift.
    pub fn with_depth(depth: usize) -> Book {
        Book {
            depth: Some(depth),
            ..Book::default()
        }
    }

    /// Replays stored bodies: `snapshot`, then each diff in order (bodies
    /// that are not book messages are skipped).
    pub fn rebuild<B: AsRef<[u8]>>(
        format: BookFormat,
        depth: Option<usize>,
        snapshot: &[u8],
        diffs: impl IntoIterator<Item = B>,
    ) -> Result<Book, BookError> {
        let first = format.read_message(snapshot)?;
        let snapshot = first
            .filter(|m| m.kind == MessageKind::Snapshot)
            .ok_or(BookError::NotSnapshot)?;
        let mut book = depth.map_or_else(Book::new, Book::with_depth);
        book.apply(&snapshot);
        for body in diffs {
            if let Some(message) = format.read_message(body.as_ref())? {
                book.apply(&message);
            }
        }
        Ok(book)
    }

    /// A snapshot replaces the book, a diff sets its levels; then the book is
    /// cut to its depth.
    pub fn apply(&mut self, message: &BookMessage) {
        if message.kind == MessageKind::Snapshot {
            self.clear();
        }
        for change in &message.changes {
            self.set(change.side, change.price.clone(), change.qty.clone());
        }
        if let Some(depth) = self.depth {
            self.truncate(depth);
        }
    }

    /// Sets one level; a zero quantity removes it.
    pub fn set(&mut self, side: Side, price: Decimal, qty: Decimal) {
        let levels = match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        // Removed first: an insert over an equal key keeps the old key, and
        // the spelling last received is the one a checksum is computed from.
        levels.remove(&price);
        if !qty.is_zero() {
            levels.insert(price, qty);
        }
    }

    /// Drops every level beyond `depth` on each side (the worst ones).
    pub fn truncate(&mut self, depth: usize) {
        while self.bids.len() > depth {
            self.bids.pop_first();
        }
        while self.asks.len() > depth {
            self.asks.pop_last();
        }
    }

    /// Forgets every level.
    pub fn clear(&mut self) {
        self.bids.clear();
        self.asks.clear();
    }

    /// Bids, highest first.
    pub fn bids(&self) -> impl ExactSizeIterator<Item = (&Decimal, &Decimal)> {
        self.bids.iter().rev()
    }

    /// Asks, lowest first.
    pub fn asks(&self) -> impl ExactSizeIterator<Item = (&Decimal, &Decimal)> {
        self.asks.iter()
    }

    /// The highest bid.
    pub fn best_bid(&self) -> Option<Level> {
        self.bids().next().map(level)
    }

    /// The lowest ask.
    pub fn best_ask(&self) -> Option<Level> {
        self.asks().next().map(level)
    }

    /// The best `depth` bids and asks, best first.
    pub fn top(&self, depth: usize) -> (Vec<Level>, Vec<Level>) {
        (
            self.bids().take(depth).map(level).collect(),
            self.asks().take(depth).map(level).collect(),
        )
    }

    /// Whether both sides are empty.
    pub fn is_empty(&self) -> bool {
        self.bids.is_empty() && self.asks.is_empty()
    }
}

fn level((price, qty): (&Decimal, &Decimal)) -> Level {
    Level {
        price: price.clone(),
        qty: qty.clone(),
    }
}

/// What a frame did to the book a [`BookKeeper`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A snapshot replaced the book (and matched its checksum, if it had one).
    Snapshot,
    /// A diff was applied (and the book matched its checksum, if it had one).
    Applied,
    /// The message was applied, but the book no longer matches the checksum
    /// the exchange sent: a diff was lost or garbled. The book is kept as is
    /// until [`BookKeeper::reset`].
    ChecksumMismatch {
        /// The exchange's checksum.
        expected: i64,
        /// The keeper's.
        computed: i64,
    },
    /// Not a book message (heartbeat, acknowledgement, another channel).
    NotBook,
}

/// How a [`BookKeeper`] keeps its book.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeeperOptions {
    /// Levels a side to keep, the subscribed depth (`None`: all).
    pub depth: Option<usize>,
    /// The pair's decimals, for Kraken v2 checksums.
    pub precision: Option<Precision>,
}

/// One stream's book, fed frame by frame, checked where the exchange sends
/// checksums.
#[derive(Debug, Clone)]
pub struct BookKeeper {
    format: BookFormat,
    rule: ChecksumRule,
    precision: Option<Precision>,
    book: Book,
    has_snapshot: bool,
}

impl BookKeeper {
    /// A keeper with an empty book, waiting for a snapshot. Refuses a rule
    /// that cannot check the format, and Kraken v2 checks without precision
    /// (both would report a mismatch on every message).
    pub fn new(
        format: BookFormat,
        rule: ChecksumRule,
        options: KeeperOptions,
    ) -> Result<BookKeeper, BookError> {
        if !rule.applies_to(format) {
            return Err(BookError::RuleNotForFormat {
                rule: rule.as_str(),
                format: format.as_str(),
            });
        }
        if format == BookFormat::KrakenV2
            && rule == ChecksumRule::Kraken
            && options.precision.is_none()
        {
            return Err(BookError::PrecisionRequired);
        }
        let book = options.depth.map_or_else(Book::new, Book::with_depth);
        Ok(BookKeeper {
            format,
            rule,
            precision: options.precision,
            book,
            has_snapshot: false,
        })
    }

    /// Reads one frame body and applies it if it is a book message.
    pub fn on_frame(&mut self, body: &[u8]) -> Result<Verdict, BookError> {
        match self.format.read_message(body)? {
            Some(message) => self.on_message(&message),
            None => Ok(Verdict::NotBook),
        }
    }

    /// Applies a message already read (a router that split frames by
    /// instrument calls this).
    pub fn on_message(&mut self, message: &BookMessage) -> Result<Verdict, BookError> {
        if message.kind == MessageKind::Diff && !self.has_snapshot {
            return Err(BookError::NoSnapshot);
        }
        self.book.apply(message);
        self.has_snapshot = true;
        if let Some(expected) = message.checksum
            && let Some(computed) = self.rule.compute(&self.book, self.precision)
            && computed != expected
        {
            return Ok(Verdict::ChecksumMismatch { expected, computed });
        }
        Ok(match message.kind {
            MessageKind::Snapshot => Verdict::Snapshot,
            MessageKind::Diff => Verdict::Applied,
        })
    }

    /// Forgets the book; diffs are refused until the next snapshot.
    pub fn reset(&mut self) {
        self.book.clear();
        self.has_snapshot = false;
    }

    /// The book as kept so far.
    pub fn book(&self) -> &Book {
        &self.book
    }

    /// The format it reads.
    pub fn format(&self) -> BookFormat {
        self.format
    }
}
