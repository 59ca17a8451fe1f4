//! The order path's decisions, pure: no I/O and no clock. Given what a
//! request's record, the broker's lookup and the broker's answer said, the
//! next step — place, look up, answer (which response), replay or
//! dead-letter.
//!
//! `leasehold-broker`'s serve loop is the shell that performs each step, as
//! the stream runner does for the lease protocol. The two rules the bus
//! applies atomically live with their steps: who may begin a request
//! ([`crate::bus::begin`]) and who may store its final answer
//! ([`crate::bus::answer`]). `tests/it/request_model.rs` checks the whole path
//! under crashes, pauses, lost replies, lost records and a reused request id
//! by calling these functions and those rules.
//!
//! The order value is generic (`O`) so the model can use a small token where
//! the worker uses the broker's JSON.

use crate::bus::Begun;
use crate::protocol::ErrorCode;

/// What a worker does next with one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step<O> {
    /// Send the order once, under the request id as client order id.
    Place,
    /// Ask the broker for the order under the request id, for this reason.
    LookUp(LookUpFor),
    /// Store this final answer (only the mark holder's is stored).
    Answer(Final<O>),
    /// The request id was answered before: write the stored response again.
    Replay(String),
    /// Dead-letter the request without answering it: the reason is one of
    /// [`crate::protocol::dead_reason`].
    DeadLetter(&'static str),
    /// This worker no longer holds the user: touch nothing, stop serving (the
    /// request stays in processing for the holder).
    Stop,
}

/// Why a worker asks the broker for an order; decides what "absent" means.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LookUpFor {
    /// The record says `executing`: someone may have sent it. Absent → place.
    Settle,
    /// Taken too often without an answer. Absent → `poison`, never placed.
    Poison {
        /// Deliveries counted so far.
        deliveries: u32,
    },
    /// The order call timed out. Absent → `in_doubt`: a broker may book an
    /// order it received after the call gave up, so absent now is not absent
    /// for good.
    TimedOut(String),
    /// The connection broke during the call. Absent → `in_doubt`, as for a
    /// timeout: the order may have reached the broker and be booked later.
    ConnectionLost(String),
    /// The broker refused the client order id as used. Absent → `in_doubt`.
    Duplicate,
    /// `expires_at` passed before the order could be sent. A record lost in a
    /// failover can hide that an earlier attempt placed it, so the broker is
    /// asked before the request is answered "not executed". Absent → `expired`.
    Expired,
}

/// A request's final answer, before it is written as a response.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Final<O> {
    /// Executed (or found at the broker): the broker's record.
    Ok(O),
    /// Not executed, or not known: the code and a message for people.
    Error(ErrorCode, String),
}

impl<O> Final<O> {
    /// Whether the answer says the order may have been executed.
    pub fn may_have_executed(&self) -> bool {
        matches!(self, Final::Ok(_) | Final::Error(ErrorCode::InDoubt, _))
    }
}

/// What a lookup by client order id said.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Looked<O> {
    /// The broker holds the order.
    Found(O),
    /// The broker holds no order under the id.
    Absent,
    /// The broker could not tell (the connection, a timeout): why.
    Failed(String),
}

/// What sending an order came to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sent<O> {
    /// Placed: the broker's record.
    Placed(O),
    /// No answer within the budget: the order may be at the broker.
    TimedOut(String),
    /// The broker already holds an order under this client order id.
    Duplicate,
    /// The connection broke during the call: the order may be at the broker.
    ConnectionLost(String),
    /// The broker refused the order; nothing was executed.
    Refused(String),
    /// No connection could be opened (or the broker is unknown): nothing sent.
    NotSent(ErrorCode, String),
}

/// The message of an `in_doubt` answer: what to do about it.
fn in_doubt<O>(why: &str) -> Step<O> {
    Step::Answer(Final::Error(
        ErrorCode::InDoubt,
        format!(
            "{why}; the order may have been executed: look it up at the broker by its \
             client order id (the request id) before sending it again"
        ),
    ))
}

