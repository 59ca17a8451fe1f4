//! What every shape shares: when each id is due and what time it carries, the
//! trade behind an id, how ids group into aggregates or match packages, and the
//! number, time and id formats exchanges write.
//!
//! Everything here is a pure function of `(symbol, id)` and the server's start,
//! so nothing is stored and a test can recompute any frame.

use std::time::Duration;

use leasehold_platform::clock::SystemClock;

use tokio::time::Instant;

/// When each id is due: ids advance at `rate` per second from the server's
/// start, the first being `first_id` (so a server that just started has no id
/// at all and its head is `first_id - 1`). The same for every symbol. A
/// restart replaces the server's timeline with a new one from 1.
#[derive(Debug)]
pub(super) struct Timeline {
    start: Instant,
    start_unix_us: u64,
    rate: f64,
    first_id: u64,
}

impl Timeline {
    /// `first_id` is at least 1 (checked by the caller).
    pub(super) fn new(rate: f64, first_id: u64) -> Timeline {
        let start_unix_us = SystemClock.now_us();
        Timeline {
            start: Instant::now(),
            start_unix_us,
            rate,
            first_id,
        }
    }

    pub(super) fn first_id(&self) -> u64 {
        self.first_id
    }

    /// The newest id due at `now` (`first_id - 1` before the first).
    pub(super) fn head_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        // `as` saturates, which is the right answer for absurd rates.
        (self.first_id - 1).saturating_add((elapsed * self.rate).floor() as u64)
    }

    pub(super) fn head(&self) -> u64 {
        self.head_at(Instant::now())
    }

    /// When `id` is due; `None` when too far away to represent.
    fn due(&self, id: u64) -> Option<Instant> {
        let ordinal = id.saturating_sub(self.first_id).saturating_add(1);
        let offset = Duration::try_from_secs_f64(ordinal as f64 / self.rate).ok()?;
        self.start.checked_add(offset)
    }

    /// When to look again for `id`. Float rounding can put the due time a hair
    /// before the head moves: never spin on it.
    pub(super) fn wake(&self, id: u64, now: Instant) -> Instant {
        match self.due(id) {
            Some(due) if due > now => due,
            Some(_) => now + Duration::from_millis(1),
            None => now + Duration::from_secs(3600),
        }
    }

    /// The unix time, in µs, `id` carries.
    pub(super) fn time_us(&self, id: u64) -> u64 {
        let ordinal = id.saturating_sub(self.first_id).saturating_add(1);
        let offset = (ordinal as f64 * 1e6 / self.rate).round() as u64;
        self.start_unix_us.saturating_add(offset)
    }
}

/// The trade behind an id: a price around a level of the symbol's own, a size,
/// and which side rested.
#[derive(Debug, Clone, Copy)]
pub(super) struct Trade {
    /// Price in hundredths (every shape prices to the cent).
    pub(super) price_cents: u64,
    /// Quantity in units of 1e-8.
    pub(super) qty_e8: u64,
    /// The buyer's order was resting, so the taker sold.
    pub(super) buyer_maker: bool,
    /// Spare pseudo-random bits for shape-specific details.
    pub(super) mix: u64,
}

impl Trade {
    /// The taker's side, lower case (`buy` / `sell`).
    pub(super) fn taker_side(&self) -> &'static str {
        if self.buyer_maker { "sell" } else { "buy" }
    }

    /// Price × quantity in units of 1e-8.
    pub(super) fn quote_e8(&self) -> u128 {
        u128::from(self.price_cents) * u128::from(self.qty_e8) / 100
    }
}

/// The hash of a symbol, spelled as the frames spell it.
pub(super) fn symbol_hash(symbol: &str) -> u64 {
    crate::fnv1a(symbol.as_bytes())
}

/// Pseudo-random bits for `(symbol, id)`; `salt` keeps uses independent.
pub(super) fn mix(symbol_hash: u64, id: u64, salt: u64) -> u64 {
    crate::splitmix64(symbol_hash ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt)
}

pub(super) fn trade(symbol_hash: u64, id: u64) -> Trade {
    let bits = mix(symbol_hash, id, 0);
    // A level between 1,000.00 and 61,000.00 per symbol, ±100.00 per trade.
    let level = 100_000 + symbol_hash % 6_000_000;
    Trade {
        price_cents: level - 10_000 + bits % 20_001,
        qty_e8: 1_000 + (bits >> 20) % 50_000_000,
        buyer_maker: bits >> 63 == 1,
        mix: mix(symbol_hash, id, 1),
    }
}

/// A sequence that strictly increases with `k` and has holes of 0 to 6 between
/// neighbours: `base + 4k + (0..4)`, as a sequence shared with events a client
/// does not see looks.
pub(super) fn holey(base: u64, symbol_hash: u64, k: u64) -> u64 {
    base.saturating_add(k.saturating_mul(4))
        .saturating_add(mix(symbol_hash, k, 2) % 4)
}

