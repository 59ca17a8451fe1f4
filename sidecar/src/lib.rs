//! The per-task telemetry sidecar: worker events to Prometheus, CloudWatch and OTLP.
//!
//! Not built yet; tracked by its own issue. The event types it will consume are
//! `leasehold_control::telemetry::TelemetryEvent`.
