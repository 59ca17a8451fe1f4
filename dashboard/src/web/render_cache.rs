//! Rendered responses shared between clients until the next snapshot.
//!
//! Every page and API body is a function of the collector's snapshot (and the
//! history and trends published with it) plus the request's path, query and
//! content coding. So the first request for a view after a new snapshot renders
//! and compresses it; every other client (and the same client's next poll)
//! gets the same bytes until the collector publishes again. On call, a room of
//! people watching the 24 h timeline costs one render per refresh, not one
//! per person.
//!
//! Renders happen at snapshot time where possible: the views requested in
//! one generation are *hot*, and after the collector publishes the next
//! snapshot a background task ([`crate::web::router::prewarm`]) renders them again
//! before their clients' next poll, so a client's update is the shared bytes
//! (a client that asks while that render runs waits for it, not for a second one).
//!
//! Bounded: at most [`MAX_ENTRIES`] responses and [`MAX_BYTES`] in all, all of
//! one generation (a new generation drops the old entries on the first access);
//! a body over [`MAX_BODY`] is served but not kept. Keys are normalised (query
//! pairs sorted by name, one content coding) and a key longer than
//! [`MAX_KEY`] is not cached, so odd URLs cannot crowd out the common ones
//! beyond the entry bound.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};

/// Responses kept per generation.
pub const MAX_ENTRIES: usize = 16;
/// Bytes kept in all (bodies only; they dominate).
pub const MAX_BYTES: usize = 16 * 1024 * 1024;
/// A body larger than this is served but not kept. The 10,000-row view on one
/// page fits as browsers ask for it (gzip or br: 100–200 KiB, even with a data
/// gap on every stream); uncompressed it is 3.6 MiB, and 4.6 MiB with a data
/// gap on every stream, which is then rendered for each such request.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// Longest key cached (path, normalised query and coding).
pub const MAX_KEY: usize = 2_048;

/// One rendered response.
#[derive(Debug)]
pub struct Cached {
    /// Status (only successes are kept).
    pub status: StatusCode,
    /// Headers as the inner service set them (content type and coding, `Vary`).
    pub headers: HeaderMap,
    /// The body, compressed as the key's coding says.
    pub body: Bytes,
}

