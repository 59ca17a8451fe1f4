//! What KMS mode adds to a claim: decrypting one credentials blob, version 2
//! (KMS `Decrypt` of the data key over HTTP, then AES-256-GCM) against version
//! 1 (AES-256-GCM with the local key), `--count N` times each (200). The KMS is
//! the test command's moto server on loopback, so the figure is the client's
//! own cost plus one loopback HTTP round trip to a Python server; a real KMS
//! adds the network to the regional endpoint.
//!
//! Needs `LEASEHOLD_TEST_DYNAMODB_ENDPOINT` (scripts/bench.sh sets it).
//! Run: `cargo bench -p leasehold-broker --bench kms_decrypt`
#![allow(clippy::unwrap_used, unreachable_pub)] // a test: a panic is its report

use std::time::{Duration, Instant};

use leasehold_broker::credentials::{AesGcmCipher, CredentialsCipher, KmsEnvelope};
use leasehold_platform::aws::{RetryPolicy, local_sdk_config};
use leasehold_testkit::measure::{arg, percentile};

fn report(name: &str, samples: &mut [Duration]) {
    let p50 = percentile(samples, 50.0);
    let p99 = percentile(samples, 99.0);
    let max = samples.iter().max().copied().unwrap_or_default();
    println!(
        "{name}: n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(endpoint) = leasehold_testkit::dynamodb_endpoint() else {
        return;
    };
    let count = arg("--count", 200) as usize;
    let client = aws_sdk_kms::Client::new(&local_sdk_config(RetryPolicy::Standard, &endpoint));
    let key = client.create_key().send().await.expect("CreateKey");
    let arn = key.key_metadata().unwrap().arn().unwrap().to_owned();
    let kms = KmsEnvelope::with_client(client, Some(arn));
    let plaintext = br#"{"api_key": "bench-key", "account_id": "A1"}"#;
    let blob = kms.encrypt("u1", plaintext).await.unwrap();
    let local = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let v1 = local.encrypt("u1", plaintext).unwrap();

    // Warm up the connection pool and the server.
    for _ in 0..10 {
        kms.decrypt("u1", &blob).await.unwrap();
    }
    let mut v2_samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let credentials = kms.decrypt("u1", &blob).await.unwrap();
        v2_samples.push(started.elapsed());
        drop(credentials);
    }
    let mut v1_samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let credentials = local.decrypt("u1", &v1).unwrap();
        v1_samples.push(started.elapsed());
        drop(credentials);
    }
    report(
        "decrypt v2 (KMS Decrypt on loopback moto + AES-GCM)",
        &mut v2_samples,
    );
    report("decrypt v1 (local key, AES-GCM only)", &mut v1_samples);
}
