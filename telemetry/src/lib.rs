//! What workers report and how it reaches the sidecar.
//!
//! Components never touch a metric registry: they emit a [`TelemetryEvent`],
//! which writes one log line and travels to the task's sidecar, where one module
//! maps it to metric updates. Emitting never blocks or fails the data path.
//!
//! Module map:
//! - [`event`]: the typed events and [`TelemetrySink`] (`emit`, synchronous and
//!   infallible).
//! - [`labels`]: the closed label sets (`reason`, `result`, `state`, `kind`).
//! - [`transport`]: the worker → sidecar wire format and [`BufferedShipper`], the
//!   bounded drop-oldest buffer workers emit through.
//! - [`process`]: the worker's own memory, CPU and descriptors for the heartbeat.
//! - [`status`]: the sidecar's `/status` document, served by the sidecar and read
//!   by the dashboard.
//! - [`settings`]: where telemetry goes (`TELEMETRY_ADDR`, `TELEMETRY_BUFFER`)
//!   and where the sidecar answers (`SIDECAR_LISTEN`, `SIDECAR_URL`).
//! - [`sidecar_url`]: the strict `http://IP:PORT` form workers publish and the
//!   dashboard reads.
//! - `testing` (feature `testing`): one event of every variant.

pub mod event;
pub mod labels;
pub mod process;
pub mod settings;
pub mod sidecar_url;
pub mod status;
pub mod transport;

#[cfg(feature = "testing")]
pub mod testing;

pub use event::*;
pub use transport::{BufferedShipper, ShipperConfig};
