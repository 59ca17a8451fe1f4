//! The HTTP face: the router, access (token, session, Host check), the
//! conditional GET and the render cache, the table columns and the views.

pub mod column;
pub mod pages;
pub mod render_cache;
pub mod router;
pub mod session;
pub mod views;

pub use router::{
    Access, CONTENT_SECURITY_POLICY, DashboardState, SESSION_COOKIE, app, prewarm, views,
};
