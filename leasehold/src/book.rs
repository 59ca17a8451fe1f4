//! `leasehold book STREAM_ID`: an order book rebuilt from the sink at one
//! entry, as docs/redis.md ("Rebuilding a book at any entry id") describes:
//! the latest snapshot entry at or before the position, then every later diff
//! up to it, in order. A gap marker or reset entry on the way means the book
//! there is not known, and the command says so instead of printing a wrong one.

use anyhow::anyhow;
use clap::Args;
use leasehold_control::protocol::EntryId;
use leasehold_platform::settings::{ConfigError, Env, process_env};
use leasehold_sink::memory::StoredEvent;
use leasehold_sink::redis::RedisSink;
use leasehold_sink::url::{SinkUrl, redis_address};
use leasehold_sink::{SinkError, SinkOptions};
use leasehold_stream::book::{Book, BookFormat, Level};
use leasehold_stream::settings::SINK_URL;

use crate::Failure;

/// `leasehold book`: reads `SINK_URL` (a Redis or Redis Cluster sink).
#[derive(Debug, Args)]
pub(crate) struct BookArgs {
    /// Stream id.
    stream_id: String,
    /// Entry id `<fence token>-<seq>` to rebuild the book at [default: the stream's last entry]
    #[arg(long, value_name = "ENTRY_ID", value_parser = parse_entry_id)]
    at: Option<EntryId>,
    /// Price levels printed a side.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    depth: u32,
    /// How the stored bodies spell the book: binance, bybit, coinbase,
    /// kraken_v1, kraken_v2 or okx [default: detected from the snapshot's body]
    #[arg(long, value_name = "FORMAT", value_parser = parse_format)]
    format: Option<BookFormat>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `<token>-<seq>`, both unsigned integers: the full entry id.
fn parse_entry_id(text: &str) -> Result<EntryId, String> {
    text.split_once('-')
        .and_then(|(token, seq)| {
            let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
            (digits(token) && digits(seq)).then_some(())?;
            Some(EntryId {
                token: token.parse().ok()?,
                seq: seq.parse().ok()?,
            })
        })
        .ok_or_else(|| "expected a full entry id `<fence token>-<seq>`, e.g. 7-1042".to_owned())
}

fn parse_format(text: &str) -> Result<BookFormat, String> {
    BookFormat::parse(text).ok_or_else(|| format!("expected one of {}", format_names()))
}

fn format_names() -> String {
    BookFormat::ALL.map(BookFormat::as_str).join(", ")
}

fn entry_id(entry: &StoredEvent) -> EntryId {
    EntryId {
        token: entry.fence_token,
        seq: entry.seq,
    }
}

fn show(id: EntryId) -> String {
    format!("{}-{}", id.token, id.seq)
}

/// A book rebuilt at one entry, with where it came from.
#[derive(Debug)]
struct Rebuilt {
    at: EntryId,
    snapshot: EntryId,
    diffs_applied: usize,
    format: BookFormat,
    book: Book,
}

/// Runs `leasehold book`.
pub(crate) async fn book(args: BookArgs) -> Result<(), Failure> {
    let url = sink_url()?;
    let where_ = match SinkUrl::parse(&url) {
        Ok(SinkUrl::RedisCluster(nodes)) => format!(
            "the Redis Cluster at {}",
            nodes.first().map_or_else(String::new, |n| redis_address(n))
        ),
        _ => format!("Redis at {}", redis_address(&url)),
    };
    let stream = &args.stream_id;
    let read_failed = |err: SinkError| -> Failure {
        match err {
            SinkError::Config(problem) => ConfigError::one(format!("SINK_URL: {problem}")).into(),
            SinkError::Unavailable(reason) => {
                anyhow!("cannot read stream {stream:?} from the sink ({where_}): {reason}").into()
            }
            SinkError::Rejected(reason) => {
                anyhow!("the sink ({where_}) refused the read of stream {stream:?}: {reason}")
                    .into()
            }
            other => {
                anyhow!("cannot read stream {stream:?} from the sink ({where_}): {other}").into()
            }
        }
    };
    let sink = RedisSink::connect(&url, SinkOptions::default())
        .await
        .map_err(&read_failed)?;
    let entries = sink.stored(stream).await.map_err(&read_failed)?;
    let rebuilt = rebuild(stream, &entries, args.at, args.format)?;
    let depth = usize::try_from(args.depth).unwrap_or(usize::MAX);
    if args.json {
        println!("{}", render_json(stream, &rebuilt, depth));
    } else {
        print!("{}", render_text(stream, &rebuilt, depth));
    }
    Ok(())
}

/// `SINK_URL`, required, and a Redis: `memory:` lives inside another process.
fn sink_url() -> Result<String, ConfigError> {
    let mut env = Env::new(&process_env);
    let url = env.required(
        &SINK_URL,
        "by `leasehold book` (redis://…, rediss://… or redis+cluster://…)",
    );
    if let Some(url) = &url
        && SinkUrl::parse(url) == Ok(SinkUrl::Memory)
    {
        env.problem(
            SINK_URL.name,
            "memory: is an in-process sink that only its own process can read; `leasehold book` reads a Redis sink",
        );
    }
    env.finish(url.unwrap_or_default())
}

/// The book at `at` (default: the last entry) from a stream's entries in
/// stream order. Every refusal is one line naming the entry concerned.
fn rebuild(
    stream: &str,
    entries: &[StoredEvent],
    at: Option<EntryId>,
    format: Option<BookFormat>,
) -> anyhow::Result<Rebuilt> {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return Err(anyhow!(
            "stream {stream:?} has no entries in the sink (key {})",
            leasehold_sink::keys::sink_stream(stream)
        ));
    };
    let position = match at {
        None => entries.len() - 1,
        Some(id) => entries
            .iter()
            .position(|entry| entry_id(entry) == id)
            .ok_or_else(|| {
                anyhow!(
                    "entry {} is not in stream {stream:?} (it holds {} to {}, {} entries)",
                    show(id),
                    show(entry_id(first)),
                    show(entry_id(last)),
                    entries.len()
                )
            })?,
    };
    let at = entry_id(&entries[position]);
    // The guard: no snapshot at or before the position, no book.
    let Some(start) = entries[..=position]
        .iter()
        .rposition(|entry| entry.snapshot)
    else {
        return Err(anyhow!(
            "no snapshot entry at or before {} in stream {stream:?} (none written yet, or trimmed away): the book there cannot be rebuilt",
            show(at)
        ));
    };
    let snapshot = &entries[start];
    let snapshot_id = entry_id(snapshot);
    let after = &entries[start + 1..=position];
    let marker = after
        .iter()
        .find_map(|entry| match (entry.gap, entry.reset) {
            (Some(gap), _) => Some(format!(
                "gap marker {} (sequences {}..={} missing, reason {})",
                show(entry_id(entry)),
                gap.from,
                entry.seq,
                gap.reason.as_str()
            )),
            (None, Some(reset)) => Some(format!(
                "reset entry {} (the upstream's sequence started over at {})",
                show(entry_id(entry)),
                reset.to
            )),
            (None, None) => None,
        });
    if let Some(marker) = marker {
        return Err(anyhow!(
            "the book at {} in stream {stream:?} is not known: {marker} comes after snapshot {} (the book is unknown from a marker until the next snapshot)",
            show(at),
            show(snapshot_id)
        ));
    }
    let body = snapshot.payload.as_bytes();
    let format = match format.or_else(|| BookFormat::detect(body)) {
        Some(format) => format,
        None => {
            return Err(anyhow!(
                "cannot tell the book format of snapshot entry {}; pass --format ({})",
                show(snapshot_id),
                format_names()
            ));
        }
    };
    let is_snapshot = format
        .read_message(body)
        .map_err(|err| anyhow!("snapshot entry {}: {err}", show(snapshot_id)))?
        .is_some_and(|message| message.kind == leasehold_stream::book::MessageKind::Snapshot);
    if !is_snapshot {
        return Err(anyhow!(
            "snapshot entry {} is not a {} book snapshot",
            show(snapshot_id),
            format.as_str()
        ));
    }
    // Entries that are not book messages (acknowledgements, heartbeats) are
    // skipped; a book message that cannot be read stops the rebuild.
    let mut diffs = Vec::with_capacity(after.len());
    for entry in after {
        let message = format
            .read_message(entry.payload.as_bytes())
            .map_err(|err| anyhow!("entry {}: {err}", show(entry_id(entry))))?;
        if message.is_some() {
            diffs.push(entry.payload.as_bytes());
        }
    }
    let book = Book::rebuild(format, None, body, &diffs)
        .map_err(|err| anyhow!("rebuilding from snapshot {}: {err}", show(snapshot_id)))?;
    Ok(Rebuilt {
        at,
        snapshot: snapshot_id,
        diffs_applied: diffs.len(),
        format,
        book,
    })
}

