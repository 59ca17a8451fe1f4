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
    doc: "ECS task metadata endpoint v4, set by ECS; read when present (task id for `OWNER_ID` \
         and `WORKER_ID`, `task_arn` for `worker:metadata:{user_id}`, OTLP resource \
         attributes); its presence is what *production* means for the local credentials key",
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
    /// `FARGATE` or `EC2`.
    #[serde(rename = "LaunchType")]
    pub launch_type: Option<String>,
    /// The task's containers (for their network addresses).
    #[serde(rename = "Containers", default)]
    pub containers: Vec<ContainerMetadata>,
}

/// One container of the task, as far as leasehold reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerMetadata {
    /// The container's networks (in `awsvpc` mode: the task's ENI).
    #[serde(rename = "Networks", default)]
    pub networks: Vec<ContainerNetwork>,
}

/// One network of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerNetwork {
    /// `awsvpc`, `bridge`, `host` …
    #[serde(rename = "NetworkMode")]
    pub network_mode: Option<String>,
    /// Private IPv4 addresses on that network.
    #[serde(rename = "IPv4Addresses", default)]
    pub ipv4_addresses: Vec<String>,
}

impl TaskMetadata {
    /// The task id (last segment of the ARN), a natural `OWNER_ID`.
    pub fn task_id(&self) -> Option<&str> {
        self.task_arn
            .as_deref()
            .and_then(|arn| arn.rsplit('/').next())
    }

    /// The task's private IPv4 address in `awsvpc` mode (Fargate's only mode):
    /// every container of the task shares it, so the sidecar answers there.
    /// `None` in other network modes, where a container address is not one
    /// the dashboard could reach.
    pub fn private_ipv4(&self) -> Option<std::net::Ipv4Addr> {
        self.containers
            .iter()
            .flat_map(|container| &container.networks)
            .filter(|network| network.network_mode.as_deref() == Some("awsvpc"))
            .flat_map(|network| &network.ipv4_addresses)
            .find_map(|address| address.parse().ok())
    }

    /// OTLP resource attributes (`cloud.*` and `aws.ecs.*` of the OpenTelemetry
    /// semantic conventions). Region and account come from the task ARN
    /// (`arn:aws:ecs:{region}:{account}:task/…`); nothing is guessed off ECS.
    pub fn resource_attributes(&self) -> Vec<(String, String)> {
        let arn_part = |index: usize| {
            self.task_arn
                .as_deref()
                .and_then(|arn| arn.split(':').nth(index))
                .filter(|part| !part.is_empty())
                .map(str::to_owned)
        };
        let on_ecs = self.task_arn.is_some().then(|| "aws".to_owned());
        [
            ("cloud.provider", on_ecs.clone()),
            ("cloud.platform", on_ecs.map(|_| "aws_ecs".to_owned())),
            ("cloud.region", arn_part(3)),
            ("cloud.account.id", arn_part(4)),
            ("cloud.availability_zone", self.availability_zone.clone()),
            ("cloud.resource_id", self.task_arn.clone()),
            ("aws.ecs.cluster.arn", self.cluster.clone()),
            ("aws.ecs.task.arn", self.task_arn.clone()),
            ("aws.ecs.task.id", self.task_id().map(str::to_owned)),
            ("aws.ecs.task.family", self.family.clone()),
            ("aws.ecs.task.revision", self.revision.clone()),
            (
                "aws.ecs.launchtype",
                self.launch_type.as_deref().map(str::to_ascii_lowercase),
            ),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|v| (key.to_owned(), v)))
        .collect()
    }
}

/// Reads the task metadata if the endpoint variable is set; `None` off ECS or
/// when the endpoint does not answer within two seconds (for callers that
/// only decorate, e.g. resource attributes).
pub async fn task_metadata() -> Option<TaskMetadata> {
    task_identity().await.ok().flatten()
}

/// On ECS, the task's identity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "ECS_CONTAINER_METADATA_URI_V4 is set (running on ECS) but the task ARN could not be read from the task metadata endpoint: {0}"
)]
pub struct IdentityError(pub String);

