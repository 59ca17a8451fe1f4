//! What one text frame is, read once: an event at its sequence (with the
//! field that names its stream on a shared connection), or a frame to skip.
//! The one-stream connection ([`super::websocket`]) and the shared one
//! ([`super::shared`]) both read frames here, so a setting means the same on
//! either.

use leasehold_control::clock::SystemClock;
use leasehold_telemetry::SkipReason;
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::config::{DataMatch, NO_POINTER};
use super::extract::Extractor;
use super::{SeqRange, UpstreamEvent, WebSocketUpstreamConfig};

/// Where the data-match pointers start in the extractor's output (after the
/// sequence, id, time and range start).
const FIRST_MATCH_SLOT: usize = 4;

/// What one frame turned out to be.
#[derive(Debug)]
pub(crate) enum Read {
    /// Data, at its sequence; `route` is the text at `UPSTREAM_ROUTE_POINTER`
    /// when one is set.
    Event {
        /// The event.
        event: UpstreamEvent,
        /// Which stream it belongs to on a shared connection.
        route: Option<String>,
    },
    /// Not data by `UPSTREAM_DATA_MATCH` (an acknowledgement, a heartbeat,
    /// an error): the caller reads it further if it needs to.
    Control,
    /// Data without a readable sequence (or an error frame that matched).
    NoSequence,
    /// Skipped for this reason.
    Skip(SkipReason),
}

/// Reads frames for one adapter's settings.
pub(crate) struct FrameReader {
    max_frame_bytes: usize,
    range: Option<SeqRange>,
    /// The sequence, id, time and range pointers, in that order (a missing
    /// one never resolves), then the data-match, snapshot and route pointers.
    extractor: Extractor,
    /// `UPSTREAM_DATA_MATCH`: (extractor slot, alternative); empty: all data.
    data_match: Vec<(usize, DataMatch)>,
    /// `UPSTREAM_SNAPSHOT_MATCH`: (extractor slot, condition).
    snapshot_match: Option<(usize, DataMatch)>,
    /// `UPSTREAM_ROUTE_POINTER`'s slot.
    route_slot: Option<usize>,
    /// The upstream takes application pings: a non-JSON frame is its reply.
    app_ping: bool,
    /// `UPSTREAM_SEQ_POINTER=none`: frames carry no sequence; the machine
    /// numbers them ([`crate::numbering`]).
    counted: bool,
    /// `UPSTREAM_ID_POINTER=none`: the sequence is the id (the machine fills it in).
    id_is_seq: bool,
}

impl FrameReader {
    /// A reader for `config`'s pointers; `route` adds the stream's field on
    /// a shared connection.
    pub(crate) fn new(config: &WebSocketUpstreamConfig, route: Option<&str>) -> Self {
        let match_pointers = config.data_match_pointers();
        let mut pointers = vec![
            config.seq_pointer.as_str(),
            config.id_pointer.as_str(),
            config.ts_pointer.as_deref().unwrap_or("none"),
            config.range.as_ref().map_or("none", SeqRange::pointer),
        ];
        pointers.extend(&match_pointers);
        let data_match = config
            .data_match
            .iter()
            .map(|alternative| {
                let slot = match_pointers
                    .iter()
                    .position(|p| *p == alternative.pointer)
                    .unwrap_or_default();
                (FIRST_MATCH_SLOT + slot, alternative.clone())
            })
            .collect();
        let snapshot_match = config.snapshot_match.as_ref().map(|snapshot| {
            pointers.push(snapshot.pointer.as_str());
            (pointers.len() - 1, snapshot.clone())
        });
        let route_slot = route.map(|route| {
            pointers.push(route);
            pointers.len() - 1
        });
        FrameReader {
            max_frame_bytes: config.max_frame_bytes,
            range: config.range.clone(),
            extractor: Extractor::new(&pointers),
            data_match,
            snapshot_match,
            route_slot,
            app_ping: config.ping_text.is_some(),
            counted: config.seq_pointer == NO_POINTER,
            id_is_seq: config.id_pointer == NO_POINTER,
        }
    }

    /// Reads one text frame. Only the pointed-at fields are parsed; the
    /// payload stays the frame's text.
    pub(crate) fn read(&self, frame: Utf8Bytes, received_at: Instant) -> Read {
        let text = frame.as_str();
        if text.len() > self.max_frame_bytes {
            return Read::Skip(SkipReason::TooLarge);
        }
        let Ok(mut fields) = self.extractor.extract(text) else {
            // An application ping's reply is often plain text (`pong`).
            return Read::Skip(if self.app_ping {
                SkipReason::Control
            } else {
                SkipReason::NotJson
            });
        };
        if !self.data_match.is_empty()
            && !self
                .data_match
                .iter()
                .any(|(slot, alternative)| alternative.matches(fields[*slot].as_ref()))
        {
            return Read::Control;
        }
        let snapshot = self
            .snapshot_match
            .as_ref()
            .is_some_and(|(slot, condition)| condition.matches(fields[*slot].as_ref()));
        let route = self
            .route_slot
            .and_then(|slot| fields[slot].take())
            .and_then(|value| match value {
                Value::String(s) => Some(s),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            });
        fields.truncate(FIRST_MATCH_SLOT);
        let [seq, event_id, ts, range] = <[Option<Value>; 4]>::try_from(fields).unwrap_or_default();
        let seq = match seq.and_then(sequence_number) {
            Some(seq) => seq,
            None if self.counted => 0,
            None => return Read::NoSequence,
        };
        let event_id = match event_id {
            _ if self.id_is_seq => String::new(),
            Some(Value::String(s)) if !s.is_empty() => s,
            Some(Value::Number(n)) => n.to_string(),
            _ => return Read::Skip(SkipReason::MissingField),
        };
        // A frame that should say where its range starts and does not
        // cannot be placed: skipped like one without its sequence.
        let first_seq = match &self.range {
            // A snapshot is the whole book at its sequence: it covers no range.
            _ if snapshot => None,
            None => None,
            Some(kind) => match range.and_then(sequence_number) {
                Some(value) => Some(kind.first(value)),
                None => return Read::Skip(SkipReason::MissingField),
            },
        };
        // Replays and holes are the runner's to judge (`crate::sequence`).
        let arrival_lag = ts
            .as_ref()
            .and_then(Value::as_f64)
            .map(|event_ms| SystemClock.seconds_since(event_ms));
        Read::Event {
            event: UpstreamEvent {
                seq,
                first_seq,
                event_id,
                payload: leasehold_sink::Payload::from_shared(frame.into()),
                snapshot,
                received_at,
                arrival_lag,
            },
            route,
        }
    }
}

/// A sequence as a frame writes it: a number, or a number in a string (JSON
/// numbers past 2^53 are often sent as strings).
fn sequence_number(value: Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}
