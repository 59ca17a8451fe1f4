//! How a leasehold process meets its environment.
//!
//! Nothing here knows about leases, streams or the pool; every component uses it.
//!
//! Module map:
//! - [`settings`]: typed environment variables ([`settings::Setting`]), shared
//!   parsers, and [`settings::Env`], which reports every bad value at once.
//! - [`aws`]: AWS SDK configuration with the retry policy that fits the caller.
//! - [`ecs`]: the ECS task metadata endpoint (v4): task identity on ECS.
//! - [`iam`]: the IAM action behind every AWS call, and the actions the
//!   running subcommand declared (a call outside them fails before it is sent).
//! - [`logging`]: log output and `LEASEHOLD_LOG`; the AWS variables users set.
//! - [`clock`]: wall-clock time as a dependency ([`clock::Clock`]); the only
//!   place that reads the system wall clock.
//! - [`backoff`]: exponential backoff with full jitter, for every retry loop.
//! - [`percentile`]: the one nearest-rank percentile every figure uses.
//! - [`periodic`]: "every period until cancelled", the one periodic loop.
//! - [`hardening`]: no core dumps for processes that hold secrets.
//! - [`redis_memory`]: `maxmemory-policy noeviction`, checked by every role
//!   that writes the pool bus before it starts.
//! - [`redis_functions`]: leasehold's Lua as Redis functions (`FCALL`), loaded
//!   by the admin role, so no worker role may load code.

pub mod aws;
pub mod backoff;
pub mod clock;
pub mod ecs;
pub mod hardening;
pub mod iam;
pub mod logging;
pub mod percentile;
pub mod periodic;
pub mod redis_functions;
pub mod redis_memory;
pub mod settings;

pub use backoff::Backoff;
pub use settings::{ConfigError, Env, Setting};
