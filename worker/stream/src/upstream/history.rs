//! An upstream's history over HTTP (`UPSTREAM_RESUME=backfill`): the events a
//! live-start upstream did not deliver, read page by page from a REST endpoint
//! such as an exchange's historical-trades API.
//!
//! The same client reads an order book's REST snapshots
//! (`UPSTREAM_RESUME=snapshot`, [`History::snapshot`]): one GET of the book,
//! its sequence at `UPSTREAM_SNAPSHOT_SEQ_POINTER`, under the same request
//! slots (`BACKFILL_CONCURRENCY`), timeouts and retries as a history page.
//!
//! One [`History::page`] call is one request: the URL template gets the stream
//! and the range, the body's items are found at their own pointers (history
//! APIs name fields differently from their streams), and each item's text as
//! received becomes the event's payload. Retries, `Retry-After` and giving up
//! are [`fetch_page`]'s, the range bookkeeping is `crate::sequence`'s.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold_control::clock::SystemClock;
use leasehold_platform::backoff::Backoff;
use leasehold_telemetry::{BackfillWait, TelemetryEvent, TelemetrySink};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::UpstreamEvent;
use super::extract::Extractor;
use super::redact::redact_url;
use super::template::render_history_url;

/// Largest history response read (a page of 1,000 trades is ~200 KiB).
pub const MAX_BODY_BYTES: usize = 16 << 20;
/// The longest `Retry-After` a backfill waits. Longer (Binance answers `418`
/// with minutes to days when an IP is banned for ignoring `429`s) gives the
/// range up at once, recorded as a gap: asking again before the server said
/// only extends a ban, and a stream must not hold its live events that long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// Where and how a history is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// `http(s)://` template with `{stream_id}`, `{stream_id_upper}`,
    /// `{from_seq}` and `{to_seq}` (`UPSTREAM_BACKFILL_URL`).
    pub url_template: String,
    /// Pointer to the array of items (empty: the body is the array).
    pub items_pointer: String,
    /// Pointer, inside an item, to its sequence.
    pub seq_pointer: String,
    /// Pointer, inside an item, to its id.
    pub id_pointer: String,
    /// Pointer, inside an item, to its time in unix ms, if any.
    pub ts_pointer: Option<String>,
    /// Bound on one request, connect to last byte.
    pub request_timeout: Duration,
    /// Failed requests of one page before the range is given up.
    pub max_attempts: u32,
    /// Waits between failed requests (full jitter).
    pub retry: Backoff,
    /// History requests in flight at most, per worker, over all its streams
    /// (`BACKFILL_CONCURRENCY`): a worker that takes over 500 streams must not
    /// fire 500 backfills at once at an exchange's rate limit.
    pub concurrency: usize,
    /// Where an order book's snapshots are read (`UPSTREAM_RESUME=snapshot`);
    /// `url_template` is then empty unless a history is read too.
    pub snapshot: Option<SnapshotEndpoint>,
}

/// An order book's REST snapshot (Binance `GET /api/v3/depth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEndpoint {
    /// `http(s)://` template with `{stream_id}` and `{stream_id_upper}`
    /// (`UPSTREAM_SNAPSHOT_URL`).
    pub url_template: String,
    /// Pointer to the book's sequence in the body (Binance `/lastUpdateId`,
    /// `UPSTREAM_SNAPSHOT_SEQ_POINTER`).
    pub seq_pointer: String,
}

impl Default for HistoryConfig {
    /// Items are the body's array at the feed's pointers; 10 s per request,
    /// eight attempts a page (about 30 s of an outage) before a gap.
    fn default() -> Self {
        HistoryConfig {
            url_template: String::new(),
            items_pointer: String::new(),
            seq_pointer: "/seq".to_owned(),
            id_pointer: "/event_id".to_owned(),
            ts_pointer: None,
            request_timeout: Duration::from_secs(10),
            max_attempts: 8,
            retry: Backoff {
                base: Duration::from_millis(250),
                cap: Duration::from_secs(8),
            },
            concurrency: BACKFILL_CONCURRENCY,
            snapshot: None,
        }
    }
}

/// [`HistoryConfig::concurrency`]'s default.
pub const BACKFILL_CONCURRENCY: usize = 4;

