//! The ladder of candidate limits a rule's counts are measured against: ratios of its
//! configured limit, `steps` per doubling from `from` to `to` (by default 2^(k/4) for k from
//! -16 to 16: 1/16 to 16 times the limit, 33 rungs, each 19 % above the one below).

/// Most rungs one ladder may have (each is two metric series per limit of a rule).
pub const MAX_RUNGS: usize = 64;

/// The smallest and largest ratio a ladder may reach.
const RANGE: (f64, f64) = (1.0 / 1024.0, 1024.0);

/// Ratios of a limit, `steps` per doubling, from `from` to `to` (both included when they fall
/// on a step: the steps are the powers 2^(k/steps)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ladder {
    from: f64,
    to: f64,
    steps: u32,
}

/// What a rule's `ladder:` says.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LadderChoice {
    /// Nothing said: the process's ladder (`LIMIT_LADDER*`).
    #[default]
    Default,
    /// `ladder: false`: not measured.
    Off,
    /// A ladder of its own.
    Own(Ladder),
}

impl Default for Ladder {
    fn default() -> Self {
        Self {
            from: 1.0 / 16.0,
            to: 16.0,
            steps: 4,
        }
    }
}

impl Ladder {
    /// A ladder from `from` to `to` times the limit, `steps` rungs per doubling; an error
    /// naming what is out of range.
    pub fn new(from: f64, to: f64, steps: u32) -> Result<Self, String> {
        if !(from.is_finite() && (RANGE.0..=RANGE.1).contains(&from)) {
            return Err(format!("from {from} is not in [{}, {}]", RANGE.0, RANGE.1));
        }
        if !(to.is_finite() && (RANGE.0..=RANGE.1).contains(&to)) {
            return Err(format!("to {to} is not in [{}, {}]", RANGE.0, RANGE.1));
        }
        if to < from {
            return Err(format!("to {to} is below from {from}"));
        }
        if !(1..=16).contains(&steps) {
            return Err(format!("steps_per_doubling {steps} is not in 1..=16"));
        }
        let ladder = Self { from, to, steps };
        let n = ladder.exponents().count();
        if n == 0 {
            return Err(format!(
                "no step of 2^(1/{steps}) lies between {from} and {to}"
            ));
        }
        if n > MAX_RUNGS {
            return Err(format!(
                "{n} rungs from {from} to {to} at {steps} per doubling, more than {MAX_RUNGS}"
            ));
        }
        Ok(ladder)
    }

    /// The lowest ratio asked for.
    pub fn from(&self) -> f64 {
        self.from
    }

    /// The highest ratio asked for.
    pub fn to(&self) -> f64 {
        self.to
    }

    /// Rungs per doubling.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    fn exponents(&self) -> std::ops::RangeInclusive<i32> {
        // A hair of slack so that 1/16 and 16 themselves count as steps despite rounding.
        let steps = f64::from(self.steps);
        let lo = (self.from.log2() * steps - 1e-9).ceil() as i32;
        let hi = (self.to.log2() * steps + 1e-9).floor() as i32;
        lo..=hi
    }

    /// The ratios, ascending.
    pub fn ratios(&self) -> Vec<f64> {
        let steps = f64::from(self.steps);
        self.exponents()
            .map(|k| (f64::from(k) / steps).exp2())
            .collect()
    }
}

/// A ratio as a label carries it: five significant digits, trailing zeros dropped (`0.0625`,
/// `1.1892`, `16`).
pub fn ratio_label(ratio: f64) -> String {
    let decimals = (4 - ratio.log10().floor() as i32).max(0) as usize;
    let text = format!("{ratio:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ladder_is_33_quarter_doublings_from_a_sixteenth_to_sixteen() {
        let r = Ladder::default().ratios();
        assert_eq!(r.len(), 33);
        assert_eq!(r[0], 1.0 / 16.0);
        assert_eq!(r[16], 1.0);
        assert_eq!(r[32], 16.0);
        let labels: Vec<String> = r.iter().map(|&x| ratio_label(x)).collect();
        assert_eq!(labels[0], "0.0625");
        assert_eq!(labels[17], "1.1892");
        assert_eq!(labels[32], "16");
        let mut unique = labels.clone();
        unique.dedup();
        assert_eq!(unique.len(), labels.len());
    }

    #[test]
    fn a_ladder_out_of_range_is_refused_with_the_reason() {
        assert!(Ladder::new(0.0, 2.0, 4).unwrap_err().contains("from 0"));
        assert!(Ladder::new(2.0, 1.0, 4).unwrap_err().contains("below from"));
        assert!(
            Ladder::new(0.5, 2.0, 0)
                .unwrap_err()
                .contains("steps_per_doubling 0")
        );
        assert!(
            Ladder::new(1.0 / 1024.0, 1024.0, 16)
                .unwrap_err()
                .contains("more than 64")
        );
        assert!(Ladder::new(1.1, 1.15, 4).unwrap_err().contains("no step"));
        assert_eq!(Ladder::new(0.5, 2.0, 1).unwrap().ratios(), [0.5, 1.0, 2.0]);
    }
}
