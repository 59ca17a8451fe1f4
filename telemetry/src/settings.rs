//! Where a worker's telemetry goes.

use std::net::SocketAddr;

use leasehold_platform::ecs::TaskMetadata;
use leasehold_platform::settings::{Documented, Env, Fallback, Parser, Setting, parse};

use crate::sidecar_url::SidecarUrl;
use crate::transport::ShipperConfig;

/// `http://IP:PORT`, checked as the dashboard will check it.
const SIDECAR_URL_FORM: Parser<String> = Parser {
    parse: |raw| {
        SidecarUrl::parse(raw)
            .map(|url| url.to_string())
            .map_err(|problem| format!("must be http://IP:PORT ({problem})"))
    },
    show: Clone::clone,
};

/// The `SIDECAR_LISTEN` variable: read by the sidecar (where it listens) and by
/// workers (the port of the `sidecar_url` they derive).
pub const SIDECAR_LISTEN: Setting<SocketAddr> = Setting::new(
    "SIDECAR_LISTEN",
    parse::SOCKET_ADDR,
    Fallback::Value(|| SocketAddr::from(([0, 0, 0, 0], 9464))),
    "the sidecar's HTTP address: `/metrics`, `/healthz`, `/status`",
);
/// The `SIDECAR_URL` variable.
pub const SIDECAR_URL: Setting<String> = Setting::new(
    "SIDECAR_URL",
    SIDECAR_URL_FORM,
    Fallback::Derived("on ECS: the task address and SIDECAR_LISTEN port, else none"),
    "the base URL of the worker's sidecar, `http://IP:PORT` (an IP literal: names are \
     refused); on ECS, unset, it is `http://{task private IPv4}:{SIDECAR_LISTEN port}` from \
     the task metadata endpoint v4. Published as `sidecar_url` in the stream worker's \
     presence record and the broker worker's pool mark and `worker:metadata:*`, which is how \
     the dashboard finds sidecars; when none can be had the worker logs it once and runs on \
     unannounced. *Addition.*",
);

/// The `TELEMETRY_ADDR` variable.
pub const TELEMETRY_ADDR: Setting<SocketAddr> = Setting::new(
    "TELEMETRY_ADDR",
    parse::SOCKET_ADDR,
    Fallback::Value(|| SocketAddr::from(([127, 0, 0, 1], 9465))),
    "where workers ship telemetry events and the sidecar listens for them (loopback)",
);
/// The `TELEMETRY_BUFFER` variable.
pub const TELEMETRY_BUFFER: Setting<usize> = Setting::new(
    "TELEMETRY_BUFFER",
    parse::SIZE,
    Fallback::Value(|| 65_536),
    "events a worker keeps while its sidecar is slow or away; beyond it the oldest are \
     dropped and counted",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[&TELEMETRY_ADDR, &TELEMETRY_BUFFER, &SIDECAR_URL];

/// The shipper for `component` run by `owner_id`, from `TELEMETRY_ADDR` and
/// `TELEMETRY_BUFFER`.
pub fn shipper(env: &mut Env, component: &str, owner_id: &str) -> ShipperConfig {
    ShipperConfig {
        capacity: env.get(&TELEMETRY_BUFFER),
        ..ShipperConfig::new(env.get(&TELEMETRY_ADDR).to_string(), component, owner_id)
    }
}

/// The `sidecar_url` a worker publishes: `explicit` (`SIDECAR_URL`) when set,
/// else the task's private IPv4 from the ECS task metadata with `port` (the
/// sidecar's, from `SIDECAR_LISTEN`), else `None` (off ECS, or a network mode
/// without a task address): the worker runs on, unannounced.
pub fn derive_sidecar_url(
    explicit: Option<String>,
    metadata: Option<&TaskMetadata>,
    port: u16,
) -> Option<String> {
    explicit.or_else(|| {
        let ip = metadata?.private_ipv4()?;
        Some(SidecarUrl::new(SocketAddr::from((ip, port))).to_string())
    })
}

/// [`derive_sidecar_url`] with `explicit` (the `SIDECAR_URL` a worker's settings
/// read), `SIDECAR_LISTEN`'s port and, when no URL is given, the ECS task metadata. Logs once when
/// no URL can be had, and never fails: a worker without one is only invisible
/// to the dashboard's discovery.
pub fn sidecar_url_from(
    env: &mut Env<'_>,
    explicit: Option<String>,
    metadata: Option<&TaskMetadata>,
) -> Option<String> {
    let port = env.get(&SIDECAR_LISTEN).port();
    let url = derive_sidecar_url(explicit, metadata, port);
    match &url {
        Some(url) => tracing::info!(sidecar_url = url, "publishing this worker's sidecar"),
        None => tracing::info!(
            "no sidecar_url: SIDECAR_URL is unset and no ECS task address is known; the dashboard will not find this worker's sidecar"
        ),
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_wins_then_the_task_address_then_nothing() {
        let metadata: TaskMetadata = serde_json::from_str(
            r#"{"TaskARN":"arn:aws:ecs:us-east-1:1:task/c/t","Containers":[
                {"Name":"worker","Networks":[{"NetworkMode":"awsvpc","IPv4Addresses":["10.0.3.7"]}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            derive_sidecar_url(Some("http://10.9.9.9:1".into()), Some(&metadata), 9464).as_deref(),
            Some("http://10.9.9.9:1")
        );
        assert_eq!(
            derive_sidecar_url(None, Some(&metadata), 9464).as_deref(),
            Some("http://10.0.3.7:9464")
        );
        assert_eq!(
            derive_sidecar_url(None, Some(&TaskMetadata::default()), 9464),
            None
        );
        assert_eq!(derive_sidecar_url(None, None, 9464), None);
    }
}
