//! Pushed hand-offs: a draining worker tells a successor, in one UDP
//! datagram, which stream it has just released, so the successor acquires it
//! at once instead of at its next doorbell poll and scan.
//!
//! The datagram is a hint, never a grant: only the conditional acquire decides
//! ownership, so a lost, late, repeated or forged datagram costs at most one
//! refused conditional write, and the doorbell still wakes every peer. A worker
//! announces its address as `handoff_addr` on its presence record
//! (`HANDOFF_LISTEN`); peers read it from their scans and treat it as
//! untrusted (anyone who can write the table chooses it), so addresses that
//! could reach something other than a peer (unspecified, multicast,
//! broadcast, link-local, the instance metadata ranges) are never sent to.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::balance::Census;

/// What a datagram starts with; the stream id follows.
const PREFIX: &[u8] = b"leasehold-handoff ";
/// A prepare: the reply address, a space, then the stream id.
const PREPARE: &[u8] = b"leasehold-prepare ";
/// A ready: the first held sequence, a space, then the stream id.
const READY: &[u8] = b"leasehold-ready ";

/// Longest datagram read: a prefix, an address or a sequence and a stream
/// id (at most 1,024 bytes).
const MAX_DATAGRAM: usize = 1_200;

/// What a peer's datagram says. A hint, never a grant: only the acquire
/// decides, and a prepare or ready costs at most a subscription or a
/// bounded wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hint {
    /// The stream is free for this worker: acquire it now.
    Take(String),
    /// An overlapping hand-off: a draining peer will release the stream to
    /// this worker; subscribe it now, hold its frames, and answer `reply`
    /// with a [`Hint::Ready`] naming the first one held.
    Prepare {
        /// The stream.
        stream: String,
        /// The draining peer's hand-off address.
        reply: SocketAddr,
    },
    /// The successor holds the stream's frames from `first_seq` on: the
    /// draining peer writes up to it, then releases.
    Ready {
        /// The stream.
        stream: String,
        /// The first sequence the successor holds.
        first_seq: u64,
        /// Who sent it (a ready from anyone but the prepared successor is
        /// ignored).
        from: SocketAddr,
    },
}

/// The datagram that hands `stream_id` over.
pub fn encode(stream_id: &str) -> Vec<u8> {
    [PREFIX, stream_id.as_bytes()].concat()
}

/// The datagram that asks a successor to prepare `stream_id`.
pub fn encode_prepare(stream_id: &str, reply: SocketAddr) -> Vec<u8> {
    [
        PREPARE,
        reply.to_string().as_bytes(),
        b" ",
        stream_id.as_bytes(),
    ]
    .concat()
}

/// The datagram that says the successor holds `stream_id` from `first_seq`.
pub fn encode_ready(stream_id: &str, first_seq: u64) -> Vec<u8> {
    [
        READY,
        first_seq.to_string().as_bytes(),
        b" ",
        stream_id.as_bytes(),
    ]
    .concat()
}

/// The stream a take datagram names, if it is one of ours.
pub fn decode(datagram: &[u8]) -> Option<&str> {
    let id = std::str::from_utf8(datagram.strip_prefix(PREFIX)?).ok()?;
    (!id.is_empty()).then_some(id)
}

/// What a datagram from `from` says, if it is one of ours (a prepare's
/// reply address must be one this worker may send to).
pub fn decode_hint(datagram: &[u8], from: SocketAddr) -> Option<Hint> {
    if let Some(stream) = decode(datagram) {
        return Some(Hint::Take(stream.to_owned()));
    }
    let two_parts = |rest: &[u8]| -> Option<(String, String)> {
        let text = std::str::from_utf8(rest).ok()?;
        let (head, stream) = text.split_once(' ')?;
        (!stream.is_empty()).then(|| (head.to_owned(), stream.to_owned()))
    };
    if let Some(rest) = datagram.strip_prefix(PREPARE) {
        let (reply, stream) = two_parts(rest)?;
        let reply = peer_addr(&reply)?;
        return Some(Hint::Prepare { stream, reply });
    }
    let (first_seq, stream) = two_parts(datagram.strip_prefix(READY)?)?;
    Some(Hint::Ready {
        stream,
        first_seq: first_seq.parse().ok()?,
        from,
    })
}

/// `raw` (a peer's `handoff_addr`) as an address this worker may send to.
pub fn peer_addr(raw: &str) -> Option<SocketAddr> {
    let addr: SocketAddr = raw.parse().ok()?;
    let refused = match addr.ip() {
        IpAddr::V4(ip) => {
            ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_link_local()
        }
        IpAddr::V6(ip) => {
            let first = ip.segments()[0];
            ip.is_unspecified()
                || ip.is_multicast()
                || (first & 0xffc0) == 0xfe80
                // EC2's IPv6 instance metadata range, fd00:ec2::/32.
                || (first == 0xfd00 && ip.segments()[1] == 0x0ec2)
        }
    };
    (!refused && addr.port() != 0).then_some(addr)
}

