//! The operator CLI as a user runs it: the real binary against the local
//! DynamoDB-compatible server started by the test command.

use std::process::{Command, Output};

use leasehold_testkit::{dynamodb_endpoint, unique_name};

struct Cli {
    endpoint: String,
    table: String,
}

impl Cli {
    fn new() -> Option<Self> {
        Some(Cli {
            endpoint: dynamodb_endpoint()?,
            table: unique_name("cli"),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test-secret-never-printed")
            .env("LEASE_TABLE", &self.table);
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run leasehold")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

#[test]
fn operator_workflow_against_a_local_table() {
    let Some(cli) = Cli::new() else { return };

    let missing = cli.run(&["leases", "list"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = text(&missing.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one-line error: {stderr}");
    assert!(
        stderr.contains("does not exist") && stderr.contains("leasehold table create"),
        "{stderr}"
    );

    assert!(ok(cli.run(&["table", "create"])).contains("created lease table"));
    assert!(ok(cli.run(&["table", "create"])).contains("already exists"));

    let added = ok(cli.run(&["leases", "add", "orders-us-east", "btc-usd"]));
    assert!(
        added.contains("registered orders-us-east") && added.contains("registered btc-usd"),
        "{added}"
    );
    assert!(ok(cli.run(&["leases", "add", "btc-usd"])).contains("already registered"));

    let listed: serde_json::Value =
        serde_json::from_str(&ok(cli.run(&["leases", "list", "--json"]))).unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["stream_id"], "btc-usd", "sorted by stream id");
    assert_eq!(rows[0]["state"], "unowned");
    assert_eq!(rows[0]["fence_token"], 0);

    let table = ok(cli.run(&["leases", "list"]));
    let header = table.lines().next().unwrap();
    for column in [
        "STREAM",
        "OWNER",
        "TOKEN",
        "EXPIRES IN",
        "CHECKPOINT",
        "UPDATED",
    ] {
        assert!(header.contains(column), "{header}");
    }

    let shown = ok(cli.run(&["leases", "show", "orders-us-east"]));
    assert!(
        shown.contains("fence_token") && shown.contains("unowned"),
        "{shown}"
    );

    let refused = cli.run(&["leases", "release", "btc-usd"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("--force"));

    let released: serde_json::Value = serde_json::from_str(&ok(
        cli.run(&["leases", "release", "btc-usd", "--force", "--json"])
    ))
    .unwrap();
    assert_eq!(released["state"], "unowned");
    assert!(released["released_at"].as_i64().unwrap() > 0);

    let unknown = cli.run(&["leases", "show", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(text(&unknown.stderr).contains("not in the lease table"));
}

#[test]
fn bad_configuration_exits_2_listing_every_problem() {
    let Some(cli) = Cli::new() else { return };
    let output = cli
        .command(&["leases", "list"])
        .env("LEASE_TABLE", "x")
        .env_remove("AWS_REGION")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("LEASE_TABLE") && stderr.contains("AWS_REGION"),
        "{stderr}"
    );
    assert!(!stderr.contains("test-secret-never-printed"));
}
