//! The CRC32 checksums exchanges send with book messages, recomputed from a
//! [`Book`] exactly as their documentation describes.

use super::{Book, BookFormat, Decimal};

/// Which checksum the upstream sends (`UPSTREAM_BOOK_CHECKSUM`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ChecksumRule {
    /// No checksum is checked.
    #[default]
    None,
    /// Kraken (v1 `c`, v2 `checksum`): CRC32 over the top 10 asks ascending
    /// then the top 10 bids descending, each price and quantity with the
    /// `.` removed and leading zeros stripped; unsigned.
    Kraken,
    /// OKX `books`: CRC32 over the top 25 levels interleaved
    /// `bid_price:bid_size:ask_price:ask_size:…`; signed 32-bit.
    Okx,
}

/// A pair's decimals (Kraken's `price_precision` and `qty_precision`):
/// Kraken v2 sends JSON numbers, which lose trailing zeros its checksum
/// counts, so they are put back to this many places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Precision {
    /// Decimal places of a price.
    pub price_decimals: u32,
    /// Decimal places of a quantity.
    pub qty_decimals: u32,
}

impl ChecksumRule {
    /// Every value, as `UPSTREAM_BOOK_CHECKSUM` spells it.
    pub const ALL: [ChecksumRule; 3] =
        [ChecksumRule::None, ChecksumRule::Kraken, ChecksumRule::Okx];

    /// The `UPSTREAM_BOOK_CHECKSUM` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumRule::None => "none",
            ChecksumRule::Kraken => "kraken",
            ChecksumRule::Okx => "okx",
        }
    }

    /// The rule `UPSTREAM_BOOK_CHECKSUM` names.
    pub fn parse(value: &str) -> Option<ChecksumRule> {
        ChecksumRule::ALL.into_iter().find(|r| r.as_str() == value)
    }

    /// Whether messages of `format` carry this rule's checksum.
    pub fn applies_to(self, format: BookFormat) -> bool {
        match self {
            ChecksumRule::None => true,
            ChecksumRule::Kraken => matches!(format, BookFormat::KrakenV1 | BookFormat::KrakenV2),
            ChecksumRule::Okx => format == BookFormat::Okx,
        }
    }

    /// The checksum of `book` in the exchange's spelling (`None` for
    /// [`ChecksumRule::None`]). `precision` reformats Kraken v2 numbers.
    pub fn compute(self, book: &Book, precision: Option<Precision>) -> Option<i64> {
        match self {
            ChecksumRule::None => None,
            ChecksumRule::Kraken => Some(kraken(book, precision).into()),
            ChecksumRule::Okx => Some(okx(book).into()),
        }
    }
}

fn kraken(book: &Book, precision: Option<Precision>) -> u32 {
    let mut text = String::new();
    for (price, qty) in book.asks().take(10).chain(book.bids().take(10)) {
        push_kraken(&mut text, price, precision.map(|p| p.price_decimals));
        push_kraken(&mut text, qty, precision.map(|p| p.qty_decimals));
    }
    crc32fast::hash(text.as_bytes())
}

fn push_kraken(text: &mut String, value: &Decimal, decimals: Option<u32>) {
    let fixed = decimals.map(|places| at_decimals(value.as_str(), places));
    let digits = fixed.as_deref().unwrap_or(value.as_str());
    text.extend(
        digits
            .chars()
            .filter(|&c| c != '.')
            .skip_while(|&c| c == '0'),
    );
}

/// `text` with exactly `places` decimals when it has no more significant
/// ones. Significant digits beyond `places` are kept: a wrong precision then
/// shows as a mismatch instead of being rounded into a false match.
pub(super) fn at_decimals(text: &str, places: u32) -> String {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let frac = frac.trim_end_matches('0');
    let width = usize::try_from(places)
        .unwrap_or(usize::MAX)
        .max(frac.len());
    if width == 0 {
        int.to_owned()
    } else {
        format!("{int}.{frac:0<width$}")
    }
}

fn okx(book: &Book) -> i32 {
    let mut text = String::new();
    let (mut bids, mut asks) = (book.bids().take(25), book.asks().take(25));
    loop {
        let (bid, ask) = (bids.next(), asks.next());
        if bid.is_none() && ask.is_none() {
            break;
        }
        for (price, qty) in bid.into_iter().chain(ask) {
            for part in [price.as_str(), qty.as_str()] {
                if !text.is_empty() {
                    text.push(':');
                }
                text.push_str(part);
            }
        }
    }
    // OKX documents the CRC32 as a signed 32-bit integer: the same bits.
    crc32fast::hash(text.as_bytes()).cast_signed()
}