/// A history that lets at most `concurrency` requests run at once (one per
/// worker, shared by all its streams); the others wait their turn, and each
/// wait is reported (`StreamBackfillWait`, reason `concurrency`).
pub struct BoundedHistory {
    inner: Arc<dyn History>,
    slots: tokio::sync::Semaphore,
    telemetry: Arc<dyn TelemetrySink>,
}

impl BoundedHistory {
    /// `inner`, `concurrency` requests at a time (at least one).
    pub fn new(
        inner: Arc<dyn History>,
        concurrency: usize,
        telemetry: Arc<dyn TelemetrySink>,
    ) -> Self {
        BoundedHistory {
            inner,
            slots: tokio::sync::Semaphore::new(concurrency.max(1)),
            telemetry,
        }
    }
}

#[async_trait::async_trait]
impl History for BoundedHistory {
    async fn page(
        &self,
        stream_id: &str,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<UpstreamEvent>, HistoryError> {
        let _slot = self.slot(stream_id).await?;
        self.inner.page(stream_id, from_seq, to_seq).await
    }

    async fn snapshot(&self, stream_id: &str) -> Result<UpstreamEvent, HistoryError> {
        let _slot = self.slot(stream_id).await?;
        self.inner.snapshot(stream_id).await
    }
}

impl BoundedHistory {
    /// One request slot, reporting the wait when there was none free.
    async fn slot(
        &self,
        stream_id: &str,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, HistoryError> {
        let shut = || HistoryError::Unavailable("the history is shutting down".into());
        match self.slots.try_acquire() {
            Ok(slot) => Ok(slot),
            Err(tokio::sync::TryAcquireError::Closed) => Err(shut()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let asked = tokio::time::Instant::now();
                let slot = self.slots.acquire().await.map_err(|_| shut())?;
                self.telemetry.emit(TelemetryEvent::StreamBackfillWait {
                    stream_id: stream_id.to_owned(),
                    reason: BackfillWait::Concurrency,
                    duration: asked.elapsed(),
                });
                Ok(slot)
            }
        }
    }
}

impl HistoryConfig {
    /// Every problem with this configuration.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(snapshot) = &self.snapshot {
            problems.extend(snapshot.validate());
            if self.url_template.is_empty() {
                return problems;
            }
        }
        let sample = render_history_url(&self.url_template, "stream", 1, 2);
        let redacted = redact_url(&self.url_template);
        match url::Url::parse(&sample) {
            Ok(url) if !matches!(url.scheme(), "http" | "https") => problems.push(format!(
                "backfill URL {redacted} must start with http:// or https://"
            )),
            Ok(url) if url.host().is_none() => {
                problems.push(format!("backfill URL {redacted} names no host"))
            }
            Ok(_) => {}
            Err(_) => problems.push(format!("backfill URL {redacted} is not a valid URL")),
        }
        if !self.url_template.contains("{from_seq}") {
            problems.push(format!(
                "backfill URL {redacted} must contain {{from_seq}} (where the page starts)"
            ));
        }
        let ts = self.ts_pointer.clone().unwrap_or_else(|| "/".to_owned());
        for (name, pointer) in [
            ("backfill sequence", &self.seq_pointer),
            ("backfill id", &self.id_pointer),
            ("backfill time", &ts),
        ] {
            if !pointer.starts_with('/') {
                problems.push(format!(
                    "{name} pointer {pointer:?} must be a JSON pointer starting with /"
                ));
            }
        }
        if !self.items_pointer.is_empty() && !self.items_pointer.starts_with('/') {
            problems.push(format!(
                "backfill items pointer {:?} must be empty or start with /",
                self.items_pointer
            ));
        }
        if self.request_timeout.is_zero() {
            problems.push("backfill request timeout must be positive".to_owned());
        }
        if self.max_attempts == 0 {
            problems.push("backfill attempts must be at least 1".to_owned());
        }
        problems
    }
}

impl SnapshotEndpoint {
    /// Every problem with this endpoint.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let redacted = redact_url(&self.url_template);
        match url::Url::parse(&render_history_url(&self.url_template, "stream", 0, 0)) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
            _ => problems.push(format!(
                "snapshot URL {redacted} must be an http:// or https:// URL with a host"
            )),
        }
        if !self.seq_pointer.starts_with('/') {
            problems.push(format!(
                "snapshot sequence pointer {:?} must be a JSON pointer starting with /",
                self.seq_pointer
            ));
        }
        problems
    }
}

