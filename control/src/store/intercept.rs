//! One decorator for every lease store: [`Intercepted`] wraps any store and asks
//! an [`Interceptor`] about each call, named by a [`StoreOp`], before it reaches
//! the store (to fail, delay, hold or count it) and tells it afterwards how the
//! store answered (to count outcomes).
//!
//! Tests cut a store off, make renews hang or count writes by kind, and
//! `leasehold dev --chaos` holds or fails a worker's calls; each of them is an
//! interceptor of a few lines rather than a store that re-implements and
//! delegates every method, and a method added to [`LeaseStore`] is delegated
//! here once.
//!
//! It lives in this crate, public and not behind a feature, rather than in
//! `leasehold-testkit` with the other test helpers: the production dev
//! cluster's chaos gates use it (testkit is a dev-only crate), and so do this
//! crate's own unit tests (the keeper's), which could not pass their stores
//! to testkit's copy of this crate's types.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::{
    AcquireRequest, CheckpointRequest, Consistency, LeaseError, LeasePage, LeaseReader, LeaseStore,
    LiftRequest, ReleaseRequest, RenewRequest, TakeoverRequest,
};
use crate::lease::Lease;

/// A store call, named with the stream (or reserved record) it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp<'a> {
    /// [`LeaseReader::get_with`].
    Get {
        /// Stream read.
        stream_id: &'a str,
        /// How fresh the read must be.
        consistency: Consistency,
    },
    /// [`LeaseReader::list_with`]: one page of a listing.
    List {
        /// `None` for the first page of a scan.
        start_after: Option<&'a str>,
        /// Page size asked for.
        limit: usize,
        /// How fresh the read must be.
        consistency: Consistency,
    },
    /// [`LeaseStore::acquire`].
    Acquire {
        /// Stream asked for.
        stream_id: &'a str,
    },
    /// [`LeaseStore::renew`].
    Renew {
        /// Stream held.
        stream_id: &'a str,
    },
    /// [`LeaseStore::checkpoint`].
    Checkpoint {
        /// Stream held.
        stream_id: &'a str,
    },
    /// [`LeaseStore::release`].
    Release {
        /// Stream held.
        stream_id: &'a str,
    },
    /// [`LeaseStore::force_release`].
    ForceRelease {
        /// Stream released.
        stream_id: &'a str,
    },
    /// [`LeaseStore::register`].
    Register {
        /// Stream registered.
        stream_id: &'a str,
    },
    /// [`LeaseStore::bump`].
    Bump {
        /// The reserved record whose counter moves.
        record_id: &'a str,
    },
    /// [`LeaseStore::lift_token`].
    LiftToken {
        /// Stream held.
        stream_id: &'a str,
    },
    /// [`LeaseStore::take_over`].
    TakeOver {
        /// Stream taken.
        stream_id: &'a str,
    },
    /// [`LeaseStore::declare_mode`].
    DeclareMode,
    /// [`LeaseStore::assign`].
    Assign {
        /// Stream whose `assignee` is written.
        stream_id: &'a str,
    },
    /// [`LeaseReader::assigned`]: one index query.
    Assigned {
        /// Whose streams.
        assignee: &'a str,
    },
}

