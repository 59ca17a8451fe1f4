//! How each exchange spells a book message, from its public API
//! documentation. Every format but Kraken v2 sends prices and quantities as
//! strings, read from a `serde_json::Value`; Kraken v2 sends JSON numbers,
//! read as raw text so no digit goes through a float.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{BookError, BookMessage, Change, Decimal, MessageKind, SequenceRange, Side};

/// How an exchange spells order-book messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BookFormat {
    /// Binance spot and USD-M futures: the REST snapshot (`lastUpdateId`)
    /// and `depthUpdate` diffs (`U`, `u`, futures `pu`), bare or in a
    /// combined-stream envelope.
    Binance,
    /// Bybit v5 `orderbook.N.SYMBOL`: `snapshot` and `delta`.
    Bybit,
    /// Coinbase Advanced Trade `level2` (messages on channel `l2_data`).
    Coinbase,
    /// Kraken WebSocket v1 `book`: array frames, checksum `c` on updates.
    KrakenV1,
    /// Kraken WebSocket v2 `book`: prices and quantities as JSON numbers.
    KrakenV2,
    /// OKX v5 `books*` channels: `snapshot` and `update`, `seqId`, checksum.
    Okx,
}

impl BookFormat {
    /// Every value, as the setting spells it.
    pub const ALL: [BookFormat; 6] = [
        BookFormat::Binance,
        BookFormat::Bybit,
        BookFormat::Coinbase,
        BookFormat::KrakenV1,
        BookFormat::KrakenV2,
        BookFormat::Okx,
    ];

    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            BookFormat::Binance => "binance",
            BookFormat::Bybit => "bybit",
            BookFormat::Coinbase => "coinbase",
            BookFormat::KrakenV1 => "kraken_v1",
            BookFormat::KrakenV2 => "kraken_v2",
            BookFormat::Okx => "okx",
        }
    }

    /// The format a setting value names.
    pub fn parse(value: &str) -> Option<BookFormat> {
        BookFormat::ALL.into_iter().find(|f| f.as_str() == value)
    }

    /// The format under which `body` is a book message (snapshot or diff);
    /// `None` for anything else, heartbeats included.
    pub fn detect(body: &[u8]) -> Option<BookFormat> {
        let value: Value = serde_json::from_slice(body).ok()?;
        BookFormat::ALL
            .into_iter()
            .find(|format| matches!(format.read_value(body, &value), Ok(Some(_))))
    }

    /// Reads one frame body: `None` when it is not a book message.
    pub fn read_message(self, body: &[u8]) -> Result<Option<BookMessage>, BookError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| BookError::json(&e))?;
        self.read_value(body, &value)
    }

    /// The sequence numbers of a book message, where the format has them
    /// (the whole message is read: a reader calls it once per entry).
    pub fn sequence_range(self, body: &[u8]) -> Result<Option<SequenceRange>, BookError> {
        Ok(self
            .read_message(body)?
            .and_then(|message| message.sequence))
    }

    fn read_value(self, body: &[u8], value: &Value) -> Result<Option<BookMessage>, BookError> {
        match self {
            BookFormat::Binance => binance(value),
            BookFormat::Bybit => bybit(value),
            BookFormat::Coinbase => coinbase(value),
            BookFormat::KrakenV1 => kraken_v1(value),
            BookFormat::KrakenV2 => kraken_v2(body, value),
            BookFormat::Okx => okx(value),
        }
    }
}

fn bad(format: BookFormat, field: &'static str) -> BookError {
    BookError::BadField { format, field }
}

fn decimal(text: &str, field: &'static str) -> Result<Decimal, BookError> {
    Decimal::parse(text).ok_or(BookError::BadNumber { field })
}

fn text<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
    value.get(key).and_then(Value::as_str)
}

fn message(kind: MessageKind, instrument: Option<&str>) -> BookMessage {
    BookMessage {
        kind,
        instrument: instrument.map(str::to_owned),
        changes: Vec::new(),
        checksum: None,
        sequence: None,
    }
}

fn single(last: u64, prev: Option<u64>) -> Option<SequenceRange> {
    Some(SequenceRange {
        first: last,
        last,
        prev,
    })
}

/// Appends `[price, quantity, …]` string rows (an absent side is empty).
fn rows(
    format: BookFormat,
    value: &Value,
    field: &'static str,
    side: Side,
    changes: &mut Vec<Change>,
) -> Result<(), BookError> {
    let Some(rows) = value.get(field) else {
        return Ok(());
    };
    let rows = rows.as_array().ok_or(bad(format, field))?;
    for row in rows {
        let Some([Value::String(price), Value::String(qty), ..]) =
            row.as_array().map(Vec::as_slice)
        else {
            return Err(bad(format, field));
        };
        changes.push(change(side, price, qty, field)?);
    }
    Ok(())
}

