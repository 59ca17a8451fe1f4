//! The login cookie's value: a session derived from the bearer token, never
//! the token itself.
//!
//! The value is `v1.{expires_ms}.{tag}`, where `tag` is the hex
//! HMAC-SHA256, keyed by the token, of a fixed label and `expires_ms`. So a
//! cookie that leaks (a copied browser profile, a debugging proxy's log)
//! does not leak the token, which also opens the JSON API to scripts; it stops
//! working at `expires_ms` even if a browser keeps it past its `Max-Age`;
//! and changing `DASHBOARD_TOKEN` ends every session. A session cannot be
//! ended one by one on the server (there is no session store): logout removes
//! it from the browser, a new token ends them all.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// How long a session lasts: the cookie's `Max-Age`, and the expiry its value
/// carries.
pub const SESSION_MAX_AGE: Duration = Duration::from_secs(12 * 60 * 60);

/// The version prefix of a session value (a cookie of another form, such as
/// the raw token older versions stored, is refused).
const VERSION: &str = "v1";

/// What the tag authenticates besides the expiry, so the token keys nothing
/// else that could be mistaken for a session.
const LABEL: &[u8] = b"leasehold dashboard session v1\n";

/// A session value for `token`, valid from `now_ms` for [`SESSION_MAX_AGE`];
/// `None` only if the token cannot key an HMAC (HMAC takes keys of any length).
pub fn issue(token: &str, now_ms: i64) -> Option<String> {
    let expires_ms = now_ms.saturating_add(max_age_ms());
    let tag = tag(token, expires_ms)?;
    Some(format!("{VERSION}.{expires_ms}.{tag}"))
}

/// Whether `value` is a session [`issue`] made for `token` that has not
/// expired at `now_ms`. The tags are compared in constant time.
pub fn is_valid(token: &str, value: &str, now_ms: i64) -> bool {
    let mut parts = value.splitn(3, '.');
    let (Some(VERSION), Some(expires), Some(given)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(expires_ms) = expires.parse::<i64>() else {
        return false;
    };
    // Expired, or lasting longer than any session this dashboard issues.
    if expires_ms <= now_ms || expires_ms > now_ms.saturating_add(max_age_ms()) {
        return false;
    }
    let Some(expected) = tag(token, expires_ms) else {
        return false;
    };
    expected.as_bytes().ct_eq(given.as_bytes()).into()
}

fn max_age_ms() -> i64 {
    i64::try_from(SESSION_MAX_AGE.as_millis()).unwrap_or(i64::MAX)
}

/// The hex HMAC-SHA256 of [`LABEL`] and `expires_ms`, keyed by `token`.
fn tag(token: &str, expires_ms: i64) -> Option<String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).ok()?;
    mac.update(LABEL);
    mac.update(expires_ms.to_string().as_bytes());
    let digest = mac.finalize().into_bytes();
    Some(digest.iter().map(|byte| format!("{byte:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cret-token-0123";
    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_session_holds_no_token_and_lasts_its_max_age() {
        let value = issue(TOKEN, NOW).unwrap();
        assert!(!value.contains(TOKEN), "{value}");
        assert!(is_valid(TOKEN, &value, NOW));
        assert!(is_valid(TOKEN, &value, NOW + max_age_ms() - 1));
        assert!(!is_valid(TOKEN, &value, NOW + max_age_ms()), "expired");
        assert!(!is_valid("another-token-4567", &value, NOW), "new token");
    }

    #[test]
    fn anything_else_is_refused() {
        let value = issue(TOKEN, NOW).unwrap();
        let later = NOW + 60_000;
        // The expiry is authenticated: moving it on breaks the tag.
        let (_, tag) = value.rsplit_once('.').unwrap();
        let extended = format!("v1.{}.{tag}", later + max_age_ms() - 1);
        assert!(!is_valid(TOKEN, &extended, later));
        for forged in [
            TOKEN,
            "",
            "v1",
            "v1..",
            "v2.1.00",
            &format!("v1.{}.", NOW + 1_000),
            &value[..value.len() - 1],
            &format!("{value}0"),
        ] {
            assert!(!is_valid(TOKEN, forged, NOW), "{forged:?}");
        }
    }
}
