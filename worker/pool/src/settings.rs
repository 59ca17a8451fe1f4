//! Where the pool's shared state lives.

use leasehold_platform::settings::{Documented, Fallback, Parser, Setting};

/// A `redis://` or `rediss://` URL, checked for form only. Never echoed: it may
/// carry a password.
const REDIS_URL_PARSER: Parser<String> = Parser {
    parse: |raw| match redis::Client::open(raw) {
        Ok(_) => Ok(raw.to_owned()),
        Err(_) => Err("is not a redis:// or rediss:// URL".into()),
    },
    show: Clone::clone,
};

/// The `REDIS_URL` variable.
pub const REDIS_URL: Setting<String> = Setting::secret(
    "REDIS_URL",
    REDIS_URL_PARSER,
    Fallback::Value(|| "redis://127.0.0.1:6379".to_owned()),
    "Redis/Valkey holding the broker pool's keys (may hold a password: never printed)",
);

/// Every variable of this part, in documentation order.
pub const ALL: &[&dyn Documented] = &[&REDIS_URL];

#[cfg(test)]
mod tests {
    use leasehold_platform::settings::{Env, fixed_lookup};

    use super::*;

    #[test]
    fn tls_redis_urls_are_accepted_and_passwords_never_echoed() {
        // ElastiCache Serverless only speaks TLS: `rediss://` must work.
        for url in ["rediss://cache.example:6379", "redis://127.0.0.1:6379/7"] {
            let lookup = fixed_lookup(&[("REDIS_URL", url)]);
            let mut env = Env::new(&lookup);
            assert_eq!(env.get(&REDIS_URL), url);
            assert!(env.finish(()).is_ok(), "{url} refused");
        }
        let lookup = fixed_lookup(&[("REDIS_URL", "http://user:hunter2@nope")]);
        let mut env = Env::new(&lookup);
        env.get(&REDIS_URL);
        let err = env.finish(()).unwrap_err().to_string();
        assert!(err.contains("REDIS_URL"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