fn number(format: BookFormat, value: &Value, field: &'static str) -> Result<u64, BookError> {
    value
        .get(field)
        .and_then(Value::as_u64)
        .ok_or(bad(format, field))
}

fn change(side: Side, price: &str, qty: &str, field: &'static str) -> Result<Change, BookError> {
    Ok(Change {
        side,
        price: decimal(price, field)?,
        qty: decimal(qty, field)?,
    })
}

fn binance(value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::Binance;
    let value = match (value.get("stream"), value.get("data")) {
        (Some(_), Some(data)) => data,
        _ => value,
    };
    if value.get("lastUpdateId").is_some() {
        let mut book = message(MessageKind::Snapshot, None);
        book.sequence = single(number(F, value, "lastUpdateId")?, None);
        rows(F, value, "bids", Side::Bid, &mut book.changes)?;
        rows(F, value, "asks", Side::Ask, &mut book.changes)?;
        return Ok(Some(book));
    }
    if text(value, "e") != Some("depthUpdate") {
        return Ok(None);
    }
    let mut book = message(MessageKind::Diff, text(value, "s"));
    let (first, last) = (number(F, value, "U")?, number(F, value, "u")?);
    let prev = value.get("pu").and_then(Value::as_u64);
    book.sequence = Some(SequenceRange { first, last, prev });
    rows(F, value, "b", Side::Bid, &mut book.changes)?;
    rows(F, value, "a", Side::Ask, &mut book.changes)?;
    Ok(Some(book))
}

fn bybit(value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::Bybit;
    if !text(value, "topic").is_some_and(|topic| topic.starts_with("orderbook.")) {
        return Ok(None);
    }
    let kind = match text(value, "type") {
        Some("snapshot") => MessageKind::Snapshot,
        Some("delta") => MessageKind::Diff,
        _ => return Err(bad(F, "type")),
    };
    let data = value.get("data").ok_or(bad(F, "data"))?;
    let mut book = message(kind, text(data, "s"));
    // `u` restarts at 1 after a service restart, always on a snapshot: the
    // snapshot replaces the book, so nothing here depends on it increasing.
    book.sequence = single(number(F, data, "u")?, None);
    rows(F, data, "b", Side::Bid, &mut book.changes)?;
    rows(F, data, "a", Side::Ask, &mut book.changes)?;
    Ok(Some(book))
}

fn coinbase(value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::Coinbase;
    if text(value, "channel") != Some("l2_data") {
        return Ok(None);
    }
    let events = value.get("events").and_then(Value::as_array);
    let events = events.ok_or(bad(F, "events"))?;
    let mut book: Option<BookMessage> = None;
    for event in events {
        let kind = match text(event, "type") {
            Some("snapshot") => MessageKind::Snapshot,
            Some("update") => MessageKind::Diff,
            _ => return Err(bad(F, "type")),
        };
        let product = text(event, "product_id");
        match &book {
            Some(_) if kind == MessageKind::Snapshot => {
                return Err(bad(F, "events"));
            }
            Some(book) if book.instrument.as_deref() != product => {
                return Err(BookError::MixedInstruments);
            }
            _ => {}
        }
        let book = book.get_or_insert_with(|| message(kind, product));
        let updates = event.get("updates").and_then(Value::as_array);
        let updates = updates.ok_or(bad(F, "updates"))?;
        for update in updates {
            let side = match text(update, "side") {
                Some("bid") => Side::Bid,
                Some("offer" | "ask") => Side::Ask,
                _ => return Err(bad(F, "side")),
            };
            let (price, qty) = (text(update, "price_level"), text(update, "new_quantity"));
            let (Some(price), Some(qty)) = (price, qty) else {
                return Err(bad(F, "updates"));
            };
            book.changes.push(change(side, price, qty, "updates")?);
        }
    }
    if let Some(book) = &mut book {
        book.sequence = single(number(F, value, "sequence_num")?, None);
    }
    Ok(book)
}

fn kraken_v1(value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::KrakenV1;
    // [channelID, {…}, ({…},) "book-N", "PAIR"]; every other array frame is
    // another channel and every object frame an event (heartbeat, status).
    let Some([_, objects @ .., Value::String(channel), Value::String(pair)]) =
        value.as_array().map(Vec::as_slice)
    else {
        return Ok(None);
    };
    let Some(head) = objects.first().filter(|_| channel.starts_with("book")) else {
        return Ok(None);
    };
    let snapshot = head.get("as").is_some() || head.get("bs").is_some();
    let (kind, asks, bids) = match snapshot {
        true => (MessageKind::Snapshot, "as", "bs"),
        false => (MessageKind::Diff, "a", "b"),
    };
    let mut book = message(kind, Some(pair));
    for object in objects {
        rows(F, object, asks, Side::Ask, &mut book.changes)?;
        rows(F, object, bids, Side::Bid, &mut book.changes)?;
        if let Some(checksum) = object.get("c") {
            let checksum = checksum.as_str().and_then(|c| c.parse::<u32>().ok());
            let checksum = checksum.ok_or(bad(F, "c"))?;
            book.checksum = Some(checksum.into());
        }
    }
    Ok(Some(book))
}