impl<'a> StoreOp<'a> {
    /// The record the call reads or writes; `None` for a listing.
    pub fn stream_id(&self) -> Option<&'a str> {
        match *self {
            StoreOp::List { .. } | StoreOp::Assigned { .. } => None,
            StoreOp::DeclareMode => Some(crate::schema::MODE_RECORD),
            StoreOp::Get { stream_id, .. }
            | StoreOp::Acquire { stream_id }
            | StoreOp::Renew { stream_id }
            | StoreOp::Checkpoint { stream_id }
            | StoreOp::Release { stream_id }
            | StoreOp::ForceRelease { stream_id }
            | StoreOp::Register { stream_id }
            | StoreOp::Bump {
                record_id: stream_id,
            }
            | StoreOp::LiftToken { stream_id }
            | StoreOp::TakeOver { stream_id }
            | StoreOp::Assign { stream_id } => Some(stream_id),
        }
    }

    /// Whether the call is a (conditional) write, i.e. a [`LeaseStore`] method.
    pub fn is_write(&self) -> bool {
        !matches!(
            self,
            StoreOp::Get { .. } | StoreOp::List { .. } | StoreOp::Assigned { .. }
        )
    }

    /// The method's name (`"renew"`, `"lift_token"`), for logs and counts by kind.
    pub fn name(&self) -> &'static str {
        match self {
            StoreOp::Get { .. } => "get",
            StoreOp::List { .. } => "list",
            StoreOp::Acquire { .. } => "acquire",
            StoreOp::Renew { .. } => "renew",
            StoreOp::Checkpoint { .. } => "checkpoint",
            StoreOp::Release { .. } => "release",
            StoreOp::ForceRelease { .. } => "force_release",
            StoreOp::Register { .. } => "register",
            StoreOp::Bump { .. } => "bump",
            StoreOp::LiftToken { .. } => "lift_token",
            StoreOp::TakeOver { .. } => "take_over",
            StoreOp::DeclareMode => "declare_mode",
            StoreOp::Assign { .. } => "assign",
            StoreOp::Assigned { .. } => "assigned",
        }
    }
}

/// What [`Intercepted`] asks about every call. Both methods default to letting
/// the call through unobserved, so an interceptor implements what it needs.
#[async_trait]
pub trait Interceptor: Send + Sync + 'static {
    /// Runs before the call reaches the inner store. An error is the caller's
    /// answer and the inner store is not called; a future that never completes
    /// holds the call (a paused process).
    async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
        let _ = op;
        Ok(())
    }

    /// Runs after the inner store answered, with whether it succeeded; not
    /// called when [`Interceptor::before`] refused the call.
    fn after(&self, op: StoreOp<'_>, outcome: Result<(), &LeaseError>) {
        let _ = (op, outcome);
    }
}

/// A lease store (or only a reader, when `S` is a [`LeaseReader`]) whose every
/// call passes an [`Interceptor`].
///
/// The inner store is shared (`Arc`), so several interceptors can front one
/// table (one per simulated process) and `S` may be `dyn LeaseStore`.
pub struct Intercepted<S: ?Sized, I> {
    inner: Arc<S>,
    interceptor: I,
}

impl<S: ?Sized, I: Interceptor> Intercepted<S, I> {
    /// `inner`'s calls, each passing `interceptor` first.
    pub fn new(inner: Arc<S>, interceptor: I) -> Self {
        Intercepted { inner, interceptor }
    }

    /// The interceptor, to switch its faults or read its counts.
    pub fn interceptor(&self) -> &I {
        &self.interceptor
    }

    /// The store behind the interceptor, to read or write around it.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// `call` on the inner store, between the interceptor's two hooks. The
    /// future is lazy: nothing reaches the store when `before` refuses.
    async fn run<T>(
        &self,
        op: StoreOp<'_>,
        call: impl Future<Output = Result<T, LeaseError>>,
    ) -> Result<T, LeaseError> {
        self.interceptor.before(op).await?;
        let result = call.await;
        self.interceptor.after(op, result.as_ref().map(|_| ()));
        result
    }
}

#[async_trait]
impl<S: LeaseReader + ?Sized, I: Interceptor> LeaseReader for Intercepted<S, I> {
    async fn get_with(
        &self,
        stream_id: &str,
        consistency: Consistency,
    ) -> Result<Lease, LeaseError> {
        let op = StoreOp::Get {
            stream_id,
            consistency,
        };
        self.run(op, self.inner.get_with(stream_id, consistency))
            .await
    }

    async fn list_with(
        &self,
        start_after: Option<&str>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<LeasePage, LeaseError> {
        let op = StoreOp::List {
            start_after,
            limit,
            consistency,
        };
        self.run(op, self.inner.list_with(start_after, limit, consistency))
            .await
    }

    async fn assigned(&self, assignee: &str) -> Result<Vec<String>, LeaseError> {
        let op = StoreOp::Assigned { assignee };
        self.run(op, self.inner.assigned(assignee)).await
    }
}

#[async_trait]
impl<S: LeaseStore + ?Sized, I: Interceptor> LeaseStore for Intercepted<S, I> {
    async fn acquire(&self, request: &AcquireRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::Acquire {
            stream_id: &request.stream_id,
        };
        self.run(op, self.inner.acquire(request)).await
    }

