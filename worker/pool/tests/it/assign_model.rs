//! The credential sealer's assign step, model-checked with stateright.
//!
//! One user, two pool workers (w0, w1), the API and the pool bus. The API
//! pushes up to two claims for the user, each after writing a grant bound to
//! it, and may write a reload grant while the user has a worker. A worker
//! takes a queued claim into its own claim list, asks the sealer (with its
//! own key, whenever it likes: either worker may be the compromised one),
//! settles its claim, or dies (its mark expires, its taken claim goes back to
//! the queue). The seal is one atomic transition that calls
//! `leasehold_pool::bus::assign::assign_rule`, the rule the Lua and the
//! memory bus apply, and performs the effects both buses perform; nothing
//! else is re-implemented here.
//!
//! Each check of the rule has a switch in [`Fixes`]; a test turns one off and
//! expects a counterexample. (The model assumes a worker asks as itself: the
//! sealer does not authenticate its callers yet, see docs/deviations.md.)

use leasehold_pool::bus::assign::{Asker, Assignment, MarkSeen, SealHolder, assign_rule};
use leasehold_testkit::model_check;
use stateright::{Checker, HasDiscoveries, Model, Property};

const WORKERS: usize = 2;
const CLAIMS: u8 = 2;
const GRANTS: u8 = 3;

/// Which checks of the assign rule are on.
#[derive(Clone, Copy, Debug)]
struct Fixes {
    /// A grant is used only by the worker it is bound to (the claim in its
    /// own list; the recorded holder for a reload).
    binding: bool,
    /// One seal per grant (`used_by`).
    one_seal: bool,
    /// No assignment while another worker holds the user.
    holder_check: bool,
    /// Broker workers cannot write user marks (deploy/redis-acl.conf); off,
    /// any worker may set the user's mark to itself (the old ACL).
    marks_read_only: bool,
}

