//! Action draws for the runners' hot path: one categorical draw per row of logits.
//!
//! Drawing from a small categorical with torch costs about ten tensor operations of about
//! 1 µs each (log-softmax, the draw, the gather of the log-probability, the check). For a
//! runner's batch of logits on the CPU the same draw is a few hundred nanoseconds here.
//! The uniforms come from the caller (torch's generator), so seeding torch still decides
//! every draw.

use std::fmt;

/// Why a row of logits cannot be drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawError {
    /// The row holds NaN or +inf, or every logit is -inf: no probability distribution.
    NoCategory { row: usize },
    /// The logits are not `rows * categories` values, or there are no categories.
    Shape { values: usize, categories: usize, uniforms: usize },
}

impl fmt::Display for DrawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrawError::NoCategory { row } => write!(
                f,
                "categorical logits of row {row} hold NaN or +inf, or every logit is -inf: \
                 no category can be drawn"
            ),
            DrawError::Shape { values, categories, uniforms } => write!(
                f,
                "{values} logits do not make {uniforms} rows of {categories} categories \
                 (one uniform per row, at least one category)"
            ),
        }
    }
}

impl std::error::Error for DrawError {}

/// Draws one category per row by inverse CDF and returns its log-probability.
///
/// Row `r` of `logits` is `logits[r * categories..(r + 1) * categories]`; its draw is the
/// first category whose cumulative probability exceeds `uniforms[r]` (in `[0, 1)`).
/// Categories with a -inf logit are never drawn. The softmax is taken in f64 from the
/// row's maximum, so large logits do not overflow.
///
/// # Errors
/// [`DrawError::Shape`] if the sizes do not fit (nothing is written), else
/// [`DrawError::NoCategory`] for the first row without a distribution (the rows before
/// it are written).
pub fn categorical_draw(
    logits: &[f32],
    categories: usize,
    uniforms: &[f64],
    actions: &mut [i64],
    logp: &mut [f32],
) -> Result<(), DrawError> {
    let rows = uniforms.len();
    if categories == 0 || logits.len() != rows * categories || actions.len() != rows || logp.len() != rows {
        return Err(DrawError::Shape { values: logits.len(), categories, uniforms: rows });
    }
    // The row's exponentials, computed once and read by the cumulative pass.
    let mut weights = vec![0.0; categories];
    for (r, row) in logits.chunks_exact(categories).enumerate() {
        let (index, log_prob) =
            draw_row(row, uniforms[r], &mut weights).ok_or(DrawError::NoCategory { row: r })?;
        actions[r] = i64::try_from(index).unwrap_or(i64::MAX);
        #[allow(clippy::cast_possible_truncation)]
        {
            logp[r] = log_prob as f32;
        }
    }
    Ok(())
}