    async fn renew(&self, request: &RenewRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::Renew {
            stream_id: &request.stream_id,
        };
        self.run(op, self.inner.renew(request)).await
    }

    async fn checkpoint(&self, request: &CheckpointRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::Checkpoint {
            stream_id: &request.stream_id,
        };
        self.run(op, self.inner.checkpoint(request)).await
    }

    async fn release(&self, request: &ReleaseRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::Release {
            stream_id: &request.stream_id,
        };
        self.run(op, self.inner.release(request)).await
    }

    async fn force_release(&self, stream_id: &str, now_ms: i64) -> Result<Lease, LeaseError> {
        let op = StoreOp::ForceRelease { stream_id };
        self.run(op, self.inner.force_release(stream_id, now_ms))
            .await
    }

    async fn register(&self, stream_id: &str, now_ms: i64) -> Result<bool, LeaseError> {
        let op = StoreOp::Register { stream_id };
        self.run(op, self.inner.register(stream_id, now_ms)).await
    }

    async fn bump(&self, record_id: &str, now_ms: i64) -> Result<u64, LeaseError> {
        let op = StoreOp::Bump { record_id };
        self.run(op, self.inner.bump(record_id, now_ms)).await
    }

    async fn lift_token(&self, request: &LiftRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::LiftToken {
            stream_id: &request.stream_id,
        };
        self.run(op, self.inner.lift_token(request)).await
    }

    async fn take_over(&self, request: &TakeoverRequest) -> Result<Lease, LeaseError> {
        let op = StoreOp::TakeOver {
            stream_id: &request.acquire.stream_id,
        };
        self.run(op, self.inner.take_over(request)).await
    }

    async fn declare_mode(&self, mode: &str, now_ms: i64) -> Result<String, LeaseError> {
        self.run(StoreOp::DeclareMode, self.inner.declare_mode(mode, now_ms))
            .await
    }

