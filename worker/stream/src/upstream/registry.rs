//! The worker's upstream connections, one entry each, reported whole on every
//! change: the counts feed `leasehold_upstream_connections{worker}` and
//! `leasehold_upstream_streams_per_connection`, the list the dashboard's
//! connections view, and every subscription names the connection carrying it.
//!
//! A connection keeps its id across planned replacements: to an operator it
//! is one place streams live, whose socket is renewed before the exchange's
//! age limit. Its successor socket is counted while both are open, because
//! both are real connections the exchange counts.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_telemetry::status::{LISTED_CONNECTIONS, UpstreamConnection};
use leasehold_telemetry::{TelemetryEvent, TelemetrySink};

/// The worker's number for one of its upstream connections.
pub(crate) type ConnectionId = u64;

/// Every open upstream connection of one worker (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ConnectionRegistry {
    state: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    last_id: ConnectionId,
    open: BTreeMap<ConnectionId, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// Sockets open for it: 1, or 2 while a replacement overlaps it.
    sockets: u64,
    streams: u64,
    opened_at_ms: i64,
    replacements: u64,
    subscribe_seconds: Option<f64>,
}

impl ConnectionRegistry {
    /// A new connection with its first socket open, carrying `streams`.
    pub(crate) fn opened(&self, streams: u64, telemetry: &dyn TelemetrySink) -> ConnectionId {
        self.change(telemetry, |registry| {
            registry.last_id += 1;
            registry.open.insert(
                registry.last_id,
                Entry {
                    sockets: 1,
                    streams,
                    opened_at_ms: now_ms(),
                    replacements: 0,
                    subscribe_seconds: None,
                },
            );
            registry.last_id
        })
    }

    /// A replacement socket of `id` opened (it overlaps the current one).
    pub(crate) fn successor_opened(&self, id: ConnectionId, telemetry: &dyn TelemetrySink) {
        self.change(telemetry, |registry| {
            if let Some(entry) = registry.open.get_mut(&id) {
                entry.sockets += 1;
            }
        });
    }

    /// The replacement socket of `id` ended without taking over.
    pub(crate) fn successor_dropped(&self, id: ConnectionId, telemetry: &dyn TelemetrySink) {
        self.change(telemetry, |registry| {
            if let Some(entry) = registry.open.get_mut(&id) {
                entry.sockets = entry.sockets.saturating_sub(1).max(1);
            }
        });
    }

    /// The replacement took over `id`: the old socket closed, the age starts
    /// again.
    pub(crate) fn replaced(&self, id: ConnectionId, telemetry: &dyn TelemetrySink) {
        self.change(telemetry, |registry| {
            if let Some(entry) = registry.open.get_mut(&id) {
                entry.sockets = entry.sockets.saturating_sub(1).max(1);
                entry.opened_at_ms = now_ms();
                entry.replacements += 1;
            }
        });
    }

    /// `id` closed, with every socket and stream it still had.
    pub(crate) fn closed(&self, id: ConnectionId, telemetry: &dyn TelemetrySink) {
        self.change(telemetry, |registry| {
            registry.open.remove(&id);
        });
    }

    /// A held stream was placed on `id` (`added`) or left it.
    pub(crate) fn stream_moved(
        &self,
        id: ConnectionId,
        added: bool,
        telemetry: &dyn TelemetrySink,
    ) {
        self.change(telemetry, |registry| {
            if let Some(entry) = registry.open.get_mut(&id) {
                entry.streams = if added {
                    entry.streams + 1
                } else {
                    entry.streams.saturating_sub(1)
                };
            }
        });
    }

    /// A stream's subscription on `id` delivered its first frame `duration`
    /// after it was asked for (`leasehold_upstream_subscribe_seconds`).
    pub(crate) fn subscribed(
        &self,
        id: ConnectionId,
        stream_id: &str,
        duration: Duration,
        telemetry: &dyn TelemetrySink,
    ) {
        telemetry.emit(TelemetryEvent::UpstreamSubscribed {
            stream_id: stream_id.to_owned(),
            duration,
            connection: Some(id),
        });
        self.change(telemetry, |registry| {
            if let Some(entry) = registry.open.get_mut(&id) {
                entry.subscribe_seconds = Some(duration.as_secs_f64());
            }
        });
    }