/// Where each of eight consecutive groups (aggregate trades, match packages)
/// starts: sizes 1, 3, 1, 2, 1, 1, 4, 2, irregular but with a closed form both
/// ways.
const GROUP_PREFIX: [u64; 9] = [0, 1, 4, 5, 7, 8, 9, 13, 15];

/// The first member (0-based) of group `k` (0-based).
pub(super) fn group_start(k: u64) -> u64 {
    group_start_in(&GROUP_PREFIX, k)
}

/// The group (0-based) member `i` (0-based) belongs to.
pub(super) fn group_of(i: u64) -> u64 {
    group_of_in(&GROUP_PREFIX, i)
}

/// [`group_start`] for another table of eight group sizes: `prefix` holds
/// where each of the eight groups starts, then their total (the period).
pub(super) fn group_start_in(prefix: &[u64; 9], k: u64) -> u64 {
    prefix[8].saturating_mul(k / 8) + prefix[(k % 8) as usize]
}

/// [`group_of`] for another table (see [`group_start_in`]).
pub(super) fn group_of_in(prefix: &[u64; 9], i: u64) -> u64 {
    let period = prefix[8];
    let within = i % period;
    let index = prefix[..8]
        .iter()
        .rposition(|&start| start <= within)
        .unwrap_or(0) as u64;
    8 * (i / period) + index
}

/// `units / 10^scale` with exactly `places` decimals (truncated or padded).
pub(super) fn fixed(units: u128, scale: u32, places: u32) -> String {
    let divisor = 10u128.pow(scale);
    let whole = units / divisor;
    let fraction = units % divisor;
    if places == 0 {
        return whole.to_string();
    }
    let fraction = if places >= scale {
        fraction * 10u128.pow(places - scale)
    } else {
        fraction / 10u128.pow(scale - places)
    };
    format!("{whole}.{fraction:0width$}", width = places as usize)
}

/// `units / 10^scale` without trailing zeros (`"0.00123"`, `"42"`): valid as a
/// JSON number.
pub(super) fn trimmed(units: u128, scale: u32) -> String {
    let text = fixed(units, scale, scale);
    if !text.contains('.') {
        return text;
    }
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// RFC 3339 with microseconds, UTC: `2023-09-25T07:48:36.925533Z`.
pub(super) fn rfc3339_us(unix_us: u64) -> String {
    let secs = unix_us / 1_000_000;
    let micros = unix_us % 1_000_000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The wall clock, for acknowledgements' own times (`time_in`, `time_out`).
pub(super) fn now_us() -> u64 {
    SystemClock.now_us()
}

/// Days since 1970-01-01 to a proleptic Gregorian date (the civil-from-days
/// algorithm: eras of 400 years, years starting in March).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// A version-4-looking UUID built from two hashes (order ids, connection ids).
pub(super) fn uuid(a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// `text` as a JSON string literal, quotes included: anything a client sent
/// that is echoed back goes through this.
pub(super) fn json_str(text: &str) -> String {
    // Serialising a str cannot fail; the fallback keeps the frame valid JSON.
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP_SIZES: [u64; 8] = [1, 3, 1, 2, 1, 1, 4, 2];

    #[test]
    fn groups_partition_the_members_in_order() {
        let mut expected_group = 0;
        for i in 0..200u64 {
            let k = group_of(i);
            assert!(group_start(k) <= i && i < group_start(k + 1), "member {i}");
            if i == group_start(k) && i > 0 {
                expected_group += 1;
            }
            assert_eq!(k, expected_group);
        }
        assert_eq!(GROUP_SIZES.iter().sum::<u64>(), GROUP_PREFIX[8]);
        for (k, size) in GROUP_SIZES.iter().enumerate() {
            assert_eq!(GROUP_PREFIX[k + 1] - GROUP_PREFIX[k], *size);
        }
    }

    #[test]
    fn numbers_and_times_format_like_exchanges() {
        assert_eq!(fixed(4_321_057, 2, 8), "43210.57000000");
        assert_eq!(fixed(123_000, 8, 8), "0.00123000");
        assert_eq!(fixed(123_456, 8, 2), "0.00");
        assert_eq!(trimmed(123_000, 8), "0.00123");
        assert_eq!(trimmed(4_200_000_000, 8), "42");
        assert_eq!(trimmed(0, 8), "0");
        assert_eq!(rfc3339_us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339_us(951_782_400_000_001),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            rfc3339_us(1_695_628_116_925_533),
            "2023-09-25T07:48:36.925533Z"
        );
        let id = uuid(u64::MAX, 0);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }

    #[test]
    fn holey_sequences_strictly_increase() {
        let mut previous = None;
        for k in 0..1000 {
            let seq = holey(10, 77, k);
            if let Some(previous) = previous {
                assert!(seq > previous);
                assert!(seq - previous <= 7);
            }
            previous = Some(seq);
        }
    }
}
