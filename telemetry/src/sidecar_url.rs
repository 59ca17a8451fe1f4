//! `sidecar_url`: where a worker's sidecar answers, as the worker publishes it
//! (presence record, broker worker metadata) and the dashboard reads it.
//!
//! One strict form, `http://IP:PORT` with an optional trailing `/`: plain HTTP,
//! an IP literal (IPv6 in brackets), an explicit port, nothing else. The same
//! parser checks `SIDECAR_URL` at a worker's start and every value the
//! dashboard reads, so a worker cannot publish what the dashboard will refuse.
//!
//! Only IP literals, never names: a name would make the dashboard resolve
//! whatever a table writer chose, at a time of the resolver's choosing (DNS
//! rebinding between check and connect), and workers know their address
//! anyway. The IP grammar is Rust's strict one (dotted decimal, no leading
//! zeros), so `2852039166`, `0251.0376.0251.0376` or `0xa9.0xfe.0xa9.0xfe` are not
//! addresses here; they would be names, and names are refused. Callers connect
//! to [`SidecarUrl::addr`], never to the text, so a system resolver that reads
//! those forms as addresses is never asked.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// A parsed `sidecar_url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SidecarUrl {
    addr: SocketAddr,
}

/// Why a `sidecar_url` is not one (a fixed category: never the text itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UrlProblem {
    /// Not `http://` (https, file, gopher, no scheme …).
    Scheme,
    /// Holds `user@` or `user:password@`.
    Userinfo,
    /// Has a path, query or fragment.
    Path,
    /// The host is not an IP literal.
    NotAnIp,
    /// No port, or not a number from 1 to 65535.
    Port,
    /// Longer than any address could be.
    TooLong,
}

impl UrlProblem {
    /// A short fixed label (`scheme`, `userinfo`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            UrlProblem::Scheme => "not plain http",
            UrlProblem::Userinfo => "userinfo",
            UrlProblem::Path => "path, query or fragment",
            UrlProblem::NotAnIp => "host is not an IP literal",
            UrlProblem::Port => "missing or invalid port",
            UrlProblem::TooLong => "too long",
        }
    }
}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest text considered (`http://[` + the longest IPv6 text + `]:65535/`).
const MAX_LEN: usize = 64;

impl SidecarUrl {
    /// The base URL of a sidecar at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        SidecarUrl { addr }
    }

    /// Parses the strict form (see the module documentation).
    pub fn parse(raw: &str) -> Result<SidecarUrl, UrlProblem> {
        if raw.len() > MAX_LEN {
            return Err(UrlProblem::TooLong);
        }
        let rest = raw.strip_prefix("http://").ok_or(UrlProblem::Scheme)?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            return Err(UrlProblem::Userinfo);
        }
        if authority.contains(['/', '?', '#', '\\']) {
            return Err(UrlProblem::Path);
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (host, after) = bracketed.split_once(']').ok_or(UrlProblem::NotAnIp)?;
                let port = after.strip_prefix(':').ok_or(UrlProblem::Port)?;
                let ip: Ipv6Addr = host.parse().map_err(|_| UrlProblem::NotAnIp)?;
                (IpAddr::V6(ip), port)
            }
            None => {
                let (host, port) = authority.rsplit_once(':').ok_or(UrlProblem::Port)?;
                let ip: std::net::Ipv4Addr = host.parse().map_err(|_| UrlProblem::NotAnIp)?;
                (IpAddr::V4(ip), port)
            }
        };
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(UrlProblem::Port);
        }
        let port: u16 = port.parse().map_err(|_| UrlProblem::Port)?;
        if port == 0 {
            return Err(UrlProblem::Port);
        }
        Ok(SidecarUrl {
            addr: SocketAddr::new(host, port),
        })
    }

    /// Where to connect: the address itself, never a name.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) read as
    /// the IPv4 address it reaches, for checks against networks.
    pub fn effective_ip(&self) -> IpAddr {
        match self.addr.ip() {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        }
    }
}

impl fmt::Display for SidecarUrl {
    /// The canonical text, `http://10.0.3.7:9464` or `http://[fd00::7]:9464`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strict_form_parses_and_prints_canonically() {
        for (raw, canonical) in [
            ("http://10.0.3.7:9464", "http://10.0.3.7:9464"),
            ("http://10.0.3.7:9464/", "http://10.0.3.7:9464"),
            ("http://[fd00::7]:9464", "http://[fd00::7]:9464"),
        ] {
            assert_eq!(SidecarUrl::parse(raw).unwrap().to_string(), canonical);
        }
    }

    #[test]
    fn anything_else_is_refused_with_a_category() {
        for (raw, problem) in [
            ("https://10.0.0.1:9464", UrlProblem::Scheme),
            ("HTTP://10.0.0.1:9464", UrlProblem::Scheme),
            ("file:///etc/passwd", UrlProblem::Scheme),
            ("10.0.0.1:9464", UrlProblem::Scheme),
            ("http://10.0.0.1@169.254.169.254:80", UrlProblem::Userinfo),
            ("http://u:p@10.0.0.1:9464", UrlProblem::Userinfo),
            ("http://10.0.0.1:9464/status", UrlProblem::Path),
            ("http://10.0.0.1:9464?x", UrlProblem::Path),
            ("http://10.0.0.1:9464#x", UrlProblem::Path),
            ("http://10.0.0.1:9464\\@x", UrlProblem::Userinfo),
            ("http://2852039166:80", UrlProblem::NotAnIp),
            ("http://0251.0376.0251.0376:80", UrlProblem::NotAnIp),
            ("http://0xa9.0xfe.0xa9.0xfe:80", UrlProblem::NotAnIp),
            ("http://169.254.169.254.nip.io:80", UrlProblem::NotAnIp),
            ("http://sidecar.local:9464", UrlProblem::NotAnIp),
            ("http://[::1:9464", UrlProblem::NotAnIp),
            ("http://10.0.0.1", UrlProblem::Port),
            ("http://10.0.0.1:", UrlProblem::Port),
            ("http://10.0.0.1:+80", UrlProblem::Port),
            ("http://10.0.0.1:0", UrlProblem::Port),
            ("http://10.0.0.1:65536", UrlProblem::Port),
            ("http://[::1]", UrlProblem::Port),
        ] {
            assert_eq!(SidecarUrl::parse(raw), Err(problem), "{raw}");
        }
        assert_eq!(
            SidecarUrl::parse(&format!("http://10.0.0.1:{}", "9".repeat(80))),
            Err(UrlProblem::TooLong)
        );
    }

    #[test]
    fn a_mapped_address_is_checked_as_ipv4() {
        let url = SidecarUrl::parse("http://[::ffff:169.254.169.254]:80").unwrap();
        assert_eq!(url.effective_ip(), IpAddr::from([169, 254, 169, 254]));
    }
}