/// Why a page could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// Connect, timeout, 5xx: worth another try after a backoff.
    #[error("history unavailable: {0}")]
    Unavailable(String),
    /// 429 or 418: the server says when to come back.
    #[error("history rate limited (HTTP {status})")]
    RateLimited {
        /// 429 or 418.
        status: u16,
        /// The server's `Retry-After`, if it gave one in seconds.
        retry_after: Option<Duration>,
    },
    /// Another 4xx, or a body that is not the configured shape: retrying the
    /// same request cannot help.
    #[error("history refused the request: {0}")]
    Refused(String),
}

fn no_snapshot_url() -> HistoryError {
    HistoryError::Refused("no snapshot URL is configured".into())
}

/// A source of past events per stream.
#[async_trait::async_trait]
pub trait History: Send + Sync + 'static {
    /// One page of events from `from_seq` (the server decides how many; items
    /// outside `from_seq..=to_seq` are dropped by the caller).
    async fn page(
        &self,
        stream_id: &str,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<UpstreamEvent>, HistoryError>;

    /// The order book's snapshot now: the body as received, at the sequence
    /// it states (no event id). Refused where no snapshot endpoint is set.
    async fn snapshot(&self, stream_id: &str) -> Result<UpstreamEvent, HistoryError> {
        let _ = stream_id;
        Err(no_snapshot_url())
    }
}

/// A REST history endpoint.
pub struct HttpHistory {
    config: HistoryConfig,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    items: Extractor,
    /// The snapshot's sequence, when snapshots are read.
    snapshot_seq: Option<Extractor>,
}

impl std::fmt::Debug for HttpHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHistory")
            .field("url", &redact_url(&self.config.url_template))
            .finish()
    }
}

impl HttpHistory {
    /// A client for `config` (public roots for `https://`).
    pub fn new(config: HistoryConfig) -> Result<Self, HistoryError> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|err| HistoryError::Refused(err.to_string()))?
        .with_root_certificates(rustls::RootCertStore::from_iter(
            webpki_roots::TLS_SERVER_ROOTS.iter().cloned(),
        ))
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let items = Extractor::new(&[
            config.seq_pointer.as_str(),
            config.id_pointer.as_str(),
            config.ts_pointer.as_deref().unwrap_or("none"),
        ]);
        let snapshot_seq = config
            .snapshot
            .as_ref()
            .map(|snapshot| Extractor::new(&[snapshot.seq_pointer.as_str()]));
        Ok(HttpHistory {
            client: Client::builder(TokioExecutor::new()).build(connector),
            items,
            snapshot_seq,
            config,
        })
    }

    /// One GET, bounded by the request timeout, connect to last byte.
    async fn get_within(&self, url: &str) -> Result<Bytes, HistoryError> {
        tokio::time::timeout(self.config.request_timeout, self.get(url))
            .await
            .map_err(|_| {
                HistoryError::Unavailable(format!(
                    "{}: no answer within {:?}",
                    redact_url(url),
                    self.config.request_timeout
                ))
            })?
    }

    async fn get(&self, url: &str) -> Result<Bytes, HistoryError> {
        let redacted = redact_url(url);
        let uri: hyper::Uri = url
            .parse()
            .map_err(|_| HistoryError::Refused(format!("{redacted} is not a valid URI")))?;
        let request = hyper::Request::get(uri)
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, "leasehold")
            .body(Empty::new())
            .map_err(|err| HistoryError::Refused(err.to_string()))?;
        let response = self.client.request(request).await.map_err(|err| {
            // hyper's error text names no URL parts; the redacted URL says where.
            HistoryError::Unavailable(format!("{redacted}: {}", error_chain(&err)))
        })?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|err| HistoryError::Unavailable(format!("{redacted}: body: {err}")))?
            .to_bytes();
        match status {
            200..=299 => Ok(body),
            429 | 418 => Err(HistoryError::RateLimited {
                status,
                retry_after,
            }),
            500..=599 => Err(HistoryError::Unavailable(format!(
                "{redacted}: HTTP {status}"
            ))),
            _ => Err(HistoryError::Refused(format!("{redacted}: HTTP {status}"))),
        }
    }

    /// The events of one response body.
    fn parse(&self, body: &[u8]) -> Result<Vec<UpstreamEvent>, HistoryError> {
        let shape = |what: &str| HistoryError::Refused(format!("history body {what}"));
        let text = std::str::from_utf8(body).map_err(|_| shape("is not UTF-8"))?;
        // The items stay raw text: a backfilled event's payload is the item as
        // the history sent it.
        let root: &RawValue = serde_json::from_str(text).map_err(|_| shape("is not JSON"))?;
        let array: Vec<&RawValue> = if self.config.items_pointer.is_empty() {
            serde_json::from_str(root.get()).map_err(|_| shape("is not an array"))?
        } else {
            items_at(root, &self.config.items_pointer)
                .ok_or_else(|| shape("has no array at the items pointer"))?
        };
        let received_at = Instant::now();
        let mut events = Vec::with_capacity(array.len());
        for item in array {
            let fields = self
                .items
                .extract(item.get())
                .map_err(|_| shape("holds an item that is not JSON"))?;
            let [seq, id, ts] = <[Option<Value>; 3]>::try_from(fields).unwrap_or_default();
            let seq = seq
                .and_then(|v| match v {
                    Value::Number(n) => n.as_u64(),
                    Value::String(s) => s.parse().ok(),
                    _ => None,
                })
                .ok_or_else(|| shape("holds an item without a sequence at its pointer"))?;
            let event_id = match id {
                Some(Value::String(s)) if !s.is_empty() => s,
                Some(Value::Number(n)) => n.to_string(),
                _ => return Err(shape("holds an item without an id at its pointer")),
            };
            let arrival_lag = ts
                .as_ref()
                .and_then(Value::as_f64)
                .map(|event_ms| SystemClock.seconds_since(event_ms));
            events.push(UpstreamEvent {
                seq,
                first_seq: None,
                snapshot: false,
                event_id,
                payload: item.get().into(),
                received_at,
                arrival_lag,
            });
        }
        Ok(events)
    }
}

