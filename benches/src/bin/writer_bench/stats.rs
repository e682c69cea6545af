//! Repetitions, percentiles and their text form.

use std::time::Duration;

/// One figure measured once per repetition.
#[derive(Clone, Debug, Default)]
pub struct Reps(pub Vec<f64>);

impl Reps {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    fn finite(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.0.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }

    /// Median of the finite values (NaN when there are none).
    pub fn median(&self) -> f64 {
        let v = self.finite();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.finite().first().copied().unwrap_or(f64::NAN)
    }

    pub fn max(&self) -> f64 {
        self.finite().last().copied().unwrap_or(f64::NAN)
    }

    /// Per-repetition ratio `self[i] / other[i]` (the repetitions alternate,
    /// so each pair ran back to back).
    pub fn ratio_to(&self, other: &Reps) -> Reps {
        Reps(
            self.0
                .iter()
                .zip(&other.0)
                .map(|(a, b)| if *b > 0.0 { a / b } else { f64::NAN })
                .collect(),
        )
    }

    /// `median (min-max)` with `prec` decimals.
    pub fn show(&self, prec: usize) -> String {
        let m = self.median();
        if !m.is_finite() {
            return "-".into();
        }
        if self.finite().len() == 1 {
            return num(m, prec);
        }
        format!(
            "{} ({}-{})",
            num(m, prec),
            num(self.min(), prec),
            num(self.max(), prec)
        )
    }
}

/// `v` with `prec` decimals and thousands separators for large values.
pub fn num(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 10_000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(usize::from(s.starts_with('-')));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{sign}{out}");
    }
    format!("{v:.prec$}")
}

/// Percentile `p` (0..=1) of sorted latencies, in milliseconds.
pub fn pct_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range() {
        let r = Reps(vec![3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!(r.median(), 2.0);
        assert_eq!(r.show(1), "2.0 (1.0-3.0)");
        assert_eq!(Reps(vec![1.0, 4.0]).median(), 2.5);
        assert_eq!(num(1234567.0, 0), "1,234,567");
    }
}
