//! leasehold's Lua, stored in Redis as **functions** (`FUNCTION LOAD`, called
//! with `FCALL`) instead of scripts sent with `SCRIPT LOAD` / `EVALSHA`.
//!
//! Why: a role that may `SCRIPT LOAD` (or `EVAL`) can run any Lua it writes, so
//! a Lua-engine vulnerability (the 2025 use-after-free and sandbox escapes)
//! turns a compromised worker's Redis password into code execution on the
//! server, past every ACL. With functions, only the admin role loads code
//! (`leasehold redis load-functions`, at deploy time); worker roles get
//! `+fcall` alone and can run only what was loaded. Functions are also kept in
//! RDB/AOF and replicated, so a restart or failover does not empty them the
//! way it empties the script cache.
//!
//! Each function is its own library, named after the SHA-1 of its body
//! (`leasehold_<40 hex>`): two versions of leasehold running side by side
//! during a deploy call different names, and loading is idempotent.
//!
//! A call that finds its function missing loads it once and retries: that is
//! how `leasehold dev`, the tests and a user with full rights work with no
//! deploy step. A confined role is refused the load, and the call fails with
//! an error that says what to run.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ToRedisArgs};

/// One Lua body, stored as the Redis function (and library) `leasehold_<sha1>`.
#[derive(Debug, Clone)]
pub struct StoredFunction {
    name: String,
    library: String,
}

impl StoredFunction {
    /// The function for a script body that reads `KEYS` and `ARGV` like an
    /// `EVAL` script (it must not create globals, as under `EVAL`).
    pub fn new(body: &str) -> Self {
        let name = format!("leasehold_{}", redis::Script::new(body).get_hash());
        let library = format!(
            "#!lua name={name}\nredis.register_function('{name}', function(KEYS, ARGV)\n{body}\nend)\n"
        );
        StoredFunction { name, library }
    }

    /// The function's (and its library's) name, what `FCALL` names.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library source `FUNCTION LOAD` takes.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// A call with its first key.
    pub fn key<T: ToRedisArgs>(&self, key: T) -> FunctionCall<'_> {
        let mut call = self.call();
        call.key(key);
        call
    }

    /// A call with its first argument (a function that takes no key).
    pub fn arg<T: ToRedisArgs>(&self, arg: T) -> FunctionCall<'_> {
        let mut call = self.call();
        call.arg(arg);
        call
    }

    /// A call with no key and no argument yet.
    pub fn call(&self) -> FunctionCall<'_> {
        FunctionCall {
            function: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Loads this function (replacing a library of the same name, which holds
    /// the same body). Needs `+function|load`: the admin role, or a dev user.
    pub async fn load<C: ConnectionLike + Send>(&self, connection: &mut C) -> RedisResult<()> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.library)
            .query_async::<redis::Value>(connection)
            .await
            .map(drop)
    }
}

/// One `FCALL` being built: keys, then arguments.
#[derive(Debug, Clone)]
pub struct FunctionCall<'a> {
    function: &'a StoredFunction,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl FunctionCall<'_> {
    /// Adds a key (checked by ACL key patterns, routed by in a cluster).
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Adds an argument.
    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Runs the function; loads it first if this Redis does not have it yet
    /// (refused for confined roles: the error then names the deploy step).
    pub async fn invoke_async<T: FromRedisValue, C: ConnectionLike + Send>(
        &self,
        connection: &mut C,
    ) -> RedisResult<T> {
        let mut fcall = redis::cmd("FCALL");
        fcall
            .arg(self.function.name())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        // Twice: an operator's `FUNCTION FLUSH` may land between a load and
        // the call after it.
        for _ in 0..2 {
            match fcall.query_async(connection).await {
                Err(err) if is_missing_function(&err) => {}
                other => return other,
            }
            if let Err(err) = self.function.load(connection).await {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "leasehold Redis function is not loaded",
                    format!(
                        "{} is missing and this user may not load it ({}); run `leasehold redis load-functions` as the admin role",
                        self.function.name(),
                        err.code().unwrap_or("error"),
                    ),
                )));
            }
        }
        fcall.query_async(connection).await
    }
}

/// Redis answers `ERR Function not found` for an `FCALL` of an unknown name.
fn is_missing_function(err: &RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|detail| detail.starts_with("Function not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_follows_the_body_and_the_library_registers_it() {
        let a = StoredFunction::new("return KEYS[1]");
        let b = StoredFunction::new("return ARGV[1]");
        assert_ne!(a.name(), b.name());
        assert_eq!(a.name(), StoredFunction::new("return KEYS[1]").name());
        assert_eq!(a.name().len(), "leasehold_".len() + 40);
        assert!(
            a.library()
                .starts_with(&format!("#!lua name={}\n", a.name()))
        );
        assert!(
            a.library()
                .contains(&format!("redis.register_function('{}'", a.name()))
        );
        assert!(a.library().contains("return KEYS[1]"));
    }

    #[test]
    fn only_an_unknown_function_counts_as_missing() {
        let missing = RedisError::from((
            ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Function not found".to_owned(),
        ));
        let other = RedisError::from((
            ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "wrong number of arguments".to_owned(),
        ));
        assert!(is_missing_function(&missing));
        assert!(!is_missing_function(&other));
    }
}