    async fn assign(&self, stream_id: &str, assignee: Option<&str>) -> Result<(), LeaseError> {
        let op = StoreOp::Assign { stream_id };
        self.run(op, self.inner.assign(stream_id, assignee)).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::store::memory::MemoryLeaseStore;

    const NOW: i64 = 1_700_000_000_000;

    /// Refuses renews while `refuse_renew` is set; counts what reached the
    /// store by name, and the refusals the store itself gave.
    #[derive(Default)]
    struct RefuseRenew {
        refuse_renew: AtomicBool,
        before: Mutex<BTreeMap<&'static str, usize>>,
        after: Mutex<BTreeMap<&'static str, usize>>,
        store_errors: Mutex<Vec<&'static str>>,
    }

    #[async_trait]
    impl Interceptor for RefuseRenew {
        async fn before(&self, op: StoreOp<'_>) -> Result<(), LeaseError> {
            *self.before.lock().unwrap().entry(op.name()).or_default() += 1;
            if matches!(op, StoreOp::Renew { .. }) && self.refuse_renew.load(Ordering::SeqCst) {
                return Err(LeaseError::Throttled {
                    message: "refused by the interceptor".into(),
                });
            }
            Ok(())
        }

        fn after(&self, op: StoreOp<'_>, outcome: Result<(), &LeaseError>) {
            *self.after.lock().unwrap().entry(op.name()).or_default() += 1;
            if outcome.is_err() {
                self.store_errors.lock().unwrap().push(op.name());
            }
        }
    }

    fn acquire(stream_id: &str) -> AcquireRequest {
        AcquireRequest {
            stream_id: stream_id.into(),
            owner_id: "me".into(),
            now_ms: NOW,
            lease_ms: 30_000,
            skew_margin_ms: 1_000,
            sidecar_url: None,
            handoff_addr: None,
            max_streams: None,
            session_token: None,
        }
    }

    fn renew(fence_token: u64, now_ms: i64) -> RenewRequest {
        RenewRequest {
            stream_id: "s".into(),
            owner_id: "me".into(),
            fence_token,
            now_ms,
            lease_ms: 30_000,
            checkpoint: None,
        }
    }

    fn counts(map: &Mutex<BTreeMap<&'static str, usize>>) -> Vec<(&'static str, usize)> {
        map.lock().unwrap().iter().map(|(k, v)| (*k, *v)).collect()
    }

    #[tokio::test]
    async fn a_refused_renew_never_reaches_the_store_and_other_calls_pass_and_are_counted() {
        let inner = Arc::new(MemoryLeaseStore::new());
        let store = Intercepted::new(inner.clone(), RefuseRenew::default());
        let token = store.acquire(&acquire("s")).await.unwrap().fence_token;
        let renewed = store.renew(&renew(token, NOW + 1_000)).await.unwrap();
        assert_eq!(renewed.lease_expires_at, NOW + 31_000);

        store
            .interceptor()
            .refuse_renew
            .store(true, Ordering::SeqCst);
        let refused = store.renew(&renew(token, NOW + 2_000)).await.unwrap_err();
        assert!(
            matches!(&refused, LeaseError::Throttled { message } if message == "refused by the interceptor"),
            "{refused:?}"
        );
        assert_eq!(
            inner.get("s").await.unwrap().lease_expires_at,
            NOW + 31_000,
            "the refused renew wrote nothing"
        );
        // Everything else still passes, reads included.
        let checkpoint = CheckpointRequest {
            stream_id: "s".into(),
            owner_id: "me".into(),
            fence_token: token,
            checkpoint: 7,
            now_ms: NOW + 2_000,
        };
        assert_eq!(
            store.checkpoint(&checkpoint).await.unwrap().checkpoint,
            Some(7)
        );
        assert_eq!(store.get("s").await.unwrap().checkpoint, Some(7));
        assert!(store.register("t", NOW).await.unwrap());
        assert_eq!(store.list(None, 10).await.unwrap().leases.len(), 2);
        // A refusal by the store itself reaches `after`, as an error.
        assert!(store.get("absent").await.is_err());

        let interceptor = store.interceptor();
        assert_eq!(
            counts(&interceptor.before),
            [
                ("acquire", 1),
                ("checkpoint", 1),
                ("get", 2),
                ("list", 1),
                ("register", 1),
                ("renew", 2)
            ]
        );
        assert_eq!(
            counts(&interceptor.after),
            [
                ("acquire", 1),
                ("checkpoint", 1),
                ("get", 2),
                ("list", 1),
                ("register", 1),
                ("renew", 1)
            ],
            "the refused renew is not reported as answered"
        );
        assert_eq!(*interceptor.store_errors.lock().unwrap(), ["get"]);
    }

    #[test]
    fn an_op_names_its_record_and_whether_it_writes() {
        let get = StoreOp::Get {
            stream_id: "s",
            consistency: Consistency::Eventual,
        };
        assert_eq!((get.stream_id(), get.is_write()), (Some("s"), false));
        let list = StoreOp::List {
            start_after: Some("a"),
            limit: 10,
            consistency: Consistency::Strong,
        };
        assert_eq!((list.stream_id(), list.is_write()), (None, false));
        let bump = StoreOp::Bump {
            record_id: "leasehold#doorbell",
        };
        assert_eq!(
            (bump.stream_id(), bump.is_write(), bump.name()),
            (Some("leasehold#doorbell"), true, "bump")
        );
    }

    /// A store behind `dyn` is wrapped as it is, with the default interceptor
    /// hooks letting everything through.
    #[tokio::test]
    async fn a_dyn_store_with_a_silent_interceptor_behaves_as_the_store() {
        struct Silent;
        impl Interceptor for Silent {}
        let inner: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
        let store: Arc<dyn LeaseStore> = Arc::new(Intercepted::new(inner, Silent));
        let lease = store.acquire(&acquire("s")).await.unwrap();
        assert_eq!(lease.fence_token, 1);
        assert_eq!(store.bump("leasehold#doorbell", NOW).await.unwrap(), 1);
    }
}
