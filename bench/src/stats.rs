//! The summary of a figure measured over several alternated rounds: its median and its
//! range, never one lucky round.

use serde::Serialize;

/// The median of `v` (the mean of the middle two for an even count); NaN when empty.
/// NaNs in `v` sort last, as `f64::total_cmp` orders them.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A figure where more is better (a throughput ratio) over the rounds: median, the worst
/// (lowest) and the best (highest) round, and every round's value in run order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub worst: f64,
    pub best: f64,
    pub rounds: Vec<f64>,
}

impl Spread {
    /// `None` when there is no finite value.
    pub fn of(rounds: &[f64]) -> Option<Spread> {
        let finite: Vec<f64> = rounds.iter().copied().filter(|x| x.is_finite()).collect();
        if finite.is_empty() {
            return None;
        }
        Some(Spread {
            median: median(&finite),
            worst: finite.iter().copied().fold(f64::INFINITY, f64::min),
            best: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            rounds: rounds.to_vec(),
        })
    }

    /// `0.93 (0.78..0.94)`; one round: just the value.
    pub fn text(&self) -> String {
        if self.rounds.len() == 1 {
            format!("{:.2}", self.median)
        } else {
            format!("{:.2} ({:.2}..{:.2})", self.median, self.worst, self.best)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn spread_is_median_worst_best_in_run_order() {
        let s = Spread::of(&[0.93, 0.78, 0.78, 0.94, 0.80]).expect("values");
        assert_eq!(s.median, 0.80);
        assert_eq!(s.worst, 0.78);
        assert_eq!(s.best, 0.94);
        assert_eq!(s.rounds, vec![0.93, 0.78, 0.78, 0.94, 0.80]);
        assert_eq!(s.text(), "0.80 (0.78..0.94)");
    }

    #[test]
    fn spread_skips_rounds_without_a_ratio() {
        // A round whose base ran no query gives an infinite or NaN ratio: left out of the
        // summary, kept in the list.
        let s = Spread::of(&[1.0, f64::INFINITY, f64::NAN, 2.0]).expect("values");
        assert_eq!((s.median, s.worst, s.best), (1.5, 1.0, 2.0));
        assert_eq!(s.rounds.len(), 4);
        assert!(Spread::of(&[f64::NAN]).is_none());
        assert!(Spread::of(&[]).is_none());
        assert_eq!(Spread::of(&[1.234]).expect("one").text(), "1.23");
    }
}