/// Who gets a released stream: the live peer (not `me`) holding the fewest
/// streams, ties broken by owner id, among those with an address.
pub fn successor<'a>(
    census: &'a Census,
    me: &str,
    addrs: &HashMap<String, SocketAddr>,
) -> Option<&'a str> {
    census
        .held_by
        .iter()
        .filter(|(owner, _)| owner.as_str() != me && addrs.contains_key(owner.as_str()))
        .min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
        .map(|(owner, _)| owner.as_str())
}

/// This worker's hand-off socket and the address it announces.
#[derive(Debug, Clone)]
pub struct HandoffSocket {
    transport: Transport,
    advertised: SocketAddr,
}

#[derive(Debug, Clone)]
enum Transport {
    Udp(Arc<tokio::net::UdpSocket>),
    InProcess(InProcessNet),
}

/// Workers' hand-off sockets as channels in one process: what a simulation
/// on tokio's paused clock uses, where a real datagram could arrive seconds
/// late in simulated time whenever the host is busy (the clock moves on while
/// the kernel has not delivered it yet). Same addresses, same best effort (a
/// full or gone receiver drops the push, as a lost datagram would).
#[derive(Debug, Clone, Default)]
pub struct InProcessNet {
    peers: Arc<std::sync::Mutex<HashMap<SocketAddr, mpsc::Sender<Hint>>>>,
    sockets: Arc<std::sync::atomic::AtomicU16>,
}

