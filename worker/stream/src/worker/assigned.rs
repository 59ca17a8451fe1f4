//! Assigned discovery (`DISCOVERY_MODE=assigned`): the worker holding the
//! assigner lease (`leasehold#assigner`) scans the table once per interval,
//! eventually consistent, plans ([`crate::assignment::plan`]) and writes each
//! stream's `assignee`; every worker finds its own streams with one `Query`
//! of the assignee index. Table reads then grow with streams, not with
//! streams × workers.
//!
//! The index and the scan are eventually consistent, so a worker acts on
//! neither directly: it re-reads the record (strongly consistent) before it
//! takes a stream or hands one over, and only the conditional acquire
//! decides ownership (two assigners, a stale one or a dead one can cost
//! moves and time, never a second owner). The assigner pushes each new
//! assignment to its worker's hand-off socket, so a free stream is taken at
//! once rather than at the worker's next query; a worker handing a stream
//! over pushes it to its assignee once released.

use std::collections::BTreeMap;

use leasehold_control::store::Consistency;

use super::*;
use crate::assignment::{self, Change, Seat};

/// How many assignments the assigner writes at once.
const ASSIGN_CONCURRENCY: usize = 32;

/// How long after a lapsing worker's streams become takeable the assigner
/// plans again (the read that finds the lapse must see it past the margin).
const LAPSE_SLACK_MS: u64 = 100;

/// Why a stream is offered to this worker, and so what its re-read record
/// must say before the worker takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Offered {
    /// Its query, or its own assigner pass: the advice must name this worker.
    Assigned,
    /// A datagram (the assigner, or a draining peer that chose this worker):
    /// advised here, to nobody, or still to the worker that released it.
    Pushed,
}

impl Offered {
    fn accepts(self, record: &Lease, me: &str) -> bool {
        match (self, record.assignee.as_deref()) {
            (_, Some(assignee)) if assignee == me => true,
            (Offered::Assigned, _) => false,
            (Offered::Pushed, None) => true,
            (Offered::Pushed, Some(assignee)) => record.last_owner.as_deref() == Some(assignee),
        }
    }
}

impl StreamWorker {
    fn me(&self) -> String {
        self.context.keeper.config().owner_id.clone()
    }

    fn skew_ms(&self) -> i64 {
        i64::try_from(self.context.keeper.config().skew_margin.as_millis()).unwrap_or(i64::MAX)
    }

    /// One pass: serve as the assigner if this worker holds (or can take)
    /// the assigner lease, then follow this worker's own assignments.
    pub(super) async fn follow_assignments(&mut self) -> Result<(), LeaseError> {
        self.ensure_presence().await;
        if let Err(err) = self.serve_as_assigner().await {
            tracing::warn!(error = %err, "assigner pass failed; retrying at the next interval");
        }
        let me = self.me();
        let reader = self.context.keeper.reader();
        let mine: HashSet<String> = reader.assigned(&me).await?.into_iter().collect();
        // Held here, advised elsewhere: handed over once a strong re-read
        // confirms it (the index may not show a fresh assignment here yet).
        let elsewhere: Vec<String> = self
            .running
            .iter()
            .filter(|(stream, running)| !mine.contains(*stream) && !self.leaving(running))
            .map(|(stream, _)| stream.clone())
            .collect();
        for stream in elsewhere {
            if let Ok(record) = reader.get(&stream).await
                && let Some(assignee) = record.assignee.filter(|a| *a != me)
                && self.is_live(&assignee).await
            {
                self.hand_to(&stream, assignee).await;
            }
        }
        let wanted: Vec<String> = mine
            .into_iter()
            .filter(|stream| !self.running.contains_key(stream))
            .collect();
        self.take(wanted, Offered::Assigned).await;
        Ok(())
    }

    /// Takes the offered streams there is room for, all at once (a drained
    /// peer's hundred streams must not wait for each other's round trips):
    /// each is re-read strongly consistent first, and taken only if the
    /// record confirms the offer ([`Offered::accepts`]) and the acquire
    /// condition lets this worker in; one another owner still holds gets a
    /// probe at its expiry (a live holder hands it over before then, and
    /// pushes it; a dead one's lease lapses). A forged push costs one read.
    pub(super) async fn take(&mut self, mut streams: Vec<String>, offered: Offered) {
        streams.retain(|stream| {
            !self.running.contains_key(stream) && !stream.starts_with(schema::RESERVED_PREFIX)
        });
        streams.sort();
        streams.dedup();
        streams.truncate(self.config.max_streams.saturating_sub(self.running.len()));
        let me = self.me();
        let (now, skew) = (self.clock.now_ms(), self.skew_ms());
        let reader = self.context.keeper.reader();
        let keeper = &self.context.keeper;
        let attempts = streams.iter().map(|stream| {
            let (reader, me) = (&reader, &me);
            async move {
                let record = read::read_stream(reader.as_ref(), stream, Consistency::Strong)
                    .await
                    .ok()?;
                if !offered.accepts(&record, me) {
                    return None;
                }
                if read::acquirable(&record, me, now, skew) {
                    return Some(Err(keeper.acquire(stream).await));
                }
                let owner = record.owner_id?;
                let takeable_at = protocol::takeable_at(record.lease_expires_at, skew);
                Some(Ok((stream.clone(), owner, takeable_at)))
            }
        });
        for outcome in futures_util::future::join_all(attempts)
            .await
            .into_iter()
            .flatten()
        {
            match outcome {
                Err(Ok(lease)) => self.start(lease),
                Err(Err(LeaseError::Conflict { .. })) => {}
                Err(Err(err)) => tracing::warn!(error = %err, "acquire failed"),
                Ok((stream, owner, takeable_at)) => {
                    let wait = Duration::from_millis(u64::try_from(takeable_at - now).unwrap_or(0));
                    self.probes
                        .schedule(Instant::now() + wait, stream, Some(owner));
                }
            }
        }
    }

