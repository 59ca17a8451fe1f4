//! The stream's own numbers for upstreams whose sequence is not the
//! stream's: a sequence that starts over on every connection (Coinbase
//! Advanced Trade's `sequence_num`, `UPSTREAM_SEQ_SCOPE=connection`) or no
//! sequence at all (Kraken v2 `book`, `UPSTREAM_SEQ_POINTER=none`).
//!
//! Both are books whose snapshot comes in the stream after every subscribe,
//! so the snapshot is the anchor: a connection's first snapshot takes the
//! number after the highest the stream has used, and every later frame of
//! that connection is numbered from it by its own sequence (or by counting
//! frames). Numbers therefore only grow across connections (the sink's
//! entry ids stay increasing with no reset entry), holes inside a
//! connection stay holes, and what a cut missed cannot be counted: the
//! snapshot after it covers one number, its own, and says a resync
//! happened. Frames before a connection's first snapshot have nothing to be
//! numbered from and are not taken.

use std::fmt;

/// Where a frame's sequence comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SeqSource {
    /// The upstream's sequence is the stream's, on every connection.
    #[default]
    Stream,
    /// The upstream's sequence counts per connection (`UPSTREAM_SEQ_SCOPE=connection`).
    Connection,
    /// Frames carry no sequence; the worker counts them (`UPSTREAM_SEQ_POINTER=none`).
    Counted,
}

impl SeqSource {
    /// Whether the stream's numbers are the worker's, not the upstream's.
    pub fn renumbers(self) -> bool {
        self != SeqSource::Stream
    }
}

/// `UPSTREAM_SEQ_SCOPE`: whose sequence `UPSTREAM_SEQ_POINTER` reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SeqScope {
    /// One sequence for the stream, whatever the connection (the default).
    #[default]
    Stream,
    /// A sequence that starts over on every connection.
    Connection,
}

impl SeqScope {
    /// The setting's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SeqScope::Stream => "stream",
            SeqScope::Connection => "connection",
        }
    }

    /// Parses the setting's spelling.
    pub fn parse(value: &str) -> Option<SeqScope> {
        match value {
            "stream" => Some(SeqScope::Stream),
            "connection" => Some(SeqScope::Connection),
            _ => None,
        }
    }
}

impl fmt::Display for SeqScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One connection's anchor: its first snapshot's own sequence and the
/// stream number it was given.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    local: u64,
    number: u64,
}

/// Numbers a held stream's frames for its [`SeqSource`].
#[derive(Debug, Clone, Default)]
pub struct Numbering {
    source: SeqSource,
    anchor: Option<Anchor>,
    /// Frames counted on this connection since its anchor (`Counted`).
    counted: u64,
    /// The highest number given out: held frames of an earlier connection
    /// may be above what was written, and a new anchor must clear them.
    highest: Option<u64>,
}

impl Numbering {
    /// Numbers for `source`.
    pub fn new(source: SeqSource) -> Self {
        Numbering {
            source,
            ..Numbering::default()
        }
    }

    /// A new connection: its frames wait for its first snapshot.
    pub fn connected(&mut self) {
        self.anchor = None;
        self.counted = 0;
    }

    /// The stream's number for a frame whose own sequence is `local`
    /// (anything when counted), or `None` when it cannot be numbered yet
    /// (before the connection's first snapshot). `last` is what the stream
    /// has already taken.
    pub fn number(&mut self, local: u64, snapshot: bool, last: Option<u64>) -> Option<u64> {
        if self.source == SeqSource::Stream {
            return Some(local);
        }
        let local = if self.source == SeqSource::Counted {
            self.counted
        } else {
            local
        };
        let anchor = match self.anchor {
            Some(anchor) => anchor,
            None if snapshot => {
                let after = last.max(self.highest).map_or(1, |n| n.saturating_add(1));
                *self.anchor.insert(Anchor {
                    local,
                    number: after,
                })
            }
            None => return None,
        };
        self.counted += 1;
        // Below the anchor (an upstream that repeats itself on the same
        // connection) lands below it too: a replay, dropped by the sequencer.
        let number = if local >= anchor.local {
            anchor.number.saturating_add(local - anchor.local)
        } else {
            anchor.number.saturating_sub(anchor.local - local)
        };
        self.highest = self.highest.max(Some(number));
        Some(number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_scope_keeps_the_upstreams_numbers() {
        let mut numbering = Numbering::new(SeqSource::Stream);
        assert_eq!(numbering.number(42, false, None), Some(42));
        numbering.connected();
        assert_eq!(numbering.number(7, false, Some(42)), Some(7));
    }

    #[test]
    fn a_connection_sequence_continues_the_stream_from_each_first_snapshot() {
        let mut numbering = Numbering::new(SeqSource::Connection);
        // Coinbase: the acknowledgement took 0, the book 1, updates follow.
        assert_eq!(numbering.number(2, false, None), None, "before any book");
        assert_eq!(numbering.number(1, true, None), Some(1));
        assert_eq!(numbering.number(2, false, Some(1)), Some(2));
        // A hole inside the connection stays a hole.
        assert_eq!(numbering.number(5, false, Some(2)), Some(5));
        // The next connection starts over at 0: its book follows 5.
        numbering.connected();
        assert_eq!(numbering.number(2, false, Some(5)), None);
        assert_eq!(numbering.number(1, true, Some(5)), Some(6));
        assert_eq!(numbering.number(2, false, Some(6)), Some(7));
        // Going back on the same connection is a replay, below the anchor.
        assert_eq!(numbering.number(0, false, Some(7)), Some(5));
    }

    #[test]
    fn counted_frames_are_numbered_from_the_snapshot_on() {
        let mut numbering = Numbering::new(SeqSource::Counted);
        // A takeover: the sink ends at 40.
        assert_eq!(numbering.number(0, false, Some(40)), None);
        assert_eq!(numbering.number(0, true, Some(40)), Some(41));
        assert_eq!(numbering.number(0, false, Some(41)), Some(42));
        assert_eq!(numbering.number(0, false, Some(42)), Some(43));
        // A second book on the same connection (a resync) keeps counting.
        assert_eq!(numbering.number(0, true, Some(43)), Some(44));
    }

    #[test]
    fn a_new_anchor_clears_every_number_given_out_not_only_the_written() {
        let mut numbering = Numbering::new(SeqSource::Counted);
        assert_eq!(numbering.number(0, true, None), Some(1));
        // Frames held while a book is awaited were numbered up to 4, but
        // only 1 was taken when the connection was cut.
        for expected in 2..=4 {
            assert_eq!(numbering.number(0, false, Some(1)), Some(expected));
        }
        numbering.connected();
        assert_eq!(numbering.number(0, true, Some(1)), Some(5));
    }
}