/// The task metadata where identity matters (a broker worker's `task_id`,
/// which the maintenance sweep compares with ECS's task list): `Ok(None)` off
/// ECS (the variable is unset), the metadata with a task ARN on ECS, and an
/// error on ECS when the endpoint does not answer or names no task ARN. A
/// caller must not then fall back to a local id: the sweep would take the
/// worker's mark for an orphan's and its task for an unmarked one.
pub async fn task_identity() -> Result<Option<TaskMetadata>, IdentityError> {
    task_identity_at(
        std::env::var(ECS_CONTAINER_METADATA_URI_V4.name)
            .ok()
            .as_deref(),
    )
    .await
}

/// [`task_identity`] with the endpoint variable's value given.
pub async fn task_identity_at(base: Option<&str>) -> Result<Option<TaskMetadata>, IdentityError> {
    let Some(base) = base.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let metadata = fetch(&format!("{}/task", base.trim_end_matches('/')))
        .await
        .map_err(IdentityError)?;
    if metadata.task_arn.as_deref().is_none_or(str::is_empty) {
        return Err(IdentityError("the task document has no TaskARN".into()));
    }
    Ok(Some(metadata))
}

async fn fetch(url: &str) -> Result<TaskMetadata, String> {
    let client: Client<_, http_body_util::Empty<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = url
        .parse()
        .map_err(|_| "the endpoint is not a valid URL".to_owned())?;
    let response = tokio::time::timeout(Duration::from_secs(2), client.get(uri))
        .await
        .map_err(|_| "no answer within 2 s".to_owned())?
        .map_err(|err| format!("request failed: {err}"))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|err| format!("reading the answer failed: {err}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|err| format!("not a task document: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_v4_task_document() {
        let document = r#"{"Cluster":"arn:aws:ecs:us-east-1:123456789012:cluster/prod","TaskARN":"arn:aws:ecs:us-east-1:123456789012:task/prod/abc123",
            "Family":"stream-worker","Revision":"7","PullStartedAt":"2026-11-30T08:00:00Z","AvailabilityZone":"us-east-1a",
            "LaunchType":"FARGATE","Containers":[]}"#;
        let metadata: TaskMetadata = serde_json::from_str(document).unwrap();
        assert_eq!(metadata.task_id(), Some("abc123"));
        let attributes = metadata.resource_attributes();
        for (key, value) in [
            ("cloud.provider", "aws"),
            ("cloud.platform", "aws_ecs"),
            ("cloud.region", "us-east-1"),
            ("cloud.account.id", "123456789012"),
            ("cloud.availability_zone", "us-east-1a"),
            ("aws.ecs.task.id", "abc123"),
            ("aws.ecs.task.family", "stream-worker"),
            ("aws.ecs.launchtype", "fargate"),
        ] {
            assert!(
                attributes.contains(&(key.into(), value.into())),
                "{key}={value} missing from {attributes:?}"
            );
        }
        assert_eq!(attributes.len(), 12);
        assert!(TaskMetadata::default().resource_attributes().is_empty());
        assert_eq!(metadata.private_ipv4(), None, "no containers listed");
    }

    #[test]
    fn the_awsvpc_address_is_the_task_address() {
        let document = r#"{"TaskARN":"arn:aws:ecs:us-east-1:1:task/c/t","Containers":[
            {"Name":"x","Networks":[{"NetworkMode":"bridge","IPv4Addresses":["172.17.0.2"]}]},
            {"Name":"worker","Networks":[{"NetworkMode":"awsvpc","IPv4Addresses":["10.0.3.7"]}]}]}"#;
        let metadata: TaskMetadata = serde_json::from_str(document).unwrap();
        assert_eq!(metadata.private_ipv4(), Some([10, 0, 3, 7].into()));
    }

    #[tokio::test]
    async fn a_silent_endpoint_yields_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        assert!(
            fetch(&format!("http://127.0.0.1:{port}/task"))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn identity_is_required_on_ecs_and_absent_off_it() {
        assert_eq!(task_identity_at(None).await, Ok(None));
        assert_eq!(task_identity_at(Some("")).await, Ok(None));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let err = task_identity_at(Some(&format!("http://127.0.0.1:{port}")))
            .await
            .expect_err("on ECS, an endpoint that does not answer is an error");
        assert!(err.to_string().contains("task ARN"), "{err}");
        // A document without a TaskARN is no identity either.
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = server.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let body = r#"{"Cluster":"prod"}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
        });
        let err = task_identity_at(Some(&format!("http://127.0.0.1:{port}/")))
            .await
            .expect_err("no TaskARN");
        assert!(err.to_string().contains("no TaskARN"), "{err}");
    }
}
