//! What a stream's one write slot does next, decided without I/O: the
//! runner's `Window` is the shell that sends, waits and sleeps.
//!
//! One batch per stream is in flight at a time: with the fence in the entry
//! id, a batch sent past one that failed would land above the hole for good.

use std::ops::RangeInclusive;

use crate::sequence::ResumeMode;
use leasehold_sink::{SinkError, WriteOutcome};

/// After a write's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    /// The batch landed (appended, or a replayed head dropped): record it.
    Confirm,
    /// A newer owner's token is on the stream: stop at once.
    Fenced,
    /// The connection was lost since the open (or the stream never was
    /// opened): open again, compare, then decide ([`after_reopen`]).
    Reopen,
    /// Failed: wait the backoff, then send the same batch again (it is
    /// de-duplicated). `refusal` counts towards `SINK_MAX_FAILURES`.
    Resend {
        /// The sink refused (not an outage).
        refusal: bool,
    },
}

/// Classifies a write's reply.
pub(crate) fn after_write(reply: &Result<WriteOutcome, SinkError>) -> AfterWrite {
    match reply {
        Ok(outcome) if outcome.is_fenced() => AfterWrite::Fenced,
        Ok(_) => AfterWrite::Confirm,
        Err(SinkError::NotOpen { .. }) => AfterWrite::Reopen,
        Err(SinkError::Unavailable(_)) => AfterWrite::Resend { refusal: false },
        Err(SinkError::Rejected(_) | SinkError::Config(_)) => AfterWrite::Resend { refusal: true },
    }
}

/// After the stream was opened again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterReopen {
    /// The sink holds everything confirmed: send the batch again.
    Resend,
    /// The sink lost confirmed events the upstream can send again: drop the
    /// batch and start consuming over after the sink's end.
    Rewind {
        /// The sink's last sequence (consuming resumes after it).
        sink_last: u64,
    },
    /// The upstream cannot send them again (or the stream is draining):
    /// send the batch behind a `sink_lost` marker for this range.
    Mark(RangeInclusive<u64>),
}

/// Decides what a re-open's finding means: `lost` is the range the sink no
/// longer holds of what was confirmed ([`leasehold_control::protocol::lost_tail`]).
pub(crate) fn after_reopen(
    lost: Option<RangeInclusive<u64>>,
    resume: ResumeMode,
    draining: bool,
) -> AfterReopen {
    match lost {
        None => AfterReopen::Resend,
        Some(lost) if resume != ResumeMode::Live && !draining => AfterReopen::Rewind {
            sink_last: lost.start() - 1,
        },
        Some(lost) => AfterReopen::Mark(lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(accepted: u64, duplicate: u64, fenced: u64) -> Result<WriteOutcome, SinkError> {
        Ok(WriteOutcome {
            accepted,
            duplicate,
            fenced,
            highest_token: 1,
        })
    }

    #[test]
    fn a_reply_is_a_confirmation_a_fence_a_reopen_or_a_resend() {
        assert_eq!(after_write(&outcome(3, 0, 0)), AfterWrite::Confirm);
        assert_eq!(
            after_write(&outcome(0, 3, 0)),
            AfterWrite::Confirm,
            "a replayed batch is confirmed"
        );
        assert_eq!(after_write(&outcome(0, 0, 3)), AfterWrite::Fenced);
        let not_open = Err(SinkError::NotOpen {
            stream_id: "s".into(),
            fence_token: 1,
        });
        assert_eq!(after_write(&not_open), AfterWrite::Reopen);
        assert_eq!(
            after_write(&Err(SinkError::Unavailable("reset".into()))),
            AfterWrite::Resend { refusal: false }
        );
        assert_eq!(
            after_write(&Err(SinkError::Rejected("WRONGTYPE".into()))),
            AfterWrite::Resend { refusal: true }
        );
    }

    #[test]
    fn a_lost_tail_is_refilled_where_the_upstream_can_and_marked_where_it_cannot() {
        assert_eq!(
            after_reopen(None, ResumeMode::Live, false),
            AfterReopen::Resend
        );
        for refills in [ResumeMode::Replay, ResumeMode::Backfill] {
            assert_eq!(
                after_reopen(Some(7..=10), refills, false),
                AfterReopen::Rewind { sink_last: 6 }
            );
            assert_eq!(
                after_reopen(Some(7..=10), refills, true),
                AfterReopen::Mark(7..=10),
                "a drain cannot wait for a refill"
            );
        }
        assert_eq!(
            after_reopen(Some(1..=10), ResumeMode::Live, false),
            AfterReopen::Mark(1..=10)
        );
    }
}