    /// Whether `worker`'s presence record is held and current (strongly
    /// consistent): a stream is handed over only to a worker that can take
    /// it. Advice can name a worker that is draining or gone (its drain's
    /// own advice raced a push, or the assigner planned from an older scan);
    /// the assigner's next pass re-advises such a stream.
    async fn is_live(&self, worker: &str) -> bool {
        let reader = self.context.keeper.reader();
        reader
            .get(&schema::worker_presence(worker))
            .await
            .is_ok_and(|presence| presence.state(self.clock.now_ms()) == LeaseState::Owned)
    }

    /// Drains a held stream advised to `assignee`; pushed there once released
    /// (overlapped: the assignee subscribes it first).
    async fn hand_to(&mut self, stream: &str, assignee: String) {
        if self.running.contains_key(stream) {
            tracing::info!(
                stream_id = stream,
                assignee,
                "assigned elsewhere: handing the stream over"
            );
            let successor = self
                .peer_address(&assignee)
                .await
                .map(|addr| (assignee.clone(), addr));
            self.handing_to.insert(stream.to_owned(), assignee);
            self.release_to(stream, successor);
        }
    }

    /// Pushes a released stream to `worker`, at the address the last census
    /// or its presence record announces (checked like every peer address).
    pub(super) async fn push_to(&self, stream: &str, worker: &str) {
        if let (Some(socket), Some(addr)) = (&self.handoff, self.peer_address(worker).await) {
            socket.push(addr, stream).await;
        }
    }

    /// Where `worker` takes hand-offs: from the last census, else from its
    /// presence record (assigned discovery scans nothing here), checked
    /// like every peer address.
    pub(super) async fn peer_address(&self, worker: &str) -> Option<std::net::SocketAddr> {
        self.handoff.as_ref()?;
        if let Some(addr) = self.peer_addrs.get(worker) {
            return Some(*addr);
        }
        let reader = self.context.keeper.reader();
        let presence = reader.get(&schema::worker_presence(worker)).await.ok()?;
        presence
            .handoff_addr
            .as_deref()
            .and_then(handoff::peer_addr)
    }