/// The sequence a snapshot body states at `seq`'s pointer.
fn snapshot_seq(seq: &Extractor, body: &str) -> Result<u64, HistoryError> {
    let refused = |what: &str| HistoryError::Refused(format!("snapshot body {what}"));
    let fields = seq.extract(body).map_err(|_| refused("is not JSON"))?;
    match fields.into_iter().next().flatten() {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| refused("has no sequence at UPSTREAM_SNAPSHOT_SEQ_POINTER"))
}

/// The array at `pointer` inside `root`, items kept as raw text.
fn items_at<'a>(root: &'a RawValue, pointer: &str) -> Option<Vec<&'a RawValue>> {
    let mut current = root;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let text = current.get().trim_start();
        current = if text.starts_with('{') {
            let object: std::collections::HashMap<String, &RawValue> =
                serde_json::from_str(current.get()).ok()?;
            object.get(&token).copied()?
        } else if text.starts_with('[') {
            let array: Vec<&RawValue> = serde_json::from_str(current.get()).ok()?;
            array.get(token.parse::<usize>().ok()?).copied()?
        } else {
            return None;
        };
    }
    serde_json::from_str(current.get()).ok()
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[async_trait::async_trait]
impl History for HttpHistory {
    async fn page(
        &self,
        stream_id: &str,
        from_seq: u64,
        to_seq: u64,
    ) -> Result<Vec<UpstreamEvent>, HistoryError> {
        let url = render_history_url(&self.config.url_template, stream_id, from_seq, to_seq);
        let body = self.get_within(&url).await?;
        self.parse(&body)
    }

    async fn snapshot(&self, stream_id: &str) -> Result<UpstreamEvent, HistoryError> {
        let (Some(endpoint), Some(seq)) = (&self.config.snapshot, &self.snapshot_seq) else {
            return Err(no_snapshot_url());
        };
        let url = render_history_url(&endpoint.url_template, stream_id, 0, 0);
        let body = self.get_within(&url).await?;
        let text = String::from_utf8(body.to_vec())
            .map_err(|_| HistoryError::Refused("snapshot body is not UTF-8".into()))?;
        Ok(UpstreamEvent {
            seq: snapshot_seq(seq, &text)?,
            first_seq: None,
            snapshot: false,
            event_id: String::new(),
            payload: text.into(),
            received_at: Instant::now(),
            arrival_lag: None,
        })
    }
}

