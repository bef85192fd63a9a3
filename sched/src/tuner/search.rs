//! The derivative-free directional search of wagner2021 §4 ("Optimizer"), over any cost
//! function of `(d_start, λ)`; [`super::Tuner`] gives it the simulated mean slowdown.
//!
//! For each d_start candidate, λ is refined from `λ0`: with step width `α` (first 1) and
//! directions `±0.05`, evaluate `λ ± 0.05·α`; if neither is better, keep `λ` and halve
//! `α`, otherwise move to the better one and grow `α` by 1.5. Always [`STEPS`] steps, so
//! the cost of a refresh does not depend on the workload. The best point over all
//! candidates wins.

/// Search steps per starting value (wagner2021 §4: "we always perform a total of 7
/// search steps for each starting value").
pub const STEPS: u32 = 7;
/// Search directions `D = {±0.05}` (§4).
pub const DIRECTION: f64 = 0.05;
/// Step width growth after a move (§4).
pub const GROW: f64 = 1.5;
/// Step width shrink when neither neighbour is better (§4).
pub const SHRINK: f64 = 0.5;

/// A point of the search and its cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Quanta before decay starts.
    pub d_start: u32,
    /// Decay factor per quantum.
    pub lambda: f64,
    /// Cost there (lower is better).
    pub cost: f64,
}

/// Refines λ at a fixed `d_start` from `lambda0` within `[lo, hi]`, with [`STEPS`] steps
/// of the rule above. A neighbour outside the bounds is moved onto the bound (so λ = 1,
/// no decay, stays reachable) and skipped if that is where λ already is.
pub fn refine(
    d_start: u32,
    lambda0: f64,
    (lo, hi): (f64, f64),
    cost: &mut impl FnMut(u32, f64) -> f64,
) -> Point {
    let lambda = lambda0.clamp(lo, hi);
    let mut here = Point {
        d_start,
        lambda,
        cost: cost(d_start, lambda),
    };
    let mut alpha = 1.0;
    for _ in 0..STEPS {
        let mut best: Option<Point> = None;
        for dir in [DIRECTION, -DIRECTION] {
            let lambda = (here.lambda + alpha * dir).clamp(lo, hi);
            if lambda == here.lambda {
                continue;
            }
            let c = cost(d_start, lambda);
            if c < best.map_or(here.cost, |b| b.cost) {
                best = Some(Point {
                    d_start,
                    lambda,
                    cost: c,
                });
            }
        }
        match best {
            Some(p) => {
                here = p;
                alpha *= GROW;
            }
            None => alpha *= SHRINK,
        }
    }
    here
}

/// Refines every d_start candidate from `lambda0` and returns the best point (the first
/// of equals); `None` without candidates.
pub fn search(
    candidates: &[u32],
    lambda0: f64,
    bounds: (f64, f64),
    cost: &mut impl FnMut(u32, f64) -> f64,
) -> Option<Point> {
    candidates
        .iter()
        .map(|&d| refine(d, lambda0, bounds, cost))
        .reduce(|best, p| if p.cost < best.cost { p } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: (f64, f64) = (0.5, 1.0);

    /// Runs `refine` on `f(λ)` and returns the result and the λ values it evaluated.
    fn traced(lambda0: f64, f: impl Fn(f64) -> f64) -> (Point, Vec<f64>) {
        let mut seen = Vec::new();
        let p = refine(3, lambda0, BOUNDS, &mut |d, l| {
            assert_eq!(d, 3);
            seen.push(l);
            f(l)
        });
        (p, seen)
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn neither_better_halves_the_step_seven_times() {
        // A minimum at the start: every step shrinks α (1, 0.5, …, 1/64).
        let (p, seen) = traced(0.8, |l| (l - 0.8).abs());
        assert_eq!((p.lambda, p.cost), (0.8, 0.0));
        let mut want = vec![0.8];
        let mut alpha = 1.0;
        for _ in 0..STEPS {
            want.extend([0.8 + 0.05 * alpha, 0.8 - 0.05 * alpha]);
            alpha *= 0.5;
        }
        assert!(close(&seen, &want), "{seen:?}");
        assert_eq!(seen.len(), 1 + 2 * STEPS as usize);
    }

    #[test]
    fn a_move_grows_the_step_by_half() {
        // Cost falls with λ: moves of 0.05, 0.075, 0.1125, then onto the bound 0.5.
        let (p, seen) = traced(0.9, |l| l);
        let want = [
            0.9, 0.95, 0.85, // α = 1: move to 0.85
            0.925, 0.775, // α = 1.5: move to 0.775
            0.8875, 0.6625, // α = 2.25: move to 0.6625
            0.83125, 0.5, // α = 3.375: 0.49375 lands on the bound 0.5
            // α = 5.0625 at 0.5: +0.253 = 0.753 worse, −0.253 is the bound itself
            0.753125, // neither better: α halves to 2.53, then 1.27
            0.6265625, 0.56328125,
        ];
        assert!(close(&seen, &want), "{seen:?}");
        assert_eq!(p.lambda, 0.5);
    }

    #[test]
    fn lambda_is_clamped_to_the_bounds() {
        // Cost falls towards 1: λ reaches 1 (no decay) and never leaves [0.5, 1].
        let (p, seen) = traced(0.95, |l| -l);
        assert_eq!(p.lambda, 1.0);
        assert!(seen.iter().all(|l| (0.5..=1.0).contains(l)), "{seen:?}");
        // A start outside the bounds is clamped first.
        let (p, seen) = traced(0.2, |l| l);
        assert_eq!((seen[0], p.lambda), (0.5, 0.5));
    }

    #[test]
    fn search_keeps_the_best_over_all_starts() {
        // The cost prefers d_start 8 at λ 0.7.
        let mut evals = 0;
        let best = search(&[2, 8, 32], 0.9, BOUNDS, &mut |d, l| {
            evals += 1;
            (d as f64 - 8.0).abs() + (l - 0.7).abs()
        })
        .unwrap();
        assert_eq!(best.d_start, 8);
        assert!((best.lambda - 0.7).abs() < 0.02, "{best:?}");
        assert!(evals <= 3 * (1 + 2 * STEPS));
        assert_eq!(search(&[], 0.9, BOUNDS, &mut |_, _| 0.0), None);
    }
}