/// The first step for a request `user_id`'s worker just began.
///
/// A record of another user's request is never touched or answered (its id
/// was reused); a `done` record is replayed; an `executing` one is settled by
/// lookup, and after `max_deliveries` workers took it without an answer it is
/// settled without ever being placed again.
pub fn after_begin<O>(begun: &Begun, user_id: &str, max_deliveries: u32) -> Step<O> {
    match begun {
        Begun::NotHolder => Step::Stop,
        Begun::Started => Step::Place,
        Begun::Done {
            user_id: owner,
            response,
        } => {
            // Records written before the owner was stored (empty) are
            // replayed as before: no user can be told apart there.
            if !owner.is_empty() && owner != user_id {
                Step::DeadLetter(crate::protocol::dead_reason::FOREIGN_REQUEST_ID)
            } else {
                Step::Replay(response.clone())
            }
        }
        Begun::Executing {
            user_id: owner,
            deliveries,
            ..
        } => {
            if owner != user_id {
                Step::DeadLetter(crate::protocol::dead_reason::FOREIGN_REQUEST_ID)
            } else if *deliveries > max_deliveries {
                Step::LookUp(LookUpFor::Poison {
                    deliveries: *deliveries,
                })
            } else {
                Step::LookUp(LookUpFor::Settle)
            }
        }
    }
}

/// The step after a lookup made for `why`.
pub fn after_lookup<O>(why: LookUpFor, looked: Looked<O>) -> Step<O> {
    let problem = match looked {
        Looked::Found(order) => return Step::Answer(Final::Ok(order)),
        Looked::Failed(problem) => problem,
        Looked::Absent => {
            return match why {
                LookUpFor::Settle => Step::Place,
                LookUpFor::Poison { deliveries } => Step::Answer(Final::Error(
                    ErrorCode::Poison,
                    format!(
                        "taken by {deliveries} workers without a final answer (REQUEST_MAX_DELIVERIES); \
                         the broker holds no such order: not executed"
                    ),
                )),
                // A lookup right after a timeout or a lost connection only
                // says the broker has not booked the order *yet*: one that
                // reached it may still be booked. "Not executed" here would
                // make an API resend an order that then fills twice.
                LookUpFor::TimedOut(err) => in_doubt(&format!(
                    "{err}; asked afterwards by client order id, the broker holds no such order yet"
                )),
                LookUpFor::ConnectionLost(problem) => in_doubt(&format!(
                    "broker connection lost: {problem}; asked afterwards by client order id, the broker holds no such order yet"
                )),
                LookUpFor::Duplicate => in_doubt(
                    "the broker refused the client order id as used but holds no such order",
                ),
                LookUpFor::Expired => Step::Answer(Final::Error(
                    ErrorCode::Expired,
                    "expires_at passed before the order could be sent; not executed".to_owned(),
                )),
            };
        }
    };
    in_doubt(&format!("the broker could not tell: {problem}"))
}

/// The step after sending the order. Whenever the order may be at the
/// broker, the broker is asked by client order id: never guess, never resend.
pub fn after_send<O>(sent: Sent<O>) -> Step<O> {
    match sent {
        Sent::Placed(order) => Step::Answer(Final::Ok(order)),
        Sent::TimedOut(err) => Step::LookUp(LookUpFor::TimedOut(err)),
        Sent::ConnectionLost(problem) => Step::LookUp(LookUpFor::ConnectionLost(problem)),
        // A lost record (a failover) or an order placed by a predecessor that
        // was still running: the broker's record is the answer.
        Sent::Duplicate => Step::LookUp(LookUpFor::Duplicate),
        Sent::Refused(why) => Step::Answer(Final::Error(ErrorCode::Broker, why)),
        Sent::NotSent(code, why) => {
            Step::Answer(Final::Error(code, format!("{why}; not executed")))
        }
    }
}