#[derive(Deserialize)]
struct KrakenV2Frame<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    data: Vec<KrakenV2Entry<'a>>,
}

#[derive(Deserialize)]
struct KrakenV2Entry<'a> {
    symbol: String,
    #[serde(default, borrow)]
    bids: Vec<KrakenV2Level<'a>>,
    #[serde(default, borrow)]
    asks: Vec<KrakenV2Level<'a>>,
    checksum: Option<u32>,
}

#[derive(Deserialize)]
struct KrakenV2Level<'a> {
    #[serde(borrow)]
    price: &'a RawValue,
    #[serde(borrow)]
    qty: &'a RawValue,
}

fn kraken_v2(body: &[u8], value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::KrakenV2;
    if text(value, "channel") != Some("book") || value.get("data").is_none() {
        return Ok(None);
    }
    let frame: KrakenV2Frame<'_> = serde_json::from_slice(body).map_err(|e| BookError::json(&e))?;
    let kind = match frame.kind.as_str() {
        "snapshot" => MessageKind::Snapshot,
        "update" => MessageKind::Diff,
        _ => return Err(bad(F, "type")),
    };
    let mut book: Option<BookMessage> = None;
    for entry in &frame.data {
        if book
            .as_ref()
            .is_some_and(|b| b.instrument.as_deref() != Some(&entry.symbol))
        {
            return Err(BookError::MixedInstruments);
        }
        let book = book.get_or_insert_with(|| message(kind, Some(&entry.symbol)));
        for (levels, side, field) in [
            (&entry.bids, Side::Bid, "bids"),
            (&entry.asks, Side::Ask, "asks"),
        ] {
            for level in levels {
                let (price, qty) = (
                    plain_decimal(level.price.get()),
                    plain_decimal(level.qty.get()),
                );
                let (Some(price), Some(qty)) = (price, qty) else {
                    return Err(BookError::BadNumber { field });
                };
                book.changes.push(change(side, &price, &qty, field)?);
            }
        }
        book.checksum = entry.checksum.map(i64::from).or(book.checksum);
    }
    Ok(book)
}

/// A JSON number's text (or a quoted one) as plain digits: `1.5e-3` →
/// `0.0015`. `None` for an exponent too large to be a price.
pub(super) fn plain_decimal(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let raw = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(raw);
    let Some((mantissa, exponent)) = raw.split_once(['e', 'E']) else {
        return Some(raw.to_owned());
    };
    let exponent: i64 = exponent.parse().ok().filter(|e: &i64| e.abs() <= 64)?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let point = i64::try_from(int.len()).ok()? + exponent;
    let len = i64::try_from(digits.len()).ok()?;
    Some(if point <= 0 {
        format!("0.{}{digits}", "0".repeat(usize::try_from(-point).ok()?))
    } else if point >= len {
        format!("{digits}{}", "0".repeat(usize::try_from(point - len).ok()?))
    } else {
        let (whole, rest) = digits.split_at(usize::try_from(point).ok()?);
        format!("{whole}.{rest}")
    })
}

fn okx(value: &Value) -> Result<Option<BookMessage>, BookError> {
    const F: BookFormat = BookFormat::Okx;
    let Some(arg) = value.get("arg") else {
        return Ok(None);
    };
    // Acknowledgements and errors carry `event`; `bbo-tbt` and others are
    // not book channels.
    if value.get("event").is_some() || !text(arg, "channel").is_some_and(|c| c.starts_with("books"))
    {
        return Ok(None);
    }
    let kind = match text(value, "action") {
        Some("snapshot") | None => MessageKind::Snapshot, // books5 pushes whole books, no action
        Some("update") => MessageKind::Diff,
        Some(_) => return Err(bad(F, "action")),
    };
    let data = value.get("data").and_then(Value::as_array);
    let data = data.ok_or(bad(F, "data"))?;
    let mut book = message(kind, text(arg, "instId"));
    for entry in data {
        rows(F, entry, "asks", Side::Ask, &mut book.changes)?;
        rows(F, entry, "bids", Side::Bid, &mut book.changes)?;
        // OKX announced (21 May 2026) that from 23 June 2026 the field stays
        // but is always 0: a zero is "no checksum", not a mismatch.
        book.checksum = entry
            .get("checksum")
            .and_then(Value::as_i64)
            .filter(|&c| c != 0)
            .or(book.checksum);
        if let Some(seq) = entry.get("seqId").and_then(Value::as_u64) {
            // A snapshot's prevSeqId is -1: nothing before it.
            book.sequence = single(seq, entry.get("prevSeqId").and_then(Value::as_u64));
        }
    }
    Ok(Some(book))
}