impl Cached {
    /// A response carrying these bytes (cheap: `Bytes` is shared).
    pub fn response(&self) -> axum::response::Response {
        let mut response = axum::response::Response::new(Body::from(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// What to request again to render a hot view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warm {
    /// Path and query as asked.
    pub uri: String,
    /// The coding it was rendered in.
    pub coding: Option<&'static str>,
}

struct Entry {
    key: String,
    warm: Warm,
    cached: Arc<Cached>,
    /// A client asked for it (a prewarm render nobody fetched is not hot:
    /// otherwise a view would be rendered every snapshot forever after its
    /// last viewer left).
    served: bool,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    entries: VecDeque<Entry>,
    bytes: usize,
    /// The views the last generation that had any served (at most
    /// [`MAX_ENTRIES`]), until the prewarm takes them.
    hot: Vec<Warm>,
}

/// The cache: entries of one snapshot generation.
#[derive(Default)]
pub struct RenderCache {
    inner: Mutex<Inner>,
    /// Held while a response missing from the cache is rendered, so clients
    /// asking at once after a new snapshot wait for one render, not make one each.
    rendering: tokio::sync::Mutex<()>,
}

impl RenderCache {
    /// Taken while rendering a response the cache lacks.
    pub fn rendering(&self) -> &tokio::sync::Mutex<()> {
        &self.rendering
    }

    /// The response rendered for `key` in `generation`, if any; `client`:
    /// asked by a client (which makes the view hot for the next generation).
    pub fn get(&self, generation: u64, key: &str, client: bool) -> Option<Arc<Cached>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.roll(generation);
        let entry = inner.entries.iter_mut().find(|e| e.key == key)?;
        entry.served |= client;
        Some(entry.cached.clone())
    }

    /// Keeps `cached` for `key` in `generation` (oldest entries leave first
    /// when a bound is reached). Returns whether it was kept.
    pub fn insert(
        &self,
        generation: u64,
        key: String,
        warm: Warm,
        cached: Arc<Cached>,
        client: bool,
    ) -> bool {
        if cached.body.len() > MAX_BODY || key.len() > MAX_KEY || !cached.status.is_success() {
            return false;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.roll(generation);
        if generation < inner.generation {
            // Rendered from an older snapshot than the cache now holds.
            return false;
        }
        if let Some(at) = inner.entries.iter().position(|e| e.key == key)
            && let Some(old) = inner.entries.remove(at)
        {
            inner.bytes -= old.cached.body.len();
        }
        inner.bytes += cached.body.len();
        inner.entries.push_back(Entry {
            key,
            warm,
            cached,
            served: client,
        });
        while inner.entries.len() > MAX_ENTRIES || inner.bytes > MAX_BYTES {
            match inner.entries.pop_front() {
                Some(old) => inner.bytes -= old.cached.body.len(),
                None => break,
            }
        }
        true
    }

    /// The views clients asked for in the previous generation that had any,
    /// to render again for `generation` (each list is handed out once).
    pub fn hot(&self, generation: u64) -> Vec<Warm> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.roll(generation);
        std::mem::take(&mut inner.hot)
    }

    /// Entries and bytes held (tests, and the bound's proof).
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (inner.entries.len(), inner.bytes)
    }
}

impl Inner {
    /// Drops everything rendered from an older snapshot.
    fn roll(&mut self, generation: u64) {
        if generation > self.generation {
            self.generation = generation;
            let hot: Vec<Warm> = self
                .entries
                .drain(..)
                .filter(|e| e.served)
                .map(|e| e.warm)
                .collect();
            if !hot.is_empty() {
                self.hot = hot;
            }
            self.bytes = 0;
        }
    }
}

/// The content coding a request gets: `br`, else `gzip`, else none, as its
/// `Accept-Encoding` allows (a `q=0` refuses; `*` accepts any not named).
pub fn coding(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    let mut named: Vec<(String, bool)> = Vec::new();
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let refused = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        if !name.is_empty() {
            named.push((name, !refused));
        }
    }
    let wildcard = named.iter().find(|(n, _)| n == "*").map(|(_, ok)| *ok);
    let accepts = |coding: &str| match named.iter().find(|(n, _)| n == coding) {
        Some((_, ok)) => *ok,
        None => wildcard.unwrap_or(false),
    };
    ["br", "gzip"].into_iter().find(|c| accepts(c))
}

/// The cache key of a request: path, its query pairs sorted by name (a
/// stable sort: repeated names keep their order, so meaning is unchanged),
/// and the coding. `None` when the query cannot be read (served, not cached).
pub fn key(path: &str, query: Option<&str>, coding: Option<&str>) -> Option<String> {
    let mut pairs: Vec<(String, String)> = match query {
        Some(query) => serde_urlencoded::from_str(query).ok()?,
        None => Vec::new(),
    };
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let query = serde_urlencoded::to_string(&pairs).ok()?;
    let key = format!("{path}?{query}#{}", coding.unwrap_or("identity"));
    (key.len() <= MAX_KEY).then_some(key)
}