fn pair(level: &Level) -> serde_json::Value {
    serde_json::json!([level.price.as_str(), level.qty.as_str()])
}

/// One object, its keys in the documented order, one key a line (each
/// value compact: a side's levels stay on one line).
fn render_json(stream: &str, rebuilt: &Rebuilt, depth: usize) -> String {
    let (bids, asks) = rebuilt.book.top(depth);
    let levels = |side: &[Level]| serde_json::Value::from_iter(side.iter().map(pair));
    let fields = [
        ("stream_id", serde_json::json!(stream)),
        ("at", serde_json::json!(show(rebuilt.at))),
        ("snapshot", serde_json::json!(show(rebuilt.snapshot))),
        ("diffs_applied", serde_json::json!(rebuilt.diffs_applied)),
        ("bids", levels(&bids)),
        ("asks", levels(&asks)),
        (
            "best_bid",
            serde_json::json!(rebuilt.book.best_bid().as_ref().map(pair)),
        ),
        (
            "best_ask",
            serde_json::json!(rebuilt.book.best_ask().as_ref().map(pair)),
        ),
    ];
    let lines: Vec<String> = fields
        .iter()
        .map(|(key, value)| format!("  \"{key}\": {value}"))
        .collect();
    format!("{{\n{}\n}}", lines.join(",\n"))
}

