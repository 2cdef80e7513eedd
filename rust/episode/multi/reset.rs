//! When a multi-agent chunk may record a reset: only at its very start (env step 0 of the
//! episode, nothing recorded yet) and while it is not done.

use std::fmt;

/// Why a reset cannot be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetError {
    /// The episode is terminated or truncated.
    Done,
    /// The chunk is past env step 0 (or starts later in the episode).
    NotAtStart { env_t: i64, env_t_started: i64 },
}

impl fmt::Display for ResetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResetError::Done => write!(f, "add_env_reset: the episode is done"),
            ResetError::NotAtStart { env_t, env_t_started } => write!(
                f,
                "add_env_reset: a reset starts at env_t=0, this episode is at env_t={env_t} \
                 (env_t_started={env_t_started})"
            ),
        }
    }
}

impl std::error::Error for ResetError {}

/// Checks that a chunk at `env_t` (started at `env_t_started`, done or not) may record a
/// reset.
///
/// # Errors
/// [`ResetError::Done`] first, then [`ResetError::NotAtStart`].
pub fn check_reset(is_done: bool, env_t: i64, env_t_started: i64) -> Result<(), ResetError> {
    if is_done {
        return Err(ResetError::Done);
    }
    if env_t != 0 || env_t_started != 0 {
        return Err(ResetError::NotAtStart { env_t, env_t_started });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_is_recorded_only_at_the_start_of_a_live_episode() {
        assert_eq!(check_reset(false, 0, 0), Ok(()));
        assert_eq!(check_reset(true, 0, 0), Err(ResetError::Done));
        assert_eq!(check_reset(true, 3, 0), Err(ResetError::Done));
        assert_eq!(check_reset(false, 3, 0), Err(ResetError::NotAtStart { env_t: 3, env_t_started: 0 }));
        assert_eq!(check_reset(false, 5, 5), Err(ResetError::NotAtStart { env_t: 5, env_t_started: 5 }));
        assert_eq!(
            check_reset(false, 3, 1).unwrap_err().to_string(),
            "add_env_reset: a reset starts at env_t=0, this episode is at env_t=3 (env_t_started=1)"
        );
        assert_eq!(check_reset(true, 0, 0).unwrap_err().to_string(), "add_env_reset: the episode is done");
    }
}