/// Whether a response may be kept: a success with no cookie being set.
pub fn cacheable(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::OK && !headers.contains_key(header::SET_COOKIE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(len: usize) -> Arc<Cached> {
        Arc::new(Cached {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from(vec![b'x'; len]),
        })
    }

    fn warm(uri: &str) -> Warm {
        Warm {
            uri: uri.into(),
            coding: Some("br"),
        }
    }

    #[test]
    fn the_views_of_the_last_busy_generation_are_hot_once() {
        let cache = RenderCache::default();
        cache.insert(1, "a#br".into(), warm("/a"), body(3), true);
        cache.insert(1, "b#br".into(), warm("/b"), body(3), true);
        assert!(cache.hot(1).is_empty(), "nothing to re-render yet");
        // Generation 2 passes unseen; 3 still re-renders what 1 served.
        assert_eq!(cache.hot(3), vec![warm("/a"), warm("/b")]);
        assert!(cache.hot(3).is_empty(), "handed out once");
        // What the prewarm renders is hot again only once a client fetches it.
        cache.insert(3, "a#br".into(), warm("/a"), body(3), false);
        cache.insert(3, "b#br".into(), warm("/b"), body(3), false);
        assert!(cache.get(3, "b#br", true).is_some());
        assert_eq!(cache.hot(4), vec![warm("/b")], "nobody watched /a");
        assert!(cache.hot(5).is_empty(), "nobody watches anything any more");
    }

    #[test]
    fn entries_live_for_one_generation() {
        let cache = RenderCache::default();
        assert!(cache.insert(1, "a".into(), warm("a"), body(3), true));
        assert!(cache.get(1, "a", true).is_some());
        assert!(cache.get(1, "b", true).is_none());
        assert!(
            cache.get(2, "a", true).is_none(),
            "a new snapshot renders again"
        );
        assert_eq!(cache.usage(), (0, 0), "the old generation is dropped");
        assert!(
            !cache.insert(1, "a".into(), warm("a"), body(3), true),
            "a render of an older snapshot is not kept"
        );
    }

    #[test]
    fn the_cache_is_bounded_by_entries_and_bytes() {
        let cache = RenderCache::default();
        for i in 0..MAX_ENTRIES * 3 {
            cache.insert(1, format!("k{i}"), warm("k"), body(10), true);
        }
        assert_eq!(cache.usage(), (MAX_ENTRIES, MAX_ENTRIES * 10));
        assert!(cache.get(1, "k0", true).is_none(), "the oldest left first");
        for i in 0..8 {
            cache.insert(1, format!("big{i}"), warm("b"), body(MAX_BODY), true);
        }
        let (_, bytes) = cache.usage();
        assert!(bytes <= MAX_BYTES, "{bytes}");
        assert!(!cache.insert(1, "huge".into(), warm("h"), body(MAX_BODY + 1), true));
        assert!(!cache.insert(1, "k".repeat(MAX_KEY + 1), warm("k"), body(1), true));
        // Re-inserting a key replaces it rather than counting it twice.
        let cache = RenderCache::default();
        cache.insert(1, "a".into(), warm("a"), body(5), true);
        cache.insert(1, "a".into(), warm("a"), body(7), true);
        assert_eq!(cache.usage(), (1, 7));
    }

    #[test]
    fn codings_follow_accept_encoding() {
        assert_eq!(coding(None), None);
        assert_eq!(coding(Some("gzip, deflate, br, zstd")), Some("br"));
        assert_eq!(coding(Some("gzip")), Some("gzip"));
        assert_eq!(coding(Some("br;q=0, gzip;q=0.5")), Some("gzip"));
        assert_eq!(coding(Some("identity")), None);
        assert_eq!(coding(Some("*")), Some("br"));
        assert_eq!(coding(Some("*, br;q=0")), Some("gzip"));
        assert_eq!(coding(Some("gzip;q=0, br;q=0")), None);
    }

    #[test]
    fn keys_sort_query_pairs_and_name_the_coding() {
        assert_eq!(
            key("/timeline", Some("window=24h&by=worker"), Some("br")),
            key("/timeline", Some("by=worker&window=24h"), Some("br"))
        );
        assert_ne!(
            key("/timeline", Some("window=24h"), Some("br")),
            key("/timeline", Some("window=24h"), Some("gzip"))
        );
        assert_ne!(
            key("/timeline", Some("window=24h"), None),
            key("/timeline", Some("window=1h"), None)
        );
        assert_eq!(key("/streams", None, None), key("/streams", Some(""), None));
        assert!(key("/streams", Some(&"q=x".repeat(1_000)), None).is_none());
    }
}