    /// Applies one change and reports the whole state. The report is sent
    /// under the lock so that reports leave in the order of the changes: the
    /// latest one stands.
    fn change<T>(
        &self,
        telemetry: &dyn TelemetrySink,
        apply: impl FnOnce(&mut Registry) -> T,
    ) -> T {
        let mut registry = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let out = apply(&mut registry);
        telemetry.emit(registry.report());
        out
    }
}

impl Registry {
    fn report(&self) -> TelemetryEvent {
        TelemetryEvent::UpstreamConnections {
            connections: self.open.values().map(|e| e.sockets).sum(),
            streams: self.open.values().map(|e| e.streams).sum(),
            open: self
                .open
                .iter()
                .take(LISTED_CONNECTIONS)
                .map(|(id, entry)| UpstreamConnection {
                    id: *id,
                    opened_at_ms: entry.opened_at_ms,
                    streams: entry.streams,
                    replacements: entry.replacements,
                    subscribe_seconds: entry.subscribe_seconds,
                })
                .collect(),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_telemetry::RecordingSink;

    fn last_report(sink: &RecordingSink) -> (u64, u64, Vec<UpstreamConnection>) {
        sink.snapshot()
            .into_iter()
            .rev()
            .find_map(|event| match event {
                TelemetryEvent::UpstreamConnections {
                    connections,
                    streams,
                    open,
                } => Some((connections, streams, open)),
                _ => None,
            })
            .expect("a report")
    }

    #[test]
    fn a_replacement_keeps_the_id_counts_both_sockets_while_they_overlap_and_restarts_the_age() {
        let sink = RecordingSink::default();
        let registry = ConnectionRegistry::default();
        let first = registry.opened(0, &sink);
        let second = registry.opened(1, &sink);
        assert_ne!(first, second);
        registry.stream_moved(first, true, &sink);
        registry.stream_moved(first, true, &sink);
        assert_eq!(last_report(&sink).0, 2);
        assert_eq!(last_report(&sink).1, 3);

        registry.successor_opened(first, &sink);
        assert_eq!(
            last_report(&sink).0,
            3,
            "the overlapping socket is a connection too"
        );
        let opened_before = last_report(&sink).2[0].opened_at_ms;
        std::thread::sleep(Duration::from_millis(5));
        registry.replaced(first, &sink);
        let (connections, streams, open) = last_report(&sink);
        assert_eq!((connections, streams), (2, 3));
        assert_eq!(open[0].id, first);
        assert_eq!(open[0].replacements, 1);
        assert!(open[0].opened_at_ms > opened_before, "the age starts again");

        registry.subscribed(second, "btcusdt", Duration::from_millis(250), &sink);
        assert_eq!(last_report(&sink).2[1].subscribe_seconds, Some(0.25));
        assert!(sink.snapshot().iter().any(|event| matches!(
            event,
            TelemetryEvent::UpstreamSubscribed { connection: Some(id), .. } if *id == second
        )));

        registry.stream_moved(first, false, &sink);
        registry.closed(second, &sink);
        let (connections, streams, open) = last_report(&sink);
        assert_eq!((connections, streams), (1, 1));
        assert_eq!(open.len(), 1);
    }

    #[test]
    fn a_closed_connection_takes_its_overlapping_socket_and_its_streams_with_it() {
        let sink = RecordingSink::default();
        let registry = ConnectionRegistry::default();
        let id = registry.opened(1, &sink);
        registry.successor_opened(id, &sink);
        registry.closed(id, &sink);
        // A late word about the closed connection changes nothing.
        registry.successor_dropped(id, &sink);
        registry.stream_moved(id, false, &sink);
        assert_eq!(last_report(&sink), (0, 0, Vec::new()));
    }

    #[test]
    fn only_the_oldest_connections_are_listed_but_all_are_counted() {
        let sink = RecordingSink::default();
        let registry = ConnectionRegistry::default();
        for _ in 0..LISTED_CONNECTIONS + 5 {
            registry.opened(1, &sink);
        }
        let (connections, streams, open) = last_report(&sink);
        assert_eq!(connections as usize, LISTED_CONNECTIONS + 5);
        assert_eq!(streams as usize, LISTED_CONNECTIONS + 5);
        assert_eq!(open.len(), LISTED_CONNECTIONS);
        assert_eq!(open[0].id, 1);
    }
}
