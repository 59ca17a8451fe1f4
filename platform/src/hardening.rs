//! Process hardening for processes that hold decrypted secrets (the broker
//! worker, the `credentials` commands): no core dumps, so a crash cannot write a
//! user's broker credentials or a data key to disk, and (Linux) not dumpable, so
//! another process of the same user cannot ptrace it or read its memory or
//! environment through `/proc`.
//!
//! Both are plain system calls behind safe APIs (`rlimit`, `nix`); the
//! workspace forbids `unsafe`.

/// What [`disable_core_dumps`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hardened {
    /// `RLIMIT_CORE` soft and hard limits are 0.
    pub core_limit_zero: bool,
    /// `prctl(PR_GET_DUMPABLE)` says 0 (always `false` off Linux).
    pub not_dumpable: bool,
}

/// Why hardening failed (the process must not go on to decrypt anything).
#[derive(Debug, thiserror::Error)]
pub enum HardeningError {
    /// `setrlimit(RLIMIT_CORE, 0, 0)` failed.
    #[error("cannot set RLIMIT_CORE to 0: {0}")]
    CoreLimit(std::io::Error),
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error("cannot clear the dumpable flag: {0}")]
    Dumpable(String),
    /// The calls succeeded but reading back shows they did not take (a
    /// sandbox that fakes them, a kernel that ignores them).
    #[error("hardening did not take effect: {0}")]
    NotEffective(&'static str),
}

/// [`disable_core_dumps`] for a process about to hold decrypted secrets,
/// logging (at debug) what it achieved: such a process must not write them to
/// a core file or expose its memory to other processes of the same user.
pub fn harden_for_secrets() -> Result<Hardened, HardeningError> {
    let hardened = disable_core_dumps()?;
    tracing::debug!(
        core_limit_zero = hardened.core_limit_zero,
        not_dumpable = hardened.not_dumpable,
        "core dumps disabled"
    );
    Ok(hardened)
}

/// Sets `RLIMIT_CORE` to 0 (soft and hard: the process cannot raise it again)
/// and, on Linux, clears the dumpable flag. Call first thing, before any secret
/// is read; it applies to the whole process and is inherited by children.
pub fn disable_core_dumps() -> Result<Hardened, HardeningError> {
    rlimit::setrlimit(rlimit::Resource::CORE, 0, 0).map_err(HardeningError::CoreLimit)?;
    let core_limit_zero = rlimit::getrlimit(rlimit::Resource::CORE)
        .map(|limits| limits == (0, 0))
        .unwrap_or(false);
    #[cfg(target_os = "linux")]
    let not_dumpable = {
        nix::sys::prctl::set_dumpable(false)
            .map_err(|err| HardeningError::Dumpable(err.to_string()))?;
        nix::sys::prctl::get_dumpable() == Ok(false)
    };
    #[cfg(not(target_os = "linux"))]
    let not_dumpable = false;
    let hardened = Hardened {
        core_limit_zero,
        not_dumpable,
    };
    check(hardened, cfg!(target_os = "linux"))?;
    Ok(hardened)
}

/// A process that could still dump core, or (Linux) be read through `/proc`
/// by its user's other processes, must not go on to decrypt anything.
fn check(hardened: Hardened, dumpable_flag_exists: bool) -> Result<(), HardeningError> {
    if !hardened.core_limit_zero {
        return Err(HardeningError::NotEffective(
            "RLIMIT_CORE is not 0 after setting it",
        ));
    }
    if dumpable_flag_exists && !hardened.not_dumpable {
        return Err(HardeningError::NotEffective(
            "the process is still dumpable after PR_SET_DUMPABLE 0",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Hardened, HardeningError, check};

    #[test]
    fn a_check_that_did_not_take_is_an_error() {
        let both = Hardened {
            core_limit_zero: true,
            not_dumpable: true,
        };
        assert!(check(both, true).is_ok());
        let core = Hardened {
            core_limit_zero: false,
            ..both
        };
        assert!(matches!(
            check(core, true),
            Err(HardeningError::NotEffective(_))
        ));
        let dumpable = Hardened {
            not_dumpable: false,
            ..both
        };
        assert!(matches!(
            check(dumpable, true),
            Err(HardeningError::NotEffective(_))
        ));
        assert!(check(dumpable, false).is_ok(), "no dumpable flag off Linux");
    }

    /// Changes this test process only (a test binary of its own crate).
    #[test]
    fn core_dumps_are_off_afterwards() {
        let hardened = super::disable_core_dumps().unwrap();
        assert!(hardened.core_limit_zero);
        assert_eq!(rlimit::getrlimit(rlimit::Resource::CORE).unwrap(), (0, 0));
        #[cfg(target_os = "linux")]
        assert!(hardened.not_dumpable);
    }
}
