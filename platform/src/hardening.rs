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
    Ok(Hardened {
        core_limit_zero,
        not_dumpable,
    })
}

#[cfg(test)]
mod tests {
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
