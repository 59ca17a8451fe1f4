//! Worker → sidecar telemetry transport (docs/invariants.md, invariant 5).
//!
//! Wire format, version 1: the client opens a TCP connection (loopback) and
//! sends the 4-byte preamble [`PREAMBLE`] (`LHT` + version byte 1), then frames:
//! a 4-byte big-endian length followed by one [`TelemetryEvent`] as JSON. A peer
//! that sends another preamble, a frame over [`MAX_FRAME_BYTES`] or a frame that
//! is not an event is disconnected.
//!
//! [`BufferedShipper`] is the worker side: `emit` pushes into a bounded buffer and
//! returns at once (when full, the oldest event is dropped and counted); a
//! background task ships the buffer, reconnecting with backoff. A slow, absent or
//! restarting sidecar costs the worker nothing but dropped events.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::codec::{FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use crate::event::{TelemetryEvent, TelemetrySink};
use leasehold_platform::backoff::Backoff;

/// Sent once at the start of every connection: magic `LHT` and the wire version.
pub const PREAMBLE: [u8; 4] = *b"LHT\x01";
/// Largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// The length-delimited codec both sides use.
pub fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

struct Buffer {
    events: VecDeque<TelemetryEvent>,
    dropped: u64,
}

struct Shared {
    buffer: Mutex<Buffer>,
    capacity: usize,
    wake: Notify,
    connected: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A telemetry sink that never blocks: logs each event, buffers it, and ships
/// the buffer to the sidecar in the background.
#[derive(Clone)]
pub struct BufferedShipper {
    shared: Arc<Shared>,
}

/// Where and how the shipper sends.
#[derive(Debug, Clone)]
pub struct ShipperConfig {
    /// The sidecar's telemetry address (`TELEMETRY_ADDR`).
    pub addr: String,
    /// Events kept while the sidecar is slow or away.
    pub capacity: usize,
    /// Component name in heartbeats (`stream-worker`, `broker-worker`).
    pub component: String,
    /// The worker's identity in heartbeats.
    pub owner_id: String,
    /// Heartbeat period: how the sidecar tells silent from idle.
    pub heartbeat: Duration,
}

impl ShipperConfig {
    /// Defaults for a worker: `TELEMETRY_BUFFER`'s default capacity and a heartbeat
    /// every second (well inside `WORKER_SILENCE_MS`).
    pub fn new(addr: impl Into<String>, component: &str, owner_id: &str) -> Self {
        ShipperConfig {
            addr: addr.into(),
            capacity: crate::settings::TELEMETRY_BUFFER
                .default_value()
                .expect("TELEMETRY_BUFFER has a default"),
            component: component.to_owned(),
            owner_id: owner_id.to_owned(),
            heartbeat: Duration::from_secs(1),
        }
    }
}

impl BufferedShipper {
    /// Starts the background shipping task; it stops when `shutdown` is cancelled
    /// (after a best-effort flush).
    pub fn start(config: ShipperConfig, shutdown: CancellationToken) -> Self {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer {
                // Grows on demand: an idle worker should not carry a full buffer.
                events: VecDeque::new(),
                dropped: 0,
            }),
            capacity: config.capacity.max(1),
            wake: Notify::new(),
            connected: std::sync::atomic::AtomicBool::new(false),
        });
        tokio::spawn(ship(shared.clone(), config, shutdown));
        BufferedShipper { shared }
    }

    /// Waits up to `within` for the buffer to drain while the sidecar is
    /// connected: a worker about to exit lets its last events reach the sidecar.
    pub async fn flush(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.is_connected() && self.buffered() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Events dropped so far and not yet reported.
    pub fn pending_dropped(&self) -> u64 {
        self.shared.lock().dropped
    }

    /// A sidecar is connected right now (a flush is worth waiting for).
    pub fn is_connected(&self) -> bool {
        self.shared
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Events waiting to be shipped.
    pub fn buffered(&self) -> usize {
        self.shared.lock().events.len()
    }
}

impl TelemetrySink for BufferedShipper {
    fn emit(&self, event: TelemetryEvent) {
        event.log();
        let mut buffer = self.shared.lock();
        if buffer.events.len() >= self.shared.capacity {
            buffer.events.pop_front();
            buffer.dropped += 1;
        }
        buffer.events.push_back(event);
        drop(buffer);
        self.shared.wake.notify_one();
    }
}

async fn ship(shared: Arc<Shared>, config: ShipperConfig, shutdown: CancellationToken) {
    let backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(2),
    };
    let mut attempt = 0u32;
    while !shutdown.is_cancelled() {
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = connect(&config.addr) => result,
        };
        match connected {
            Ok(stream) => {
                attempt = 0;
                let mut frames = FramedWrite::new(stream, codec());
                shared
                    .connected
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let pumped = pump(&shared, &config, &mut frames, &shutdown).await;
                shared
                    .connected
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                if let Err(err) = pumped {
                    tracing::debug!(error = %err, "telemetry connection lost; reconnecting");
                }
            }
            Err(err) => tracing::debug!(error = %err, addr = config.addr, "sidecar not reachable"),
        }
        // While disconnected the buffer keeps filling (and dropping oldest).
        let delay = backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

async fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    stream.write_all(&PREAMBLE).await?;
    Ok(stream)
}