    /// Holds the assigner lease if free (looked at first, eventually
    /// consistent: a held lease costs half a read unit, not a write), then
    /// scans, plans and writes what changed, pushing each change to its worker.
    async fn serve_as_assigner(&mut self) -> Result<(), LeaseError> {
        let me = self.me();
        let reader = self.context.keeper.reader();
        if !self.assigner.as_ref().is_some_and(HeldLease::is_valid) {
            self.assigner = None;
            let now = self.clock.now_ms();
            match reader
                .get_with(schema::ASSIGNER_LEASE, Consistency::Eventual)
                .await
            {
                Ok(lease)
                    if lease.state(now) == LeaseState::Owned
                        && lease.owner_id.as_deref() != Some(me.as_str()) =>
                {
                    return Ok(());
                }
                Ok(_) | Err(LeaseError::NotFound { .. }) => {}
                Err(err) => return Err(err),
            }
            match self.context.keeper.acquire(schema::ASSIGNER_LEASE).await {
                Ok(lease) => self.assigner = Some(lease),
                Err(LeaseError::Conflict { .. }) => return Ok(()),
                Err(err) => return Err(err),
            }
        }
        let table = LeaseTable::read(reader.as_ref(), 1000, Consistency::Eventual).await?;
        let now = self.clock.now_ms();
        let live: BTreeMap<&str, usize> = table
            .live_workers(now)
            .map(|(owner, presence)| {
                let max = presence
                    .lease
                    .max_streams
                    .and_then(|m| usize::try_from(m).ok());
                (owner, max.unwrap_or(usize::MAX))
            })
            .collect();
        // A live worker renews its presence a lease ahead; one that lapses
        // before the next pass has stopped renewing. Plan again the moment
        // its streams become takeable, not up to an interval later.
        let horizon =
            now + i64::try_from(self.config.discovery_interval.as_millis()).unwrap_or(i64::MAX);
        self.assigner_due = table
            .live_workers(now)
            .map(|(_, presence)| {
                protocol::takeable_at(presence.lease.lease_expires_at, self.skew_ms())
            })
            .filter(|at| *at <= horizon)
            .min()
            .map(|at| {
                Instant::now()
                    + Duration::from_millis(u64::try_from(at - now).unwrap_or(0) + LAPSE_SLACK_MS)
            });
        let seats: Vec<Seat<'_>> = table
            .streams
            .iter()
            .map(|lease| Seat {
                stream_id: &lease.stream_id,
                holder: lease.owner_id.as_deref().filter(|owner| {
                    lease.state(now) == LeaseState::Owned && live.contains_key(owner)
                }),
                assignee: lease.assignee.as_deref(),
            })
            .collect();
        let changes = assignment::plan(&seats, &live);
        let (_, addrs) = census_of(&table, now, &me, self.running.len());
        // Written ASSIGN_CONCURRENCY at a time (a cold table's first plan is
        // every stream), each pushed to its worker as soon as it is written.
        let keeper = &self.context.keeper;
        let assigner = self.assigner.clone();
        let (handoff, addrs) = (&self.handoff, &addrs);
        let written: Vec<Change> = futures_util::stream::iter(changes)
            // Lost the lease mid-pass: another assigner plans from here.
            .take_while(|_| std::future::ready(assigner.as_ref().is_some_and(HeldLease::is_valid)))
            .map(|change| async move {
                if let Err(err) = keeper.assign(&change.stream_id, &change.assignee).await {
                    tracing::warn!(stream_id = change.stream_id, error = %err, "could not write an assignment");
                    return None;
                }
                if let (Some(socket), Some(addr)) = (handoff, addrs.get(&change.assignee)) {
                    socket.push(*addr, &change.stream_id).await;
                }
                Some(change)
            })
            .buffer_unordered(ASSIGN_CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await;
        let own = written
            .into_iter()
            .filter(|change| change.assignee == me)
            .map(|change| change.stream_id)
            .collect();
        self.take(own, Offered::Assigned).await;
        Ok(())
    }

    /// Before a drain (no scans ran, so nothing is known of the peers): one
    /// strongly consistent read of the table, then each held stream gets a
    /// successor, written as its advice and pushed to once released. A
    /// stream already advised to a live peer keeps it; the rest go to the
    /// live peers with the least advised to them, which counts moves the
    /// assigner started (a newcomer about to receive its share is not also
    /// given the drained streams). The assigner lease is given up, so a peer
    /// plans from its next pass.
    pub(super) async fn prepare_assigned_drain(&mut self) {
        let reader = self.context.keeper.reader();
        match LeaseTable::read(reader.as_ref(), 1000, Consistency::Strong).await {
            Ok(table) => self.choose_successors(&table).await,
            Err(err) => {
                tracing::warn!(error = %err, "no census for the drain; released streams wait for the assigner")
            }
        }
        if let Some(assigner) = self.assigner.take()
            && let Err(err) = self.context.keeper.release(&assigner).await
        {
            tracing::warn!(error = %err, "could not release the assigner lease");
        }
    }

    async fn choose_successors(&mut self, table: &LeaseTable) {
        let me = self.me();
        let now = self.clock.now_ms();
        let (_, addrs) = census_of(table, now, &me, self.running.len());
        let live_peer =
            |worker: Option<&String>| worker.filter(|w| addrs.contains_key(*w)).cloned();
        let mut advised: BTreeMap<String, usize> = addrs.keys().map(|w| (w.clone(), 0)).collect();
        for lease in &table.streams {
            let holder = lease
                .owner_id
                .as_ref()
                .filter(|_| lease.state(now) == LeaseState::Owned);
            if let Some(worker) = live_peer(lease.assignee.as_ref()).or_else(|| live_peer(holder)) {
                *advised.entry(worker).or_default() += 1;
            }
        }
        let mut writes = Vec::new();
        for lease in table
            .streams
            .iter()
            .filter(|l| self.running.contains_key(&l.stream_id))
        {
            let successor = match live_peer(lease.assignee.as_ref()) {
                Some(assignee) => assignee,
                None => {
                    let Some((least, _)) = advised.iter().min_by_key(|(w, n)| (**n, (*w).clone()))
                    else {
                        break;
                    };
                    let least = least.clone();
                    *advised.entry(least.clone()).or_default() += 1;
                    writes.push((lease.stream_id.clone(), least.clone()));
                    least
                }
            };
            self.handing_to.insert(lease.stream_id.clone(), successor);
        }
        let keeper = &self.context.keeper;
        let written = writes
            .iter()
            .map(|(stream, successor)| keeper.assign(stream, successor));
        for result in futures_util::future::join_all(written).await {
            if let Err(err) = result {
                tracing::warn!(error = %err, "could not advise a drained stream's successor");
            }
        }
        self.peer_addrs = addrs;
    }
}