impl Fixes {
    const ALL: Fixes = Fixes {
        binding: true,
        one_seal: true,
        holder_check: true,
        marks_read_only: true,
    };
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Reason {
    Claim(u8),
    Reload,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Grant {
    number: u8,
    reason: Reason,
    used_by: Option<usize>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    grant: Option<Grant>,
    mark: Option<usize>,
    holder: Option<usize>,
    queue: Vec<u8>,
    taken: [Option<u8>; WORKERS],
    pushed: u8,
    grants: u8,
    /// Which workers ever took each claim into their list.
    took: [[bool; WORKERS]; CLAIMS as usize],
    /// Every answered seal: (worker, grant number, what it was for).
    seals: Vec<(usize, u8, Reason)>,
    /// A reload was answered to a worker other than the one the sealer
    /// assigned the user to.
    reload_to_other: bool,
    /// A user was assigned while another worker held its mark.
    over_live_holder: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    PushClaim,
    GrantReload,
    Take(usize),
    Seal(usize),
    Settle(usize),
    Die(usize),
    ForgeMark(usize),
}

struct AssignModel {
    fixes: Fixes,
}

fn worker(w: usize) -> String {
    format!("w{w}")
}

fn claim_json(id: u8) -> String {
    format!(r#"{{"user_id":"u","encrypted_credentials":"x","claim_id":"c{id}","enqueued_at":1}}"#)
}

impl AssignModel {
    /// The rule's inputs as the bus stores them, with the switched-off
    /// checks made to pass.
    fn decide(&self, s: &State, w: usize) -> Assignment {
        let Some(grant) = s.grant else {
            return assign_rule(&asker(w), None, None, &MarkSeen::Absent, &[]);
        };
        let used = match grant.used_by {
            Some(by) if self.fixes.one_seal => format!(r#","used_by":"{}""#, worker(by)),
            _ => String::new(),
        };
        let grant_json = match grant.reason {
            Reason::Claim(id) => {
                format!(r#"{{"reason":"claim","granted_at":1,"claim_id":"c{id}"{used}}}"#)
            }
            Reason::Reload => format!(r#"{{"reason":"reload","granted_at":1{used}}}"#),
        };
        let holder_of = |h: usize| SealHolder {
            worker_id: worker(h),
            seal_key: format!("K{h}"),
            bound_to: "c0".into(),
            login_hash: String::new(),
        };
        let holder = match (self.fixes.binding, s.holder) {
            (false, _) => Some(holder_of(w)),
            (true, h) => h.map(holder_of),
        }
        .map(|h| h.to_json());
        let taken: Vec<String> = match (self.fixes.binding, grant.reason) {
            (false, Reason::Claim(id)) => vec![claim_json(id)],
            _ => s.taken[w].map(claim_json).into_iter().collect(),
        };
        let mark = match s.mark {
            Some(m) if m == w || self.fixes.holder_check => MarkSeen::Held(worker(m)),
            _ => MarkSeen::Absent,
        };
        assign_rule(
            &asker(w),
            Some(&grant_json),
            holder.as_deref(),
            &mark,
            &taken,
        )
    }
}

fn asker(w: usize) -> Asker<'static> {
    const IDS: [&str; WORKERS] = ["w0", "w1"];
    const KEYS: [&str; WORKERS] = ["K0", "K1"];
    Asker {
        user_id: "u",
        worker_id: IDS[w],
        seal_key: KEYS[w],
        task_id: "",
    }
}

impl Model for AssignModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            grant: None,
            mark: None,
            holder: None,
            queue: Vec::new(),
            taken: [None; WORKERS],
            pushed: 0,
            grants: 0,
            took: [[false; WORKERS]; CLAIMS as usize],
            seals: Vec::new(),
            reload_to_other: false,
            over_live_holder: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.pushed < CLAIMS && s.grants < GRANTS {
            actions.push(Action::PushClaim);
        }
        if s.mark.is_some() && s.grants < GRANTS {
            actions.push(Action::GrantReload);
        }
        for w in 0..WORKERS {
            if s.taken[w].is_none() && !s.queue.is_empty() {
                actions.push(Action::Take(w));
            }
            actions.push(Action::Seal(w));
            if s.taken[w].is_some() {
                actions.push(Action::Settle(w));
            }
            if s.mark == Some(w) || s.taken[w].is_some() {
                actions.push(Action::Die(w));
            }
            if !self.fixes.marks_read_only && s.mark != Some(w) {
                actions.push(Action::ForgeMark(w));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::PushClaim => {
                // `leasehold claim`: the grant bound to the claim, then the push.
                s.grants += 1;
                s.grant = Some(Grant {
                    number: s.grants,
                    reason: Reason::Claim(s.pushed),
                    used_by: None,
                });
                s.queue.push(s.pushed);
                s.pushed += 1;
            }
            Action::GrantReload => {
                s.grants += 1;
                s.grant = Some(Grant {
                    number: s.grants,
                    reason: Reason::Reload,
                    used_by: None,
                });
            }
            Action::Take(w) => {
                let id = s.queue.remove(0);
                s.taken[w] = Some(id);
                s.took[usize::from(id)][w] = true;
            }
            Action::Seal(w) => {
                let decision = self.decide(&s, w);
                let grant = s.grant.as_mut()?;
                match decision {
                    Assignment::Assigned { .. } => {
                        if s.mark.is_some_and(|m| m != w) {
                            s.over_live_holder = true;
                        }
                        s.mark = Some(w);
                        s.holder = Some(w);
                    }
                    Assignment::Renewed { .. } => {
                        if s.holder != Some(w) {
                            s.reload_to_other = true;
                        }
                    }
                    _ => return None,
                }
                grant.used_by = Some(w);
                s.seals.push((w, grant.number, grant.reason));
            }
            Action::Settle(w) => s.taken[w] = None,
            Action::ForgeMark(w) => s.mark = Some(w),
            Action::Die(w) => {
                if s.mark == Some(w) {
                    s.mark = None;
                }
                // The re-queue of a dead pool worker's taken claims.
                if let Some(id) = s.taken[w].take() {
                    s.queue.insert(0, id);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a claim's credentials go only to a worker that took the claim",
                |_, s: &State| {
                    s.seals.iter().all(|&(w, _, reason)| match reason {
                        Reason::Claim(id) => s.took[usize::from(id)][w],
                        Reason::Reload => true,
                    })
                },
            ),
            Property::always(
                "a reload goes only to the worker the sealer assigned the user to",
                |_, s: &State| !s.reload_to_other,
            ),
            Property::always("one seal per grant", |_, s: &State| {
                (1..=GRANTS).all(|n| s.seals.iter().filter(|seal| seal.1 == n).count() <= 1)
            }),
            Property::always(
                "no worker is assigned a user another worker holds",
                |_, s: &State| !s.over_live_holder,
            ),
            Property::sometimes("a claimed user's credentials are sealed", |_, s: &State| {
                s.seals
                    .iter()
                    .any(|seal| matches!(seal.2, Reason::Claim(_)))
            }),
            Property::sometimes("a reload is sealed", |_, s: &State| {
                s.seals.iter().any(|seal| seal.2 == Reason::Reload)
            }),
        ]
    }
}

fn check(fixes: Fixes, finish_when: HasDiscoveries) -> impl Checker<AssignModel> {
    model_check::explore(AssignModel { fixes }, finish_when, model_check::depth(16))
}

#[test]
fn the_shipped_assign_rule_keeps_every_promise() {
    model_check::assert_every_property("assign model", || {
        check(Fixes::ALL, HasDiscoveries::AnyFailures)
    });
}

fn finds_without(fixes: Fixes, broken: &[&'static str]) {
    let checker = check(
        fixes,
        HasDiscoveries::AllOf(broken.iter().copied().collect()),
    );
    model_check::expect_counterexamples(&checker, broken);
}

#[test]
fn without_the_binding_a_worker_that_took_no_claim_gets_the_credentials() {
    finds_without(
        Fixes {
            binding: false,
            ..Fixes::ALL
        },
        &["a claim's credentials go only to a worker that took the claim"],
    );
}

/// The binding does not trust marks: even where a worker may write the
/// user's mark (the old ACL), forging it gets that worker nothing.
#[test]
fn with_writable_marks_the_binding_still_keeps_every_credentials_promise() {
    let fixes = Fixes {
        marks_read_only: false,
        ..Fixes::ALL
    };
    model_check::assert_every_property("assign model, writable marks", || {
        check(fixes, HasDiscoveries::AnyFailures)
    });
}

#[test]
fn with_writable_marks_and_no_binding_a_forged_mark_gets_a_reload() {
    finds_without(
        Fixes {
            binding: false,
            marks_read_only: false,
            ..Fixes::ALL
        },
        &["a reload goes only to the worker the sealer assigned the user to"],
    );
}

#[test]
fn without_one_seal_per_grant_a_grant_is_sealed_twice() {
    finds_without(
        Fixes {
            one_seal: false,
            ..Fixes::ALL
        },
        &["one seal per grant"],
    );
}

#[test]
fn without_the_holder_check_a_second_worker_is_assigned_a_held_user() {
    finds_without(
        Fixes {
            holder_check: false,
            ..Fixes::ALL
        },
        &["no worker is assigned a user another worker holds"],
    );
}
