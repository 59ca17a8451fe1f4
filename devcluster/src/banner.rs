//! What `leasehold dev` prints once the cluster is up: where each part listens
//! and what it runs on. Here rather than in the binary because it reads the
//! cluster's options and addresses, which the binary only passes through.

use crate::{DevCluster, DevFeed};

impl DevCluster {
    /// The lines after "ready": the dashboard, the feed, every sidecar, the
    /// backends, chaos if on, and how to stop; each line ends with a newline.
    pub fn banner(&self) -> String {
        let options = &self.options;
        let at = &self.addresses;
        let mut lines = vec![
            format!("  dashboard     http://{}/", at.dashboard),
            format!(
                "  feed          {} ({} streams at {}/s{})",
                at.feed,
                options.streams,
                options.rate,
                match options.feed {
                    DevFeed::Simulator => "",
                    DevFeed::Exchange => ", an exchange-shaped fake: live start, short history",
                    DevFeed::Book => ", order books: Binance depth diffs and REST snapshots",
                }
            ),
        ];
        for (index, sidecar) in at.sidecars.iter().enumerate() {
            lines.push(format!(
                "  sidecar {}     http://{sidecar}/metrics  http://{sidecar}/status",
                index + 1
            ));
        }
        lines.push(format!(
            "  pool sidecar  http://{}/metrics  (all broker workers)",
            at.pool_sidecar
        ));
        let backend = |real: bool, name: &'static str| if real { name } else { "in-memory" };
        lines.push(format!(
            "  backends      lease store: {}, sink and pool bus: {}",
            backend(options.dynamodb_endpoint.is_some(), "DynamoDB"),
            backend(options.redis_url.is_some(), "Redis"),
        ));
        lines.push(format!(
            "  modes         lease mode {}, discovery {} (the dashboard's header names the assigner and the observer)",
            options.lease_mode.as_str(),
            options.discovery_mode.as_str()
        ));
        if let Some(every) = options.chaos_every {
            lines.push(format!(
                "  chaos         every {} s: crash, pause or roll a worker",
                every.as_secs()
            ));
        }
        lines.push("Ctrl-C drains everything and checks the sink.".to_owned());
        lines.iter().map(|line| format!("{line}\n")).collect()
    }
}
