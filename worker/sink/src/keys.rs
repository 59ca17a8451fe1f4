//! The Redis Streams sink's key names: the one place each is spelled.
//!
//! Downstream readers depend on these exact names (docs/redis.md); `{…}` are
//! placeholders, not Redis Cluster hash tags.

/// Redis Stream holding a stream's accepted events (fields `seq`, `event_id`,
/// `fence_token`, `payload`).
pub fn sink_stream(stream_id: &str) -> String {
    format!("leasehold:sink:{stream_id}")
}

/// Layout v1's fence (the highest token accepted for a stream): no longer
/// written; named in the error that refuses a v1 stream, and in tests that
/// check it stays absent.
pub fn sink_fence(stream_id: &str) -> String {
    format!("leasehold:fence:{stream_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_keys_follow_the_contract() {
        assert_eq!(sink_stream("btc-usd"), "leasehold:sink:btc-usd");
        assert_eq!(sink_fence("btc-usd"), "leasehold:fence:btc-usd");
    }
}
