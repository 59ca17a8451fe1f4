//! The connections view's model: each stream worker's upstream connections
//! as its sidecar lists them, and a line per worker with the sums an
//! operator checks against the exchange's limits (connections per IP,
//! streams per connection, connects per minute).

use serde::Serialize;

use crate::sources::sidecars::SidecarReport;

/// One upstream connection of a stream worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnectionRow {
    /// The worker holding it (untrusted text).
    pub owner_id: String,
    /// The worker's number for it; the stream page names the same number.
    pub connection: u64,
    /// Held streams on it.
    pub streams: u64,
    /// When its current socket opened, unix ms.
    pub opened_at_ms: i64,
    /// Times it was replaced before the exchange's age limit.
    pub replacements: u64,
    /// Its latest subscription, from asking to the first frame, seconds.
    pub subscribe_seconds: Option<f64>,
}

/// One stream worker's connections, summed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnectionOwnerRow {
    /// The worker (untrusted text).
    pub owner_id: String,
    /// Connections it has open (a replacement overlapping its connection
    /// counts), listed or not.
    pub connections: u64,
    /// Held streams on the listed connections.
    pub streams_listed: u64,
    /// When its oldest listed connection's socket opened, unix ms.
    pub oldest_opened_at_ms: Option<i64>,
    /// The slowest latest subscription among its listed connections, seconds.
    pub slowest_subscribe_seconds: Option<f64>,
    /// Connects that waited for its connect budget since its sidecar started.
    pub connects_throttled: u64,
}

/// Every stream worker's connections, sorted by worker then connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Connections {
    /// One line per worker that reported connections or throttled connects.
    pub owners: Vec<ConnectionOwnerRow>,
    /// Every listed connection.
    pub connections: Vec<ConnectionRow>,
}

impl Connections {
    /// What the sidecars that answered say.
    pub fn from_sidecars(sidecars: &[SidecarReport]) -> Self {
        let mut view = Connections::default();
        for report in sidecars {
            let Some(status) = &report.status else {
                continue;
            };
            let Some(owner) = &status.owner_id else {
                continue;
            };
            let listed = &status.upstream_connections;
            if listed.is_empty()
                && status.upstream_connections_open == 0
                && status.upstream_connects_throttled == 0
            {
                continue;
            }
            view.owners.push(ConnectionOwnerRow {
                owner_id: owner.clone(),
                connections: status.upstream_connections_open,
                streams_listed: listed.iter().map(|c| c.streams).sum(),
                oldest_opened_at_ms: listed.iter().map(|c| c.opened_at_ms).min(),
                slowest_subscribe_seconds: listed
                    .iter()
                    .filter_map(|c| c.subscribe_seconds)
                    .max_by(f64::total_cmp),
                connects_throttled: status.upstream_connects_throttled,
            });
            view.connections
                .extend(listed.iter().map(|connection| ConnectionRow {
                    owner_id: owner.clone(),
                    connection: connection.id,
                    streams: connection.streams,
                    opened_at_ms: connection.opened_at_ms,
                    replacements: connection.replacements,
                    subscribe_seconds: connection.subscribe_seconds,
                }));
        }
        view.owners.sort_by(|a, b| a.owner_id.cmp(&b.owner_id));
        view.connections
            .sort_by(|a, b| (&a.owner_id, a.connection).cmp(&(&b.owner_id, b.connection)));
        view
    }

    /// The connection `connection` of `owner`, if it is listed.
    pub fn find(&self, owner: &str, connection: u64) -> Option<&ConnectionRow> {
        self.connections
            .iter()
            .find(|row| row.owner_id == owner && row.connection == connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::sidecars::KeptStatus;
    use leasehold_telemetry::status::UpstreamConnection;

    fn report(
        owner: &str,
        open: u64,
        listed: Vec<UpstreamConnection>,
        throttled: u64,
    ) -> SidecarReport {
        let mut status: KeptStatus = serde_json::from_value(serde_json::json!({
            "owner_id": owner,
            "worker_up": true,
            "leases": [],
            "lag": {},
            "observer": false,
        }))
        .expect("a status");
        status.upstream_connections = listed;
        status.upstream_connections_open = open;
        status.upstream_connects_throttled = throttled;
        SidecarReport {
            url: format!("http://10.0.0.1:9464/{owner}"),
            status: Some(status),
            error: None,
        }
    }

    fn listed(
        id: u64,
        streams: u64,
        opened_at_ms: i64,
        subscribe: Option<f64>,
    ) -> UpstreamConnection {
        UpstreamConnection {
            id,
            opened_at_ms,
            streams,
            replacements: 0,
            subscribe_seconds: subscribe,
        }
    }

    #[test]
    fn each_worker_is_summed_over_its_listed_connections_and_silent_ones_are_left_out() {
        let view = Connections::from_sidecars(&[
            report(
                "w2",
                3,
                vec![
                    listed(4, 500, 2_000, Some(0.4)),
                    listed(1, 200, 1_000, Some(1.5)),
                ],
                7,
            ),
            report("broker", 0, Vec::new(), 0),
            report("w1", 1, vec![listed(1, 1, 5_000, None)], 0),
        ]);
        let owners: Vec<_> = view.owners.iter().map(|o| o.owner_id.as_str()).collect();
        assert_eq!(
            owners,
            ["w1", "w2"],
            "no line for a worker without connections"
        );
        let w2 = &view.owners[1];
        assert_eq!(w2.connections, 3, "the open count, listed or not");
        assert_eq!(w2.streams_listed, 700);
        assert_eq!(w2.oldest_opened_at_ms, Some(1_000));
        assert_eq!(w2.slowest_subscribe_seconds, Some(1.5));
        assert_eq!(w2.connects_throttled, 7);
        let rows: Vec<_> = view
            .connections
            .iter()
            .map(|c| (c.owner_id.as_str(), c.connection))
            .collect();
        assert_eq!(rows, [("w1", 1), ("w2", 1), ("w2", 4)]);
        assert_eq!(view.find("w2", 4).map(|c| c.streams), Some(500));
        assert_eq!(view.find("w1", 4), None, "numbers are per worker");
    }
}
