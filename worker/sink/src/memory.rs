//! In-process sink with the Redis sink's semantics (tests and `leasehold dev`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use leasehold_control::protocol;

use super::{FencedSink, OpenOutcome, SinkBatch, SinkError, SinkOptions, WriteOutcome};

/// One accepted entry as stored: an event, or a gap marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Upstream sequence (a marker: `gap_to`, its position).
    pub seq: u64,
    /// Upstream event id (empty for a marker).
    pub event_id: String,
    /// Token of the write that appended it.
    pub fence_token: u64,
    /// The event as received (empty for a marker).
    pub payload: String,
    /// `Some` for a gap marker.
    pub gap: Option<super::GapMark>,
}

impl StoredEvent {
    /// The sequences an entry stands for: one for an event, the missing
    /// range for a marker.
    pub fn covers(&self) -> std::ops::RangeInclusive<u64> {
        match self.gap {
            Some(gap) => gap.from..=self.seq,
            None => self.seq..=self.seq,
        }
    }
}

#[derive(Debug, Default)]
struct StreamState {
    highest_token: u64,
    /// The newest `max_len` events (all when uncapped); the last one always stays.
    entries: VecDeque<StoredEvent>,
    appended: u64,
    /// Writes fail as a broken Redis key would (conformance: partial failures).
    broken: bool,
}

impl StreamState {
    fn last_seq(&self) -> Option<u64> {
        self.entries.back().map(|event| event.seq)
    }
}

/// Events per stream in memory, fenced and de-duplicated.
#[derive(Debug, Default)]
pub struct MemorySink {
    options: SinkOptions,
    streams: Mutex<HashMap<String, StreamState>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new(options: SinkOptions) -> Self {
        MemorySink {
            options,
            streams: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StreamState>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The events currently stored for a stream (the newest `max_len` when capped).
    pub fn events(&self, stream_id: &str) -> Vec<StoredEvent> {
        self.lock()
            .get(stream_id)
            .map(|s| s.entries.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The sequence of a stream's newest stored event (what the dashboard's
    /// stream page shows), without copying the stream.
    pub fn last_seq(&self, stream_id: &str) -> Option<u64> {
        self.lock().get(stream_id).and_then(StreamState::last_seq)
    }

    /// Every event ever appended for a stream (including trimmed ones).
    pub fn appended(&self, stream_id: &str) -> u64 {
        self.lock().get(stream_id).map_or(0, |s| s.appended)
    }

    /// Makes every call on a stream fail (or work again), as a Redis key of the
    /// wrong type does: the conformance suite's partial-failure check.
    pub fn set_broken(&self, stream_id: &str, broken: bool) {
        self.lock().entry(stream_id.to_owned()).or_default().broken = broken;
    }

    /// Highest token accepted for a stream.
    pub fn highest_token(&self, stream_id: &str) -> u64 {
        self.lock().get(stream_id).map_or(0, |s| s.highest_token)
    }
}

fn broken() -> SinkError {
    SinkError::Rejected("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}

#[async_trait]
impl FencedSink for MemorySink {
    async fn open(&self, stream_id: &str, fence_token: u64) -> Result<OpenOutcome, SinkError> {
        let mut streams = self.lock();
        let state = streams.entry(stream_id.to_owned()).or_default();
        if state.broken {
            return Err(broken());
        }
        if protocol::fenced(state.highest_token, fence_token) {
            return Ok(OpenOutcome {
                highest_token: state.highest_token,
                last_seq: state.last_seq(),
                fenced: true,
            });
        }
        state.highest_token = protocol::raised_fence(state.highest_token, fence_token);
        Ok(OpenOutcome {
            highest_token: fence_token,
            last_seq: state.last_seq(),
            fenced: false,
        })
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        batch.check_order()?;
        let mut streams = self.lock();
        let state = streams.entry(batch.stream_id.to_owned()).or_default();
        if protocol::fenced(state.highest_token, batch.fence_token) {
            return Ok(WriteOutcome {
                fenced: batch.events.len() as u64,
                highest_token: state.highest_token,
                ..WriteOutcome::default()
            });
        }
        if state.broken {
            return Err(broken());
        }
        if let Some(after) = batch.after
            && state.last_seq().is_none_or(|last| last < after)
        {
            return Ok(WriteOutcome {
                out_of_order: batch.events.len() as u64,
                highest_token: state.highest_token,
                ..WriteOutcome::default()
            });
        }
        state.highest_token = protocol::raised_fence(state.highest_token, batch.fence_token);
        let mut outcome = WriteOutcome {
            highest_token: batch.fence_token,
            ..WriteOutcome::default()
        };
        for event in batch.events {
            if protocol::already_appended(state.last_seq(), event.seq) {
                outcome.duplicate += 1;
                continue;
            }
            state.entries.push_back(StoredEvent {
                seq: event.seq,
                event_id: event.event_id.clone(),
                fence_token: batch.fence_token,
                // Stored as its own string: a shared payload would keep the
                // whole read buffer it came in alive for as long as it is kept.
                payload: event.payload.to_text(),
                gap: event.gap,
            });
            state.appended += 1;
            outcome.accepted += 1;
        }
        if self.options.max_len > 0 {
            while state.entries.len() as u64 > self.options.max_len.max(1) {
                state.entries.pop_front();
            }
        }
        Ok(outcome)
    }
}
