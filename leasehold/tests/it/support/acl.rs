//! A `redis-server` running `deploy/redis-acl.conf` as a deployment renders
//! it (test passwords hashed), and helpers to act as one of its roles.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_testkit::{repo_root, unique_name};

use super::{Proc, free_port, run_leasehold, spawn_command};

/// A role's test password: URL-safe, 16+ characters, unique per role.
pub fn password(role: &str) -> String {
    format!("pw-{role}-9f2c71d4e8a0b3")
}

/// A redis-server running the rendered ACL file on a free port.
pub struct AclRedis {
    _server: Proc,
    /// Its loopback port.
    pub port: u16,
    /// A connection as `admin`.
    pub admin: redis::aio::MultiplexedConnection,
    /// Every user the file defines.
    pub roles: Vec<String>,
}

impl AclRedis {
    /// `None` when no `redis-server` is configured (skip).
    pub async fn start() -> Option<AclRedis> {
        let server = leasehold_testkit::redis_server()?;
        let template = repo_root().join("deploy/redis-acl.conf");
        let render = repo_root().join("deploy/render-redis-acl.sh");
        let roles_out = Command::new("bash")
            .arg(&render)
            .arg("--roles")
            .arg(&template)
            .output()
            .expect("render --roles");
        assert!(roles_out.status.success(), "{roles_out:?}");
        let roles: Vec<String> = String::from_utf8(roles_out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        for role in [
            "admin",
            "api",
            "stream-worker",
            "broker-worker",
            "credential-sealer",
            "pool-manager",
            "maintenance",
            "sidecar",
            "dashboard",
        ] {
            assert!(
                roles.iter().any(|r| r == role),
                "no user {role} in {roles:?}"
            );
        }
        let mut render_cmd = Command::new("bash");
        render_cmd.arg(&render).arg(&template).env_clear();
        render_cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
        for role in &roles {
            let var = format!(
                "REDIS_ACL_PASSWORD_{}",
                role.to_uppercase().replace('-', "_")
            );
            render_cmd.env(var, password(role));
        }
        let rendered = render_cmd.output().expect("render");
        assert!(
            rendered.status.success(),
            "render failed: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        let text = String::from_utf8(rendered.stdout).unwrap();
        for role in &roles {
            assert!(
                !text.contains(&password(role)),
                "the rendered file holds a password in clear"
            );
        }
        let dir: PathBuf = std::env::temp_dir().join(unique_name("redis-acl"));
        std::fs::create_dir_all(&dir).unwrap();
        let acl_file = dir.join("users.acl");
        std::fs::write(&acl_file, text).unwrap();

        let port = free_port();
        let mut command = Command::new(server);
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.to_str().unwrap(),
            "--aclfile",
            acl_file.to_str().unwrap(),
        ]);
        let server = spawn_command("redis-server", command);
        let admin_url = url_for(port, "admin");
        let deadline = Instant::now() + Duration::from_secs(10);
        let admin = loop {
            let attempt = async {
                redis::Client::open(admin_url.as_str())?
                    .get_multiplexed_async_connection()
                    .await
            };
            match attempt.await {
                Ok(connection) => break connection,
                Err(err) => {
                    assert!(
                        Instant::now() < deadline,
                        "redis-server with the ACL file never answered: {err}\n{}",
                        server.output()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        Some(AclRedis {
            _server: server,
            port,
            admin,
            roles,
        })
    }

    /// A `redis://` URL logging in as `role`.
    pub fn url(&self, role: &str) -> String {
        url_for(self.port, role)
    }

    /// A plain connection as `role`.
    pub async fn connect(&self, role: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url(role).as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|err| panic!("{role} cannot connect: {err}"))
    }

    /// Denials Redis logged since the last reset, as `user: reason object
    /// (context)`. `CLIENT SETINFO`, which the client library sends on
    /// connect and whose failure it ignores, is left out (Redis 7.2+ knows
    /// it; the ACL file must load on 7.0, which does not).
    pub async fn denials(&mut self) -> Vec<String> {
        let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .arg(1000)
            .query_async(&mut self.admin)
            .await
            .unwrap();
        let text = |v: Option<&redis::Value>| match v {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            other => format!("{other:?}"),
        };
        entries
            .iter()
            .map(|e| {
                format!(
                    "{}: {} {} ({})",
                    text(e.get("username")),
                    text(e.get("reason")),
                    text(e.get("object")),
                    text(e.get("context"))
                )
            })
            .filter(|line| !line.contains("client|setinfo"))
            .collect()
    }

    /// Empties the ACL log.
    pub async fn reset_log(&mut self) {
        let _: () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query_async(&mut self.admin)
            .await
            .unwrap();
    }
}

/// A `redis://` URL logging in as `role` on `port`.
pub fn url_for(port: u16, role: &str) -> String {
    format!("redis://{role}:{}@127.0.0.1:{port}", password(role))
}

/// Environment pairs for a process.
pub fn envs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Runs `leasehold ARGS` to completion; panics with its output unless it
/// exits 0. Returns the output.
pub fn run_ok(args: &[&str], envs: &[(String, String)], stdin: Option<&str>) -> String {
    let (status, output) = run_leasehold(args, envs, stdin);
    assert!(status.success(), "leasehold {args:?}: {status}\n{output}");
    output
}

/// Asserts `result` is a permission refusal (a NOPERM reply, which the client
/// library shows as `NoPerm`, or the script form of it), not some other failure.
pub fn assert_refused<T: std::fmt::Debug, E: std::fmt::Display>(what: &str, result: Result<T, E>) {
    match result {
        Ok(value) => panic!("{what} was allowed (returned {value:?})"),
        Err(err) => {
            let text = err.to_string();
            assert!(
                text.contains("NOPERM") || text.contains("NoPerm") || text.contains("can't access"),
                "{what} failed, but not for lack of permission: {text}"
            );
        }
    }
}

/// `role` sends `args` as one raw command; it must be refused.
pub async fn refused(redis: &AclRedis, role: &str, args: &[&str]) {
    let mut connection = redis.connect(role).await;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    let result: redis::RedisResult<redis::Value> = command.query_async(&mut connection).await;
    assert_refused(&format!("{role}: {}", args.join(" ")), result);
}
