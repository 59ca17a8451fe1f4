//! The cluster dashboard (axum + askama): ownership, fence tokens, lag, pool state.
//!
//! Not built yet; tracked by its own issue.