/// A header line, then the asks from the highest shown down to the best,
/// the spread, and the bids from the best down.
fn render_text(stream: &str, rebuilt: &Rebuilt, depth: usize) -> String {
    let book = &rebuilt.book;
    let (bids, asks) = book.top(depth);
    let mut out = format!(
        "{stream} at {}: snapshot {} + {} diff{} applied ({}); {} of {} bids, {} of {} asks\n",
        show(rebuilt.at),
        show(rebuilt.snapshot),
        rebuilt.diffs_applied,
        if rebuilt.diffs_applied == 1 { "" } else { "s" },
        rebuilt.format.as_str(),
        bids.len(),
        book.bids().len(),
        asks.len(),
        book.asks().len(),
    );
    let price_width = bids
        .iter()
        .chain(&asks)
        .map(|level| level.price.as_str().len())
        .chain(["price".len()])
        .max()
        .unwrap_or_default();
    let mut line = |side: &str, price: &str, qty: &str| {
        out.push_str(format!("{side:<6} {price:>price_width$}  {qty}").trim_end());
        out.push('\n');
    };
    line("", "price", "quantity");
    if asks.is_empty() {
        line("ask", "-", "(no asks)");
    }
    for level in asks.iter().rev() {
        line("ask", level.price.as_str(), level.qty.as_str());
    }
    let spread = match (book.best_bid(), book.best_ask()) {
        (Some(bid), Some(ask)) => {
            spread(bid.price.as_str(), ask.price.as_str()).unwrap_or_else(|| "?".to_owned())
        }
        _ => "-".to_owned(),
    };
    line("spread", &spread, "");
    for level in &bids {
        line("bid", level.price.as_str(), level.qty.as_str());
    }
    if bids.is_empty() {
        line("bid", "-", "(no bids)");
    }
    out
}

/// `ask - bid`, exactly, with as many decimals as the longer of the two
/// (negative for a crossed book); `None` past 38 digits.
fn spread(bid: &str, ask: &str) -> Option<String> {
    let decimals = |text: &str| text.split_once('.').map_or(0, |(_, frac)| frac.len());
    let scale = decimals(bid).max(decimals(ask));
    let scaled = |text: &str| -> Option<u128> {
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let digits = format!("0{int}{frac}{}", "0".repeat(scale - frac.len()));
        digits.parse().ok()
    };
    let (bid, ask) = (scaled(bid)?, scaled(ask)?);
    let (sign, diff) = match ask.checked_sub(bid) {
        Some(diff) => ("", diff),
        None => ("-", bid - ask),
    };
    let digits = format!("{diff:0>width$}", width = scale + 1);
    let (int, frac) = digits.split_at(digits.len() - scale);
    Some(match scale {
        0 => format!("{sign}{int}"),
        _ => format!("{sign}{int}.{frac}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_are_exact_decimals() {
        assert_eq!(spread("100.50", "101").as_deref(), Some("0.50"));
        assert_eq!(spread("99.9", "100.05").as_deref(), Some("0.15"));
        assert_eq!(spread("0.00001", "0.00002").as_deref(), Some("0.00001"));
        assert_eq!(spread("5", "7").as_deref(), Some("2"));
        assert_eq!(spread("101.5", "101.25").as_deref(), Some("-0.25"));
        assert_eq!(spread(".5", "1.").as_deref(), Some("0.5"));
    }

    #[test]
    fn json_keys_come_in_the_documented_order() {
        let snapshot = br#"{"lastUpdateId":1,"bids":[["1.0","2"]],"asks":[]}"#;
        let rebuilt = Rebuilt {
            at: EntryId { token: 2, seq: 3 },
            snapshot: EntryId { token: 2, seq: 1 },
            diffs_applied: 0,
            format: BookFormat::Binance,
            book: Book::rebuild(BookFormat::Binance, None, snapshot, [b""; 0]).unwrap(),
        };
        let printed = render_json("s", &rebuilt, 10);
        let keys: Vec<&str> = printed
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix('"')?.split('"').next())
            .collect();
        let documented = [
            "stream_id",
            "at",
            "snapshot",
            "diffs_applied",
            "bids",
            "asks",
            "best_bid",
            "best_ask",
        ];
        assert_eq!(keys, documented);
        let value: serde_json::Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(value["best_bid"], serde_json::json!(["1.0", "2"]));
        assert_eq!(value["best_ask"], serde_json::Value::Null);
        assert_eq!(
            render_text("s", &rebuilt, 10),
            "s at 2-3: snapshot 2-1 + 0 diffs applied (binance); 1 of 1 bids, 0 of 0 asks
       price  quantity
ask        -  (no asks)
spread     -
bid      1.0  2
"
        );
    }

    #[test]
    fn entry_ids_are_full_ids() {
        assert_eq!(
            parse_entry_id("7-1042"),
            Ok(EntryId {
                token: 7,
                seq: 1042
            })
        );
        for bad in ["7", "-1", "7-", "a-1", "7-1-2", "1042", "+7-1"] {
            assert!(parse_entry_id(bad).is_err(), "{bad}");
        }
    }
}
