//! In-process sink with the Redis sink's semantics (tests and `leasehold dev`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;

use super::{FencedSink, SinkBatch, SinkError, SinkOptions, WriteOutcome};

/// One accepted event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Upstream sequence.
    pub seq: u64,
    /// Upstream event id.
    pub event_id: String,
    /// Token of the write that appended it.
    pub fence_token: u64,
    /// The event as received.
    pub payload: String,
}

#[derive(Debug, Default)]
struct StreamState {
    highest_token: u64,
    /// Event ids in the window, ordered by (seq, id) like the Redis sorted set.
    window: BTreeSet<(u64, String)>,
    ids: HashMap<String, u64>,
    entries: VecDeque<StoredEvent>,
    appended: u64,
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

    /// Every event ever appended for a stream (including trimmed ones).
    pub fn appended(&self, stream_id: &str) -> u64 {
        self.lock().get(stream_id).map_or(0, |s| s.appended)
    }

    /// Highest token accepted for a stream.
    pub fn highest_token(&self, stream_id: &str) -> u64 {
        self.lock().get(stream_id).map_or(0, |s| s.highest_token)
    }
}

#[async_trait]
impl FencedSink for MemorySink {
    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        let mut streams = self.lock();
        let state = streams.entry(batch.stream_id.to_owned()).or_default();
        if batch.fence_token < state.highest_token {
            return Ok(WriteOutcome {
                fenced: batch.events.len() as u64,
                highest_token: state.highest_token,
                ..WriteOutcome::default()
            });
        }
        state.highest_token = batch.fence_token;
        let mut outcome = WriteOutcome {
            highest_token: batch.fence_token,
            ..WriteOutcome::default()
        };
        for event in batch.events {
            if state.ids.contains_key(&event.event_id) {
                outcome.duplicate += 1;
                continue;
            }
            state.entries.push_back(super::memory::StoredEvent {
                seq: event.seq,
                event_id: event.event_id.clone(),
                fence_token: batch.fence_token,
                payload: event.payload.clone(),
            });
            state.appended += 1;
            state.ids.insert(event.event_id.clone(), event.seq);
            state.window.insert((event.seq, event.event_id.clone()));
            outcome.accepted += 1;
        }
        // Keep the `dedup_window` highest sequences, as ZREMRANGEBYRANK does.
        while state.window.len() as u64 > self.options.dedup_window {
            if let Some((_, id)) = state.window.pop_first() {
                state.ids.remove(&id);
            }
        }
        if self.options.max_len > 0 {
            while state.entries.len() as u64 > self.options.max_len {
                state.entries.pop_front();
            }
        }
        Ok(outcome)
    }
}
