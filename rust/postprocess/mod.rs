//! Trajectory post-processing on flat batches: generalized advantage estimation over many
//! episode chunks laid end to end, in one pass (the old stack's `postprocess_trajectory`).

use std::fmt;

/// Why a GAE call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GaeError {
    /// `rewards` and `values` differ in length.
    Lengths { rewards: usize, values: usize },
    /// The segment lengths do not add up to the number of rows.
    Segments { total: usize, rows: usize },
    /// One bootstrap value is needed per segment.
    Bootstraps { segments: usize, bootstraps: usize },
    /// A segment of negative length.
    NegativeLength,
}

impl fmt::Display for GaeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lengths { rewards, values } => {
                write!(f, "{rewards} rewards but {values} value estimates")
            }
            Self::Segments { total, rows } => {
                write!(f, "segment lengths add up to {total}, the batch has {rows} rows")
            }
            Self::Bootstraps { segments, bootstraps } => {
                write!(f, "{segments} segments but {bootstraps} bootstrap values")
            }
            Self::NegativeLength => write!(f, "a segment length is negative"),
        }
    }
}

impl std::error::Error for GaeError {}

/// GAE of consecutive segments (episode chunks) of one flat batch.
///
/// Row `t` of a segment gets `A_t = sum_k (gamma * lambda)^k * delta_{t+k}` with
/// `delta_t = r_t + gamma * V_{t+1} - V_t`, where `V` after the segment's last row is the
/// segment's bootstrap value (0 after a terminal step). Sums run in f64; the outputs
/// (`advantages`, `advantages + values`) are written as f32.
///
/// # Errors
/// Inconsistent or negative lengths (see [`GaeError`]); nothing is written then.
#[allow(clippy::too_many_arguments)]
pub fn gae_segments(
    rewards: &[f32],
    values: &[f32],
    lengths: &[i64],
    bootstraps: &[f32],
    gamma: f64,
    lambda: f64,
    advantages: &mut [f32],
    targets: &mut [f32],
) -> Result<(), GaeError> {
    // Lengths as the host's int64 arrays hold them; a sum past `usize` fits no batch.
    let mut total = 0usize;
    for &len in lengths {
        let len = usize::try_from(len).map_err(|_| GaeError::NegativeLength)?;
        total = total.saturating_add(len);
    }
    let rows = rewards.len();
    if values.len() != rows || advantages.len() != rows || targets.len() != rows {
        return Err(GaeError::Lengths { rewards: rows, values: values.len() });
    }
    if total != rows {
        return Err(GaeError::Segments { total, rows });
    }
    if bootstraps.len() != lengths.len() {
        return Err(GaeError::Bootstraps { segments: lengths.len(), bootstraps: bootstraps.len() });
    }
    let decay = gamma * lambda;
    let mut end = rows;
    for (len, &bootstrap) in lengths.iter().zip(bootstraps).rev() {
        // Each length is in `0..=rows` (checked above: none negative, their sum `rows`).
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let start = end - *len as usize;
        let mut next_value = f64::from(bootstrap);
        let mut running = 0.0_f64;
        for t in (start..end).rev() {
            let value = f64::from(values[t]);
            let delta = f64::from(rewards[t]) + gamma * next_value - value;
            running = delta + decay * running;
            // Narrowing to the f32 columns the batch holds.
            #[allow(clippy::cast_possible_truncation)]
            {
                advantages[t] = running as f32;
                targets[t] = (running + value) as f32;
            }
            next_value = value;
        }
        end = start;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(r: &[f32], v: &[f32], lens: &[i64], b: &[f32], g: f64, l: f64) -> (Vec<f32>, Vec<f32>) {
        let mut a = vec![0.0; r.len()];
        let mut t = vec![0.0; r.len()];
        gae_segments(r, v, lens, b, g, l, &mut a, &mut t).unwrap();
        (a, t)
    }

    #[test]
    fn one_segment_matches_the_hand_computation() {
        // gamma = lambda = 1: A_t = sum of rewards from t + bootstrap - V_t.
        let (a, t) = run(&[1.0, 1.0], &[0.5, 0.5], &[2], &[0.0], 1.0, 1.0);
        assert_eq!(a, vec![1.5, 0.5]);
        assert_eq!(t, vec![2.0, 1.0]);
    }

    #[test]
    fn segments_do_not_leak_into_each_other() {
        let r = [1.0, 2.0, 3.0];
        let v = [0.1, 0.2, 0.3];
        let (a, _) = run(&r, &v, &[2, 1], &[10.0, 0.0], 0.9, 0.8);
        let (a1, _) = run(&r[..2], &v[..2], &[2], &[10.0], 0.9, 0.8);
        let (a2, _) = run(&r[2..], &v[2..], &[1], &[0.0], 0.9, 0.8);
        assert_eq!(a, [a1, a2].concat());
    }

    #[test]
    fn bootstrap_enters_the_last_delta() {
        let (a, _) = run(&[0.0], &[0.0], &[1], &[2.0], 0.5, 1.0);
        assert_eq!(a, vec![1.0]);
    }

    #[test]
    fn inconsistent_lengths_are_refused() {
        let mut a = vec![0.0; 2];
        let mut t = vec![0.0; 2];
        let err = gae_segments(&[0.0; 2], &[0.0; 2], &[3], &[0.0], 1.0, 1.0, &mut a, &mut t);
        assert_eq!(err, Err(GaeError::Segments { total: 3, rows: 2 }));
        let err = gae_segments(&[0.0; 2], &[0.0; 2], &[1, 1], &[0.0], 1.0, 1.0, &mut a, &mut t);
        assert_eq!(err, Err(GaeError::Bootstraps { segments: 2, bootstraps: 1 }));
        let err = gae_segments(&[0.0; 2], &[0.0; 1], &[2], &[0.0], 1.0, 1.0, &mut a, &mut t);
        assert!(matches!(err, Err(GaeError::Lengths { .. })));
    }

    #[test]
    fn negative_lengths_are_refused_before_anything_is_written() {
        let mut a = vec![7.0; 2];
        let mut t = vec![7.0; 2];
        // -1 and 3 add up to the rows; the negative one is refused all the same.
        let err = gae_segments(&[0.0; 2], &[0.0; 2], &[-1, 3], &[0.0; 2], 1.0, 1.0, &mut a, &mut t);
        assert_eq!(err, Err(GaeError::NegativeLength));
        assert_eq!(err.unwrap_err().to_string(), "a segment length is negative");
        assert_eq!((a, t), (vec![7.0; 2], vec![7.0; 2]));
        let err = gae_segments(
            &[0.0],
            &[0.0],
            &[i64::MAX, i64::MAX, 1],
            &[0.0; 3],
            1.0,
            1.0,
            &mut [0.0],
            &mut [0.0],
        );
        assert!(matches!(err, Err(GaeError::Segments { .. })), "a sum past usize is no panic");
    }
}