/// Whether an order may be sent now (checked before the connect and again
/// once it is ready): `Ok(budget)` is how long the call may take (the order
/// timeout, cut to the time left before `expires_at`); `Err` is the step
/// instead of sending: past `expires_at`, the broker is asked first (a lost
/// record may hide an earlier attempt), never sent.
pub fn send_budget<O>(
    expires_at: Option<u64>,
    now_unix_ms: u64,
    order_timeout_ms: u64,
) -> Result<u64, Step<O>> {
    match expires_at {
        None => Ok(order_timeout_ms),
        Some(at) if now_unix_ms >= at => Err(Step::LookUp(LookUpFor::Expired)),
        Some(at) => Ok(order_timeout_ms.min(at - now_unix_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_users_record_is_dead_lettered_whatever_its_state() {
        let done = Begun::Done {
            user_id: "u1".into(),
            response: "{}".into(),
        };
        let running = Begun::Executing {
            user_id: "u1".into(),
            worker_id: "w1".into(),
            deliveries: 1,
        };
        for begun in [done, running] {
            assert_eq!(
                after_begin::<()>(&begun, "u2", 3),
                Step::DeadLetter("foreign_request_id")
            );
        }
        let own = Begun::Done {
            user_id: "u1".into(),
            response: "{\"r\":1}".into(),
        };
        assert_eq!(
            after_begin::<()>(&own, "u1", 3),
            Step::Replay("{\"r\":1}".into())
        );
    }

    #[test]
    fn a_request_taken_too_often_is_looked_up_and_never_placed() {
        let begun = |deliveries| Begun::Executing {
            user_id: "u1".into(),
            worker_id: "w1".into(),
            deliveries,
        };
        assert_eq!(
            after_begin::<()>(&begun(3), "u1", 3),
            Step::LookUp(LookUpFor::Settle)
        );
        let poison = after_begin::<()>(&begun(4), "u1", 3);
        assert_eq!(poison, Step::LookUp(LookUpFor::Poison { deliveries: 4 }));
        let Step::LookUp(why) = poison else {
            unreachable!()
        };
        assert!(matches!(
            after_lookup::<()>(why.clone(), Looked::Absent),
            Step::Answer(Final::Error(ErrorCode::Poison, _))
        ));
        assert_eq!(
            after_lookup(why, Looked::Found(7)),
            Step::Answer(Final::Ok(7))
        );
    }

    #[test]
    fn a_refused_client_order_id_is_looked_up_never_assumed() {
        assert_eq!(
            after_send::<u8>(Sent::Duplicate),
            Step::LookUp(LookUpFor::Duplicate)
        );
        assert_eq!(
            after_lookup(LookUpFor::Duplicate, Looked::Found(1)),
            Step::Answer(Final::Ok(1))
        );
        assert!(matches!(
            after_lookup::<u8>(LookUpFor::Duplicate, Looked::Absent),
            Step::Answer(Final::Error(ErrorCode::InDoubt, _))
        ));
    }

    #[test]
    fn after_a_timeout_or_a_lost_connection_absent_is_in_doubt_never_not_executed() {
        for why in [
            LookUpFor::TimedOut("place_order timed out".into()),
            LookUpFor::ConnectionLost("reset".into()),
        ] {
            let step = after_lookup::<u8>(why.clone(), Looked::Absent);
            let Step::Answer(answer) = step else {
                panic!("{why:?}: {step:?}");
            };
            assert!(answer.may_have_executed(), "{why:?}: {answer:?}");
            assert!(matches!(answer, Final::Error(ErrorCode::InDoubt, _)));
            assert_eq!(
                after_lookup(why, Looked::Found(7)),
                Step::Answer(Final::Ok(7))
            );
        }
    }

    #[test]
    fn an_order_that_may_be_at_the_broker_is_looked_up() {
        for sent in [
            Sent::<u8>::TimedOut("t".into()),
            Sent::ConnectionLost("c".into()),
            Sent::Duplicate,
        ] {
            assert!(matches!(after_send(sent), Step::LookUp(_)));
        }
        assert!(matches!(
            after_send::<u8>(Sent::Refused("no".into())),
            Step::Answer(Final::Error(ErrorCode::Broker, _))
        ));
        assert!(matches!(
            after_lookup::<u8>(LookUpFor::Settle, Looked::Failed("down".into())),
            Step::Answer(Final::Error(ErrorCode::InDoubt, _))
        ));
        assert_eq!(
            after_lookup::<u8>(LookUpFor::Settle, Looked::Absent),
            Step::Place
        );
    }

    #[test]
    fn the_send_budget_is_cut_to_the_time_left() {
        assert_eq!(send_budget::<()>(None, 100, 10_000), Ok(10_000));
        assert_eq!(send_budget::<()>(Some(2_100), 100, 10_000), Ok(2_000));
        assert_eq!(
            send_budget::<()>(Some(100), 100, 10_000),
            Err(Step::LookUp(LookUpFor::Expired))
        );
        assert!(send_budget::<()>(Some(99), 100, 10_000).is_err());
        // Expired is "not executed" only once the broker says it holds nothing.
        assert!(matches!(
            after_lookup::<u8>(LookUpFor::Expired, Looked::Absent),
            Step::Answer(Final::Error(ErrorCode::Expired, _))
        ));
        assert_eq!(
            after_lookup(LookUpFor::Expired, Looked::Found(3)),
            Step::Answer(Final::Ok(3))
        );
    }
}