/// One page with the retry policy: outages and rate limits are retried (a
/// rate limit after its `Retry-After`, else the backoff) until
/// `max_attempts` requests failed; a refusal is final at once. `Err` carries
/// the last error, for the log.
pub async fn fetch_page(
    history: &dyn History,
    config: &HistoryConfig,
    telemetry: &dyn TelemetrySink,
    stream_id: &str,
    from_seq: u64,
    to_seq: u64,
) -> Result<Vec<UpstreamEvent>, HistoryError> {
    with_retries(config, telemetry, stream_id, from_seq, || {
        history.page(stream_id, from_seq, to_seq)
    })
    .await
}

/// The order book's snapshot, with [`fetch_page`]'s retry policy.
pub async fn fetch_snapshot(
    history: &dyn History,
    config: &HistoryConfig,
    telemetry: &dyn TelemetrySink,
    stream_id: &str,
) -> Result<UpstreamEvent, HistoryError> {
    with_retries(config, telemetry, stream_id, 0, || {
        history.snapshot(stream_id)
    })
    .await
}

async fn with_retries<T, F, Fut>(
    config: &HistoryConfig,
    telemetry: &dyn TelemetrySink,
    stream_id: &str,
    from_seq: u64,
    mut request: F,
) -> Result<T, HistoryError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, HistoryError>>,
{
    let mut attempt = 0;
    loop {
        let error = match request().await {
            Ok(found) => return Ok(found),
            Err(error @ HistoryError::Refused(_)) => return Err(error),
            Err(error) => error,
        };
        attempt += 1;
        if attempt >= config.max_attempts {
            return Err(error);
        }
        let delay = match &error {
            HistoryError::RateLimited {
                retry_after: Some(after),
                ..
            } if *after > MAX_RETRY_AFTER => {
                tracing::warn!(
                    stream_id,
                    from_seq,
                    ?after,
                    "the history asks to wait longer than a backfill may; giving the range up"
                );
                return Err(error);
            }
            HistoryError::RateLimited {
                retry_after: Some(after),
                ..
            } => {
                telemetry.emit(TelemetryEvent::StreamBackfillWait {
                    stream_id: stream_id.to_owned(),
                    reason: BackfillWait::RetryAfter,
                    duration: *after,
                });
                *after
            }
            _ => config.retry.delay(attempt - 1),
        };
        tracing::debug!(stream_id, from_seq, attempt, error = %error, ?delay, "history page failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_telemetry::{LogSink, RecordingSink};

    fn config(items_pointer: &str) -> HistoryConfig {
        HistoryConfig {
            url_template: "http://127.0.0.1:1/h?symbol={stream_id_upper}&fromId={from_seq}".into(),
            items_pointer: items_pointer.into(),
            seq_pointer: "/id".into(),
            id_pointer: "/id".into(),
            ts_pointer: Some("/time".into()),
            request_timeout: Duration::from_secs(1),
            max_attempts: 3,
            retry: Backoff {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(100),
            },
            concurrency: 2,
            snapshot: None,
        }
    }

    /// Records the most pages in flight at once.
    struct Slow {
        in_flight: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl History for Slow {
        async fn page(&self, _: &str, _: u64, _: u64) -> Result<Vec<UpstreamEvent>, HistoryError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.in_flight.fetch_sub(1, SeqCst);
            Ok(Vec::new())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_runs_at_most_its_backfill_concurrency_of_requests() {
        let slow = Arc::new(Slow {
            in_flight: 0.into(),
            most: 0.into(),
        });
        let telemetry = RecordingSink::new();
        let bounded = Arc::new(BoundedHistory::new(
            slow.clone(),
            2,
            Arc::new(telemetry.clone()),
        ));
        let started = Instant::now();
        let pages: Vec<_> = (0..10)
            .map(|n| {
                let bounded = bounded.clone();
                tokio::spawn(async move { bounded.page(&format!("s{n}"), 1, 2).await })
            })
            .collect();
        for page in pages {
            assert_eq!(page.await.unwrap(), Ok(Vec::new()));
        }
        assert_eq!(slow.most.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(500),
            "10 pages, 2 at a time"
        );
        // The first two found a slot; each of the other eight waited for one.
        let waits: Vec<Duration> = telemetry
            .take()
            .into_iter()
            .filter_map(|event| match event {
                TelemetryEvent::StreamBackfillWait {
                    reason: BackfillWait::Concurrency,
                    duration,
                    ..
                } => Some(duration),
                _ => None,
            })
            .collect();
        assert_eq!(waits.len(), 8, "{waits:?}");
        assert_eq!(waits.iter().max(), Some(&Duration::from_millis(400)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_past_the_maximum_gives_the_range_up_at_once() {
        // Binance's ban: 418 with hours to wait.
        let banned = HistoryError::RateLimited {
            status: 418,
            retry_after: Some(Duration::from_secs(7_200)),
        };
        let history = Scripted(std::sync::Mutex::new(vec![
            Err(banned.clone()),
            Ok(Vec::new()),
        ]));
        let started = Instant::now();
        assert_eq!(
            fetch_page(&history, &config(""), &LogSink, "s", 1, 2).await,
            Err(banned)
        );
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no request before the server's time"
        );
        // Up to the maximum, the server's time is waited in full.
        let limited = HistoryError::RateLimited {
            status: 418,
            retry_after: Some(Duration::from_secs(300)),
        };
        let history = Scripted(std::sync::Mutex::new(vec![Err(limited), Ok(Vec::new())]));
        let started = Instant::now();
        assert_eq!(
            fetch_page(&history, &config(""), &LogSink, "s", 1, 2).await,
            Ok(Vec::new())
        );
        assert_eq!(started.elapsed(), Duration::from_secs(300));
    }

    #[test]
    fn items_are_read_at_their_pointers_and_kept_as_sent() {
        let history = HttpHistory::new(config("")).unwrap();
        let body = br#"[{"id": 7, "price": "1.0", "time": 1700000000000}, {"id":8,"price":"2.0"}]"#;
        let events = history.parse(body).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].seq, events[0].event_id.as_str()), (7, "7"));
        assert_eq!(
            events[0].payload,
            r#"{"id": 7, "price": "1.0", "time": 1700000000000}"#
        );
        assert!(events[0].arrival_lag.is_some() && events[1].arrival_lag.is_none());
        let nested = HttpHistory::new(config("/result/list")).unwrap();
        let events = nested
            .parse(br#"{"retCode":0,"result":{"list":[{"id":"9"}]}}"#)
            .unwrap();
        assert_eq!(events[0].seq, 9);
        assert!(nested.parse(br#"{"result":{}}"#).is_err());
        assert!(history.parse(br#"[{"price":"1"}]"#).is_err());
        assert!(history.parse(b"not json").is_err());
    }

    #[test]
    fn validation_lists_problems_without_credentials() {
        let mut bad = config("items");
        bad.url_template = "ftp://user:hunter2@host/x".into();
        bad.seq_pointer = "id".into();
        bad.max_attempts = 0;
        let problems = bad.validate();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(!problems.join(" ").contains("hunter2"));
        assert!(config("").validate().is_empty());
    }

    struct Scripted(std::sync::Mutex<Vec<Result<Vec<UpstreamEvent>, HistoryError>>>);

    #[async_trait::async_trait]
    impl History for Scripted {
        async fn page(&self, _: &str, _: u64, _: u64) -> Result<Vec<UpstreamEvent>, HistoryError> {
            self.0.lock().unwrap().remove(0)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_wait_their_retry_after_and_refusals_are_final() {
        let limited = HistoryError::RateLimited {
            status: 429,
            retry_after: Some(Duration::from_secs(7)),
        };
        let history = Scripted(std::sync::Mutex::new(vec![Err(limited), Ok(Vec::new())]));
        let started = Instant::now();
        let telemetry = RecordingSink::new();
        assert_eq!(
            fetch_page(&history, &config(""), &telemetry, "s", 1, 2).await,
            Ok(Vec::new())
        );
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        assert_eq!(
            telemetry.take(),
            [TelemetryEvent::StreamBackfillWait {
                stream_id: "s".into(),
                reason: BackfillWait::RetryAfter,
                duration: Duration::from_secs(7),
            }]
        );
        let refused = HistoryError::Refused("HTTP 400".into());
        let history = Scripted(std::sync::Mutex::new(vec![Err(refused.clone())]));
        assert_eq!(
            fetch_page(&history, &config(""), &LogSink, "s", 1, 2).await,
            Err(refused)
        );
        let down = || Err(HistoryError::Unavailable("HTTP 503".into()));
        let history = Scripted(std::sync::Mutex::new(vec![down(), down(), down(), down()]));
        assert!(matches!(
            fetch_page(&history, &config(""), &LogSink, "s", 1, 2).await,
            Err(HistoryError::Unavailable(_))
        ));
        assert_eq!(
            history.0.lock().unwrap().len(),
            1,
            "three attempts, then given up"
        );
    }
}
