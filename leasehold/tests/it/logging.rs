//! Log output of the binary: `LEASEHOLD_LOG_FORMAT=json` gives one JSON object
//! per line, without colour codes when stderr is not a terminal; any other
//! value than `text` or `json` is a configuration error (exit 2).

use std::io::Write;
use std::time::Duration;

use crate::support::{free_addr, run_leasehold, side_by_side_blocking, spawn_leasehold};

/// A sidecar logging in `format`, and a stranger on its telemetry port that
/// makes it warn.
fn warning_sidecar(format: &str) -> crate::support::Proc {
    warning_sidecar_at(format, &free_addr(), &free_addr())
}

fn warning_sidecar_at(format: &str, listen: &str, telemetry: &str) -> crate::support::Proc {
    let sidecar = spawn_leasehold(
        "sidecar",
        &["sidecar", "--no-observer"],
        &[
            ("SIDECAR_LISTEN".into(), listen.to_owned()),
            ("TELEMETRY_ADDR".into(), telemetry.to_owned()),
            ("LEASEHOLD_LOG".into(), "warn".into()),
            ("LEASEHOLD_LOG_FORMAT".into(), format.into()),
        ],
    );
    for _ in 0..100 {
        if let Ok(mut stranger) = std::net::TcpStream::connect(telemetry) {
            stranger.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            return sidecar;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the sidecar never listened\n{}", sidecar.output());
}

#[test]
fn json_logs_are_one_object_per_line() {
    let _slot = side_by_side_blocking();
    let sidecar = warning_sidecar("json");
    let line = sidecar.wait_line("\"level\":\"WARN\"", Duration::from_secs(10));
    let object: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|err| panic!("not one JSON object per line ({err}): {line}"));
    assert!(object["timestamp"].is_string(), "{object}");
    assert!(object["fields"]["message"].is_string(), "{object}");
}

#[test]
fn text_logs_carry_no_colour_codes_when_not_on_a_terminal() {
    let _slot = side_by_side_blocking();
    let sidecar = warning_sidecar("text");
    sidecar.wait_line("WARN", Duration::from_secs(10));
    assert!(
        !sidecar.output().contains('\u{1b}'),
        "ANSI escape codes in piped logs: {:?}",
        sidecar.output()
    );
}

#[test]
fn an_unknown_log_format_is_a_configuration_error() {
    let (status, output) = run_leasehold(
        &["leases", "list"],
        &[("LEASEHOLD_LOG_FORMAT".into(), "yaml".into())],
        None,
    );
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains("LEASEHOLD_LOG_FORMAT"), "{output}");
    assert!(output.contains("text or json"), "{output}");
}

/// What goes wrong outside the settings' own checks is one short line that
/// names the setting, the service and the cause, with no `Debug` dump and no
/// secret, within the connect timeout.
#[test]
fn each_error_is_one_line_naming_what_is_wrong() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let base = |extra: &[(&str, String)]| {
        let mut envs: Vec<(String, String)> = [
            ("UPSTREAM_URL", "ws://127.0.0.1:9/".to_owned()),
            ("SINK_URL", "memory:".to_owned()),
            ("OWNER_ID", "w".to_owned()),
            ("LEASE_TABLE", "leasehold-errors".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("HOME", "/nonexistent".to_owned()),
            // No instance metadata service to ask for credentials.
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in extra {
            envs.retain(|(name, _)| name != k);
            envs.push(((*k).to_owned(), v.clone()));
        }
        envs
    };
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret".to_owned()),
    ];
    // (case, settings it changes, what its line must say)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        (
            "no credentials",
            vec![],
            &["DynamoDB table leasehold-errors", "no AWS credentials"],
        ),
        (
            "DynamoDB unreachable",
            [
                &keys[..],
                &[("AWS_ENDPOINT_URL_DYNAMODB", format!("http://{closed}"))],
            ]
            .concat(),
            &["DynamoDB table leasehold-errors", "Connection refused"],
        ),
        (
            "UPSTREAM_URL not a URL",
            vec![("UPSTREAM_URL", "notaurl".to_owned())],
            &["UPSTREAM_URL: ", "is not a valid URL"],
        ),
        (
            "SINK_URL port not a number",
            vec![("SINK_URL", "redis://:hunter2@127.0.0.1:notaport".to_owned())],
            &["SINK_URL: is not a valid Redis URL"],
        ),
        (
            "TELEMETRY_ADDR on every interface",
            vec![("TELEMETRY_ADDR", "0.0.0.0:9465".to_owned())],
            &["TELEMETRY_ADDR: 0.0.0.0:9465 is not a loopback address"],
        ),
    ];
    for (case, extra, wanted) in cases {
        let args: &[&str] = if case.starts_with("TELEMETRY") {
            &["sidecar"]
        } else {
            &["stream-worker"]
        };
        let began = std::time::Instant::now();
        let (status, output) = run_leasehold(args, &base(&extra), None);
        let took = began.elapsed();
        assert!(!status.success(), "{case}: {output}");
        for want in wanted {
            assert!(
                output.contains(want),
                "{case}: wanted {want:?} in\n{output}"
            );
        }
        for never in [
            "{",
            "hunter2",
            "not-a-real-secret",
            "ProviderError",
            "DispatchFailure",
        ] {
            assert!(!output.contains(never), "{case}: {never:?} in\n{output}");
        }
        let lines = output.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(lines <= 3, "{case}: {lines} lines\n{output}");
        assert!(
            took < std::time::Duration::from_secs(5),
            "{case}: took {took:?}"
        );
    }
    // A zero lease is refused before anything starts.
    let (status, output) = run_leasehold(&["dev", "--lease-seconds", "0"], &[], None);
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains("--lease-seconds"), "{output}");
}

/// Forty strangers in a row on the telemetry port: one warning line (the rest
/// are held back for 10 s), while the metric counts every one.
#[test]
fn repeated_warnings_are_rate_limited_but_counted() {
    let _slot = side_by_side_blocking();
    let (listen, telemetry) = (free_addr(), free_addr());
    let sidecar = warning_sidecar_at("text", &listen, &telemetry);
    sidecar.wait_line("no valid preamble", Duration::from_secs(10));
    for _ in 0..39 {
        let mut stranger = std::net::TcpStream::connect(&telemetry).unwrap();
        stranger.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    }
    let counted = || {
        let body = http_get(&listen, "/metrics");
        body.lines()
            .find(|l| {
                l.starts_with("leasehold_sidecar_transport_errors_total{reason=\"preamble\"}")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counted() < 40.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "counted {}",
            counted()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = sidecar
        .output()
        .lines()
        .filter(|l| l.contains("no valid preamble"))
        .count();
    assert_eq!(lines, 1, "{}", sidecar.output());
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}