/// One row's draw: (category, log-probability), or None when the row has no distribution.
/// `weights` (as long as `row`) is scratch space.
fn draw_row(row: &[f32], uniform: f64, weights: &mut [f64]) -> Option<(usize, f64)> {
    let mut max = f32::NEG_INFINITY;
    for &x in row {
        // NaN fails every comparison: caught here with +inf.
        if x.is_nan() || x == f32::INFINITY {
            return None;
        }
        max = max.max(x);
    }
    if max == f32::NEG_INFINITY {
        return None;
    }
    let max = f64::from(max);
    let mut total = 0.0;
    for (w, &x) in weights.iter_mut().zip(row) {
        *w = (f64::from(x) - max).exp();
        total += *w;
    }
    let target = uniform * total;
    let mut cumulative = 0.0;
    let mut chosen = None;
    for (j, &x) in row.iter().enumerate() {
        if x == f32::NEG_INFINITY {
            continue;
        }
        cumulative += weights[j];
        chosen = Some(j);
        if cumulative > target {
            break;
        }
    }
    // Rounding can leave the sum a hair below `target` for a uniform close to 1: the
    // last category with mass is drawn then (`chosen` is set, as some logit is finite).
    let j = chosen?;
    Some((j, f64::from(row[j]) - max - total.ln()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(logits: &[f32], k: usize, uniforms: &[f64]) -> Result<(Vec<i64>, Vec<f32>), DrawError> {
        let mut a = vec![0; uniforms.len()];
        let mut l = vec![0.0; uniforms.len()];
        categorical_draw(logits, k, uniforms, &mut a, &mut l)?;
        Ok((a, l))
    }

    #[test]
    fn inverse_cdf_picks_the_category_whose_interval_holds_the_uniform() {
        // probabilities 0.2, 0.3, 0.5 -> intervals [0, .2), [.2, .5), [.5, 1)
        let row: Vec<f32> = [0.2f32, 0.3, 0.5].iter().map(|p| p.ln()).collect();
        let logits: Vec<f32> = row.iter().copied().cycle().take(15).collect();
        let (a, l) = draw(&logits, 3, &[0.0, 0.19, 0.21, 0.49, 0.999_999]).unwrap();
        assert_eq!(a, vec![0, 0, 1, 1, 2]);
        for (i, &lp) in l.iter().enumerate() {
            let want = [0.2f32, 0.3, 0.5][usize::try_from(a[i]).unwrap()].ln();
            assert!((lp - want).abs() < 1e-6, "{lp} vs {want}");
        }
    }

    #[test]
    fn minus_infinity_is_never_drawn_and_huge_logits_do_not_overflow() {
        let logits = [f32::NEG_INFINITY, 1e30, f32::NEG_INFINITY, 1e30];
        let (a, l) = draw(&logits, 4, &[0.0]).unwrap();
        assert_eq!(a, vec![1]);
        assert!((l[0] - 0.5f32.ln()).abs() < 1e-6);
        let (a, _) = draw(&logits, 4, &[0.999_999_999]).unwrap();
        assert_eq!(a, vec![3]);
        let (a, l) = draw(&[f32::NEG_INFINITY, 0.0], 2, &[0.0]).unwrap();
        assert_eq!((a, l), (vec![1], vec![0.0]));
    }

    #[test]
    fn rows_without_a_distribution_are_refused_by_row() {
        for bad in [[0.0, f32::NAN], [f32::INFINITY, 0.0], [f32::NEG_INFINITY, f32::NEG_INFINITY]] {
            let logits = [0.0, 0.0, bad[0], bad[1]];
            assert_eq!(draw(&logits, 2, &[0.5, 0.5]), Err(DrawError::NoCategory { row: 1 }));
        }
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused_before_anything_is_written() {
        let mut a = vec![7; 2];
        let mut l = vec![7.0; 2];
        let err = categorical_draw(&[0.0; 5], 2, &[0.5, 0.5], &mut a, &mut l).unwrap_err();
        assert!(matches!(err, DrawError::Shape { values: 5, categories: 2, uniforms: 2 }));
        assert_eq!(a, vec![7, 7]);
        assert!(categorical_draw(&[], 0, &[], &mut [], &mut []).is_err());
    }

    #[test]
    fn frequencies_follow_the_probabilities() {
        // Evenly spaced uniforms: the counts are the probabilities times n, up to one.
        let probs = [0.1f32, 0.6, 0.3];
        let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let n = 10_000;
        let logits: Vec<f32> = row.iter().copied().cycle().take(3 * n).collect();
        #[allow(clippy::cast_precision_loss)]
        let uniforms: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
        let (a, _) = draw(&logits, 3, &uniforms).unwrap();
        for (k, p) in probs.iter().enumerate() {
            let count = a.iter().filter(|&&x| x == i64::try_from(k).unwrap()).count();
            #[allow(clippy::cast_precision_loss)]
            let expected = f64::from(*p) * n as f64;
            #[allow(clippy::cast_precision_loss)]
            let diff = (count as f64 - expected).abs();
            assert!(diff <= 1.5, "category {k}: {count} vs {expected}");
        }
    }
}