impl InProcessNet {
    /// A socket on this network at a fresh loopback address (nothing is bound).
    pub fn socket(&self) -> HandoffSocket {
        let index = self
            .sockets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20_000_u16.saturating_add(index);
        HandoffSocket {
            transport: Transport::InProcess(self.clone()),
            advertised: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

/// Why `HANDOFF_LISTEN` could not be served.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The address could not be bound.
    #[error("cannot bind HANDOFF_LISTEN {listen}")]
    Bind {
        /// `HANDOFF_LISTEN`.
        listen: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The bound socket could not be set up.
    #[error(transparent)]
    Socket(#[from] std::io::Error),
}

impl HandoffSocket {
    /// Binds `HANDOFF_LISTEN`; the advertised address replaces an unspecified
    /// IP with the ECS task's own (what peers in other tasks reach), else
    /// loopback.
    pub fn bind(
        listen: SocketAddr,
        task: Option<&leasehold_platform::ecs::TaskMetadata>,
    ) -> Result<Self, BindError> {
        let socket = std::net::UdpSocket::bind(listen)
            .map_err(|source| BindError::Bind { listen, source })?;
        let mut advertised = socket.local_addr()?;
        if advertised.ip().is_unspecified() {
            let ip = task
                .and_then(|metadata| metadata.private_ipv4())
                .map_or(IpAddr::from([127, 0, 0, 1]), IpAddr::V4);
            advertised.set_ip(ip);
        }
        Ok(HandoffSocket::new(socket, advertised)?)
    }

    /// Wraps a bound socket; `advertised` is what peers send to (the bound
    /// address, with a routable IP in place of an unspecified one).
    pub fn new(socket: std::net::UdpSocket, advertised: SocketAddr) -> std::io::Result<Self> {
        socket.set_nonblocking(true)?;
        Ok(HandoffSocket {
            transport: Transport::Udp(Arc::new(tokio::net::UdpSocket::from_std(socket)?)),
            advertised,
        })
    }

    /// The address announced as `handoff_addr`.
    pub fn advertised(&self) -> SocketAddr {
        self.advertised
    }

    /// Forwards every hint sent to this worker until the receiver goes.
    pub fn listen(&self) -> (mpsc::Receiver<Hint>, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(256);
        let socket = match &self.transport {
            Transport::Udp(socket) => socket.clone(),
            Transport::InProcess(net) => {
                net.peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(self.advertised, tx);
                return (rx, tokio::spawn(async {}));
            }
        };
        let task = tokio::spawn(async move {
            let mut buffer = vec![0u8; MAX_DATAGRAM];
            loop {
                let Ok((read, from)) = socket.recv_from(&mut buffer).await else {
                    continue;
                };
                if let Some(hint) = decode_hint(&buffer[..read], from)
                    && tx.send(hint).await.is_err()
                {
                    return;
                }
            }
        });
        (rx, task)
    }

    /// Tells `to` that `stream_id` is free for it. Best effort: a failure
    /// leaves the doorbell path.
    pub async fn push(&self, to: SocketAddr, stream_id: &str) {
        self.send(to, encode(stream_id), Hint::Take(stream_id.to_owned()))
            .await;
    }

    /// Asks `to` to subscribe `stream_id` before this worker releases it.
    pub async fn prepare(&self, to: SocketAddr, stream_id: &str) {
        let hint = Hint::Prepare {
            stream: stream_id.to_owned(),
            reply: self.advertised,
        };
        self.send(to, encode_prepare(stream_id, self.advertised), hint)
            .await;
    }

    /// Tells `to` that this worker holds `stream_id` from `first_seq` on.
    pub async fn ready(&self, to: SocketAddr, stream_id: &str, first_seq: u64) {
        let hint = Hint::Ready {
            stream: stream_id.to_owned(),
            first_seq,
            from: self.advertised,
        };
        self.send(to, encode_ready(stream_id, first_seq), hint)
            .await;
    }

    async fn send(&self, to: SocketAddr, datagram: Vec<u8>, hint: Hint) {
        match &self.transport {
            Transport::Udp(socket) => {
                if let Err(err) = socket.send_to(&datagram, to).await {
                    tracing::debug!(%to, error = %err, "hand-off datagram not sent; the doorbell remains");
                }
            }
            Transport::InProcess(net) => {
                let peer = net
                    .peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&to)
                    .cloned();
                if let Some(peer) = peer {
                    let _ = peer.try_send(hint);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_datagram_names_one_stream() {
        assert_eq!(decode(&encode("btc-usd")), Some("btc-usd"));
        assert_eq!(decode(b"leasehold-handoff "), None);
        assert_eq!(decode(b"something else"), None);
        assert_eq!(decode(b"leasehold-handoff \xff"), None);
    }

    #[test]
    fn only_peer_like_addresses_are_sent_to() {
        for ok in ["10.0.3.7:9470", "127.0.0.1:40000", "[fd12::7]:9470"] {
            assert!(peer_addr(ok).is_some(), "{ok}");
        }
        for refused in [
            "0.0.0.0:9470",
            "224.0.0.1:9470",
            "255.255.255.255:9470",
            "169.254.169.254:80",
            "[fe80::1]:9470",
            "[fd00:ec2::254]:80",
            "10.0.3.7:0",
            "10.0.3.7",
            "host:9470",
        ] {
            assert!(peer_addr(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn the_least_loaded_peer_with_an_address_succeeds() {
        let census = Census {
            streams: 8,
            held_by: BTreeMap::from([
                ("a".to_owned(), 1),
                ("b".to_owned(), 1),
                ("c".to_owned(), 0),
                ("me".to_owned(), 0),
            ]),
        };
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut addrs = HashMap::from([("a".to_owned(), addr), ("b".to_owned(), addr)]);
        assert_eq!(
            successor(&census, "me", &addrs),
            Some("a"),
            "c has no address"
        );
        addrs.insert("c".to_owned(), addr);
        assert_eq!(successor(&census, "me", &addrs), Some("c"));
        assert_eq!(successor(&census, "me", &HashMap::new()), None);
    }

    #[tokio::test]
    async fn a_pushed_stream_reaches_the_listener() {
        let bound = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = bound.local_addr().unwrap();
        let receiver = HandoffSocket::new(bound, addr).unwrap();
        let (mut pushed, task) = receiver.listen();
        let sender =
            HandoffSocket::new(std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), addr).unwrap();
        sender.push(addr, "eth-usd").await;
        assert_eq!(pushed.recv().await, Some(Hint::Take("eth-usd".into())));
        sender.prepare(addr, "btc usd").await;
        assert_eq!(
            pushed.recv().await,
            Some(Hint::Prepare {
                stream: "btc usd".into(),
                reply: addr
            })
        );
        task.abort();
    }

    #[test]
    fn prepares_and_readies_name_their_stream_and_reply_or_sequence() {
        let peer: SocketAddr = "10.0.3.7:9470".parse().unwrap();
        let from: SocketAddr = "10.0.3.8:9470".parse().unwrap();
        assert_eq!(
            decode_hint(&encode_prepare("a b", peer), from),
            Some(Hint::Prepare {
                stream: "a b".into(),
                reply: peer
            })
        );
        assert_eq!(
            decode_hint(&encode_ready("a b", 42), from),
            Some(Hint::Ready {
                stream: "a b".into(),
                first_seq: 42,
                from
            })
        );
        // A reply address no peer may have is refused with the hint.
        let metadata: SocketAddr = "169.254.169.254:80".parse().unwrap();
        assert_eq!(decode_hint(&encode_prepare("s", metadata), from), None);
        assert_eq!(decode_hint(b"leasehold-ready x s", from), None);
        assert_eq!(decode_hint(b"leasehold-ready 5 ", from), None);
        assert_eq!(decode_hint(b"leasehold-prepare 10.0.3.7:9470", from), None);
    }

    #[tokio::test]
    async fn an_unspecified_listen_address_is_advertised_as_loopback_without_a_task() {
        let socket = HandoffSocket::bind("0.0.0.0:0".parse().unwrap(), None).unwrap();
        let advertised = socket.advertised();
        assert_eq!(advertised.ip(), IpAddr::from([127, 0, 0, 1]));
        assert_ne!(advertised.port(), 0);
        let taken =
            HandoffSocket::bind(SocketAddr::from(([127, 0, 0, 1], advertised.port())), None);
        let Err(err) = taken else {
            panic!("the port is bound")
        };
        assert!(
            err.to_string().starts_with("cannot bind HANDOFF_LISTEN"),
            "{err}"
        );
    }
}
