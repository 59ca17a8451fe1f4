//! URLs as they may appear in logs and errors: the userinfo and the query, the
//! parts that may carry credentials, are never shown.

/// `scheme://host[:port]/path` with userinfo and query replaced by `***`; a URL
/// that does not parse is not shown at all.
pub fn redact_url(url: &str) -> String {
    let Ok(parsed) = url::Url::parse(url) else {
        return "<invalid URL>".to_owned();
    };
    let userinfo = if parsed.username().is_empty() && parsed.password().is_none() {
        ""
    } else {
        "***@"
    };
    let host = parsed.host_str().unwrap_or("");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let query = if parsed.query().is_some() { "?***" } else { "" };
    format!(
        "{}://{userinfo}{host}{port}{}{query}",
        parsed.scheme(),
        parsed.path()
    )
}

/// The userinfo and the query of a URL as written: the parts that may carry
/// credentials, to scrub from texts that might echo them.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Ok(parsed) = url::Url::parse(url) else {
        // Unparseable: the whole text may be a secret.
        return vec![url.to_owned()];
    };
    let mut secrets = Vec::new();
    let userinfo = match parsed.password() {
        Some(password) => format!("{}:{password}", parsed.username()),
        None => parsed.username().to_owned(),
    };
    secrets.push(userinfo);
    secrets.extend(parsed.password().map(str::to_owned));
    secrets.extend(parsed.query().map(str::to_owned));
    secrets.retain(|s| !s.is_empty());
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("wss://user:pass@host:443/x?token=abc#frag"),
            "wss://***@host/x?***",
            "the default port is implied"
        );
        assert_eq!(redact_url("ws://host/path"), "ws://host/path");
        assert_eq!(
            redact_url("ws://u@host:9000?k=v"),
            "ws://***@host:9000/?***"
        );
        assert_eq!(redact_url("not a url with secret"), "<invalid URL>");
        assert_eq!(
            url_secrets("wss://user:pass@host/x?token=abc"),
            vec!["user:pass", "pass", "token=abc"]
        );
    }
}