/// Ships events until the connection fails or shutdown (then flushes what it can).
async fn pump(
    shared: &Shared,
    config: &ShipperConfig,
    frames: &mut FramedWrite<TcpStream, LengthDelimitedCodec>,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    let mut heartbeat = tokio::time::interval(config.heartbeat);
    loop {
        let (batch, dropped) = {
            let mut buffer = shared.lock();
            let batch: Vec<TelemetryEvent> = buffer.events.drain(..).collect();
            (batch, std::mem::take(&mut buffer.dropped))
        };
        if dropped > 0 {
            send(frames, &TelemetryEvent::EventsDropped { count: dropped }).await?;
        }
        for event in &batch {
            send(frames, event).await?;
        }
        SinkExt::<Bytes>::flush(frames).await?;
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = shared.wake.notified() => {}
            _ = heartbeat.tick() => {
                send(frames, &TelemetryEvent::WorkerHeartbeat {
                    component: config.component.clone(),
                    owner_id: config.owner_id.clone(),
                    process: crate::process::sample(),
                }).await?;
            }
        }
    }
}

async fn send(
    frames: &mut FramedWrite<TcpStream, LengthDelimitedCodec>,
    event: &TelemetryEvent,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_FRAME_BYTES {
        // An event this large is a bug upstream; dropping it keeps the stream valid.
        tracing::warn!(
            bytes = bytes.len(),
            "telemetry event too large to ship; dropped"
        );
        return Ok(());
    }
    frames.feed(Bytes::from(bytes)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio_util::codec::FramedRead;

    fn config(addr: String, capacity: usize) -> ShipperConfig {
        ShipperConfig {
            capacity,
            ..ShipperConfig::new(addr, "test", "w1")
        }
    }

    /// Reads `count` events off the wire, skipping heartbeats.
    async fn read_events(
        mut frames: FramedRead<tokio::net::TcpStream, LengthDelimitedCodec>,
        count: usize,
    ) -> Vec<TelemetryEvent> {
        let mut events = Vec::new();
        while events.len() < count {
            let frame = tokio::time::timeout(Duration::from_secs(5), frames.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let event: TelemetryEvent = serde_json::from_slice(&frame).unwrap();
            if !matches!(event, TelemetryEvent::WorkerHeartbeat { .. }) {
                events.push(event);
            }
        }
        events
    }

    fn released(i: u64) -> TelemetryEvent {
        TelemetryEvent::LeaseReleased {
            stream_id: format!("s{i}"),
            fence_token: i,
        }
    }

    #[tokio::test]
    async fn ships_preamble_then_framed_events() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = CancellationToken::new();
        let shipper = BufferedShipper::start(config(addr, 100), shutdown.clone());
        shipper.emit(released(1));
        shipper.emit(released(2));
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut preamble = [0u8; 4];
        socket.read_exact(&mut preamble).await.unwrap();
        assert_eq!(preamble, PREAMBLE);
        let received = read_events(FramedRead::new(socket, codec()), 2).await;
        assert_eq!(received, [released(1), released(2)]);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn without_a_sidecar_emit_never_blocks_and_drops_oldest() {
        // Nothing listens on this port: every connect fails.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let shutdown = CancellationToken::new();
        let shipper = BufferedShipper::start(config(addr, 10), shutdown.clone());
        let started = std::time::Instant::now();
        for i in 0..10_000 {
            shipper.emit(released(i));
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "emit must not wait for the sidecar"
        );
        assert_eq!(shipper.buffered(), 10);
        assert_eq!(shipper.pending_dropped(), 9_990);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn dropped_events_are_reported_once_connected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = CancellationToken::new();
        let shipper = BufferedShipper::start(config(addr, 3), shutdown.clone());
        for i in 0..5 {
            shipper.emit(released(i));
        }
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut preamble = [0u8; 4];
        socket.read_exact(&mut preamble).await.unwrap();
        let events = read_events(FramedRead::new(socket, codec()), 4).await;
        assert_eq!(events[0], TelemetryEvent::EventsDropped { count: 2 });
        assert_eq!(&events[1..], [released(2), released(3), released(4)]);
        shutdown.cancel();
    }
}
