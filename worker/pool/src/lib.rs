//! The broker pool's shared state (in Redis in production): the per-user broker
//! workers, their warm pool, and the API that talks to them all meet here.
//!
//! Module map:
//! - [`keys`]: every Redis key name of the pool layout, spelled once.
//! - [`protocol`]: every message body (claim, request, response, control,
//!   dead letter), parsed strictly with errors that name fields, never values;
//!   its child `stored` holds what is kept in Redis besides messages (request
//!   record fields, paper order, liveness mark).
//! - [`bus`]: [`bus::PoolBus`], every atomic step on the shared state, with the
//!   Redis and in-memory backends and one conformance suite.
//! - [`settlement`]: the order path's decisions and the two bus rules (who may
//!   begin a request, who may store its final answer), pure, for the serve
//!   loop, both buses and the request model checker.
//! - [`read`]: [`read::PoolReader`], the one read model (idle workers, claimed
//!   users and their queues, the sweep report) for the dashboard and observer.
//! - [`state`]: [`state::PoolState`], typed reads for the components that act
//!   on the pool (claim outcome, grant, marks, taken claims, users with work),
//!   so their code spells no key and parses no raw value.
//! - [`claim_users`]: per-claim Redis users (self-managed Redis), confined to
//!   one user's keys, made and swept by the credential sealer.
//! - [`settings`]: where the pool lives (`REDIS_URL`).

pub mod bus;
pub mod claim_users;
pub mod keys;
pub mod protocol;
pub mod read;
pub mod settings;
pub mod settlement;
pub mod state;
