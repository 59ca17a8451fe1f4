//! ECS task metadata (endpoint v4), read when `ECS_CONTAINER_METADATA_URI_V4` is
//! set: the task's identity for `OWNER_ID` defaults, Redis worker metadata and
//! OTLP resource attributes. Off ECS every field is `None` and callers fall
//! back to local values.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::settings::External;

/// The variable ECS sets in every container.
pub const ECS_CONTAINER_METADATA_URI_V4: External = External {
    name: "ECS_CONTAINER_METADATA_URI_V4",
    doc: "ECS task metadata endpoint (set by the ECS agent; read for the task id and ARN).",
};

/// What leasehold uses from `${ECS_CONTAINER_METADATA_URI_V4}/task`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TaskMetadata {
    /// Cluster ARN or name.
    #[serde(rename = "Cluster")]
    pub cluster: Option<String>,
    /// Task ARN.
    #[serde(rename = "TaskARN")]
    pub task_arn: Option<String>,
    /// Task definition family.
    #[serde(rename = "Family")]
    pub family: Option<String>,
    /// Task definition revision.
    #[serde(rename = "Revision")]
    pub revision: Option<String>,
    /// When the task started (RFC 3339).
    #[serde(rename = "PullStartedAt")]
    pub pull_started_at: Option<String>,
    /// Availability zone.
    #[serde(rename = "AvailabilityZone")]
    pub availability_zone: Option<String>,
}

impl TaskMetadata {
    /// The task id (last segment of the ARN), a natural `OWNER_ID`.
    pub fn task_id(&self) -> Option<&str> {
        self.task_arn
            .as_deref()
            .and_then(|arn| arn.rsplit('/').next())
    }

    /// OTLP resource attributes (`aws.ecs.*`, semantic conventions).
    pub fn resource_attributes(&self) -> Vec<(String, String)> {
        [
            ("aws.ecs.cluster.arn", &self.cluster),
            ("aws.ecs.task.arn", &self.task_arn),
            ("aws.ecs.task.family", &self.family),
            ("aws.ecs.task.revision", &self.revision),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.clone().map(|v| (key.to_owned(), v)))
        .collect()
    }
}

/// Reads the task metadata if the endpoint variable is set; `None` off ECS or
/// when the endpoint does not answer within two seconds.
pub async fn task_metadata() -> Option<TaskMetadata> {
    let base = std::env::var(ECS_CONTAINER_METADATA_URI_V4.name)
        .ok()
        .filter(|v| !v.is_empty())?;
    fetch(&format!("{}/task", base.trim_end_matches('/'))).await
}

async fn fetch(url: &str) -> Option<TaskMetadata> {
    let client: Client<_, http_body_util::Empty<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = url.parse().ok()?;
    let response = tokio::time::timeout(Duration::from_secs(2), client.get(uri))
        .await
        .ok()?
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body = response.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_v4_task_document() {
        let document = r#"{"Cluster":"arn:aws:ecs:us-east-1:1:cluster/prod","TaskARN":"arn:aws:ecs:us-east-1:1:task/prod/abc123",
            "Family":"stream-worker","Revision":"7","PullStartedAt":"2026-11-30T08:00:00Z","Containers":[]}"#;
        let metadata: TaskMetadata = serde_json::from_str(document).unwrap();
        assert_eq!(metadata.task_id(), Some("abc123"));
        let attributes = metadata.resource_attributes();
        assert!(attributes.contains(&("aws.ecs.task.family".into(), "stream-worker".into())));
        assert_eq!(attributes.len(), 4);
    }

    #[tokio::test]
    async fn a_silent_endpoint_yields_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        assert_eq!(fetch(&format!("http://127.0.0.1:{port}/task")).await, None);
    }
}
