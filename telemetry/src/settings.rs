//! Where a worker's telemetry goes.

use std::net::SocketAddr;

use leasehold_platform::settings::{Documented, Env, Fallback, Setting, parse};

use crate::transport::ShipperConfig;

/// The `TELEMETRY_ADDR` variable.
pub const TELEMETRY_ADDR: Setting<SocketAddr> = Setting::new(
    "TELEMETRY_ADDR",
    parse::SOCKET_ADDR,
    Fallback::Value(|| SocketAddr::from(([127, 0, 0, 1], 9465))),
    "Where workers ship telemetry events and the sidecar listens for them (loopback).",
);
/// The `TELEMETRY_BUFFER` variable.
pub const TELEMETRY_BUFFER: Setting<usize> = Setting::new(
    "TELEMETRY_BUFFER",
    parse::SIZE,
    Fallback::Value(|| 65_536),
    "Events a worker keeps while its sidecar is slow or away; the oldest are dropped and counted beyond it.",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[&TELEMETRY_ADDR, &TELEMETRY_BUFFER];

/// The shipper for `component` run by `owner_id`, from `TELEMETRY_ADDR` and
/// `TELEMETRY_BUFFER`.
pub fn shipper(env: &mut Env, component: &str, owner_id: &str) -> ShipperConfig {
    ShipperConfig {
        capacity: env.get(&TELEMETRY_BUFFER),
        ..ShipperConfig::new(env.get(&TELEMETRY_ADDR).to_string(), component, owner_id)
    }
}
