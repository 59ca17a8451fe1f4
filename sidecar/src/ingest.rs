//! Accepts worker connections on the telemetry address and feeds their events
//! into the view and the metrics. A peer speaking anything else is disconnected
//! and counted; the sidecar keeps running.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use leasehold_telemetry::TelemetryEvent;
use leasehold_telemetry::transport::{PREAMBLE, codec};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use leasehold_platform::logging::repeats;

use crate::SidecarState;
use crate::metrics::TransportError;

/// Serves worker connections until `shutdown`.
pub async fn serve(listener: TcpListener, state: Arc<SidecarState>, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((socket, _)) => {
                let state = state.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move { connection(socket, state, shutdown).await });
            }
            Err(err) => {
                if let Some(suppressed) = repeats().admit("telemetry:accept") {
                    tracing::warn!(error = %err, suppressed, "telemetry accept failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(mut socket: TcpStream, state: Arc<SidecarState>, shutdown: CancellationToken) {
    let mut preamble = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read_exact(&mut preamble)).await;
    if !matches!(read, Ok(Ok(_))) || preamble != PREAMBLE {
        if let Some(suppressed) = repeats().admit("telemetry:preamble") {
            tracing::warn!(
                suppressed,
                "telemetry peer sent no valid preamble (wrong version or not a worker); closing"
            );
        }
        state.record_transport_error(TransportError::Preamble);
        return;
    }
    state.view().connection(true);
    let mut frames = FramedRead::new(socket, codec());
    loop {
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            frame = frames.next() => frame,
        };
        match frame {
            None => break,
            Some(Err(err)) => {
                if let Some(suppressed) = repeats().admit("telemetry:frame") {
                    tracing::warn!(error = %err, suppressed, "bad telemetry frame; closing the connection");
                }
                state.record_transport_error(TransportError::Frame);
                break;
            }
            Some(Ok(bytes)) => match serde_json::from_slice::<TelemetryEvent>(&bytes) {
                Ok(event) => state.ingest(&event),
                Err(err) => {
                    if let Some(suppressed) = repeats().admit("telemetry:decode") {
                        tracing::warn!(error = %err, suppressed, "undecodable telemetry event; closing the connection");
                    }
                    state.record_transport_error(TransportError::Decode);
                    break;
                }
            },
        }
    }
    state.view().connection(false);
}
