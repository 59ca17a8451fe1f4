//! In-process sink with the Redis sink's semantics (tests and `leasehold dev`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use leasehold_control::protocol;

use leasehold_control::protocol::EntryId;

use super::{
    FencedSink, OpenOutcome, OpenedStreams, SinkBatch, SinkError, SinkOptions, WriteOutcome,
};

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
    /// `Some` for a reset entry (then `seq` is its position, `reset.to - 1`).
    pub reset: Option<super::ResetMark>,
    /// A snapshot entry: `payload` is the book's body (`gap` the diffs it
    /// replaces, if any were missed).
    pub snapshot: bool,
}

impl StoredEvent {
    /// The sequences an entry stands for: one for an event, the missing
    /// range for a marker.
    pub fn covers(&self) -> std::ops::RangeInclusive<u64> {
        match (self.gap, self.reset) {
            (Some(gap), _) => gap.from..=self.seq,
            // None: it starts a new sequence.
            (None, Some(_)) => self.seq + 1..=self.seq,
            (None, None) => self.seq..=self.seq,
        }
    }
}

#[derive(Debug, Default)]
struct StreamState {
    /// The stream's last generated id (`None`: the key does not exist).
    last_id: Option<EntryId>,
    /// The newest `max_len` events (all when uncapped); the last one always stays.
    entries: VecDeque<StoredEvent>,
    appended: u64,
    /// Writes fail as a broken Redis key would (conformance: partial failures).
    broken: bool,
}

/// Events per stream in memory, fenced and de-duplicated by entry id as the
/// Redis sink's layout v2 is ([`protocol::admits`]).
#[derive(Debug, Default)]
pub struct MemorySink {
    options: SinkOptions,
    streams: Mutex<HashMap<String, StreamState>>,
    opened: OpenedStreams,
    /// The generation of the sink's pretend connection: a lost tail comes
    /// with a new one, as a failover's does.
    connection: std::sync::atomic::AtomicU64,
}

impl MemorySink {
    /// An empty sink.
    pub fn new(options: SinkOptions) -> Self {
        MemorySink {
            options,
            streams: Mutex::default(),
            opened: OpenedStreams::default(),
            connection: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn connection(&self) -> u64 {
        self.connection.load(std::sync::atomic::Ordering::SeqCst)
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
        self.lock()
            .get(stream_id)
            .and_then(|s| s.entries.back().map(|event| event.seq))
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

    /// The token of a stream's last id (0: no stream).
    pub fn highest_token(&self, stream_id: &str) -> u64 {
        self.lock()
            .get(stream_id)
            .and_then(|s| s.last_id)
            .map_or(0, |id| id.token)
    }

    /// What a failover to a replica that lacked the newest `entries` entries
    /// leaves (tests): they are gone, the last id is the newest kept entry's
    /// (the replica never saw the later appends, nor an open that raised the
    /// id since), and the connection is lost, so every stream must be opened
    /// again before its next write.
    pub fn lose_tail(&self, stream_id: &str, entries: usize) {
        let mut streams = self.lock();
        let state = streams.entry(stream_id.to_owned()).or_default();
        for _ in 0..entries.min(state.entries.len()) {
            state.entries.pop_back();
        }
        state.last_id = state.entries.back().map(|kept| EntryId {
            token: kept.fence_token,
            seq: kept.seq,
        });
        drop(streams);
        self.connection
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
        match protocol::opened_id(state.last_id, fence_token) {
            Err(fence) => Ok(OpenOutcome {
                highest_token: fence,
                last_seq: protocol::last_seq_of(state.last_id),
                fenced: true,
            }),
            Ok(raised) => {
                state.last_id = Some(raised);
                self.opened
                    .opened(stream_id, fence_token, self.connection());
                Ok(OpenOutcome {
                    highest_token: fence_token,
                    last_seq: protocol::last_seq_of(state.last_id),
                    fenced: false,
                })
            }
        }
    }

    async fn open_epoch(
        &self,
        stream_id: &str,
        fence_token: u64,
        reset: super::ResetMark,
    ) -> Result<OpenOutcome, SinkError> {
        let mut streams = self.lock();
        let state = streams.entry(stream_id.to_owned()).or_default();
        if state.broken {
            return Err(broken());
        }
        match protocol::epoch_open(state.last_id, fence_token, reset.position()) {
            protocol::EpochOpen::Fenced(fence) => {
                return Ok(OpenOutcome {
                    highest_token: fence,
                    last_seq: protocol::last_seq_of(state.last_id),
                    fenced: true,
                });
            }
            protocol::EpochOpen::Done => {}
            protocol::EpochOpen::Append(id) => {
                state.last_id = Some(id);
                state.entries.push_back(StoredEvent {
                    seq: id.seq,
                    event_id: String::new(),
                    fence_token,
                    payload: String::new(),
                    gap: None,
                    reset: Some(reset),
                    snapshot: false,
                });
            }
        }
        self.opened
            .opened(stream_id, fence_token, self.connection());
        Ok(OpenOutcome {
            highest_token: fence_token,
            last_seq: state.last_id.map(|id| id.seq),
            fenced: false,
        })
    }

    async fn write(&self, batch: SinkBatch<'_>) -> Result<WriteOutcome, SinkError> {
        batch.check_order()?;
        self.opened
            .check(batch.stream_id, batch.fence_token, self.connection())?;
        let mut streams = self.lock();
        let state = streams.entry(batch.stream_id.to_owned()).or_default();
        if state.broken {
            return Err(broken());
        }
        let mut outcome = WriteOutcome::default();
        for event in batch.events {
            let id = EntryId {
                token: batch.fence_token,
                seq: event.seq,
            };
            if !protocol::admits(state.last_id, id) {
                outcome.duplicate += 1;
                continue;
            }
            state.last_id = Some(id);
            state.entries.push_back(StoredEvent {
                seq: event.seq,
                event_id: event.event_id.clone(),
                fence_token: batch.fence_token,
                // Stored as its own string: a shared payload would keep the
                // whole read buffer it came in alive for as long as it is kept.
                payload: event.payload.to_text(),
                gap: event.gap,
                reset: None,
                snapshot: event.snapshot,
            });
            state.appended += 1;
            outcome.accepted += 1;
        }
        // Refusals are a head (ids increase): all of them a newer owner's
        // fence, or a replay of stored sequences.
        if let Some(last) = state.last_id
            && outcome.accepted == 0
            && protocol::refused_as_fenced(last, batch.fence_token)
        {
            outcome.fenced = std::mem::take(&mut outcome.duplicate);
        }
        outcome.highest_token = state.last_id.map_or(batch.fence_token, |id| id.token);
        if self.options.max_len > 0 {
            while state.entries.len() as u64 > self.options.max_len.max(1) {
                state.entries.pop_front();
            }
        }
        Ok(outcome)
    }
}
