//! The division of one budget among the Envoys that report demand for it: pure arithmetic,
//! no clock, no I/O (the holdings and their timing are in [`super::budget`]).
//!
//! A budget is `rate` tokens per `window` seconds, at most `burst` at once. An Envoy's share
//! is a token bucket of its own (Envoy 1.40 enforces nothing else): `rate` tokens per the
//! same window and `burst` tokens of capacity. [`divide`] hands every Envoy a floor and the
//! rest by demand, max-min fair: an Envoy that asks for less than an even split gets what it
//! asks for, the others share what is left; what nobody asks for is spread by demand too, so
//! a rise in demand finds its tokens already there.

/// A rule's budget, or a part of it: `rate` tokens per `window` seconds, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Tokens per window.
    pub rate: u64,
    /// At most this many tokens at once.
    pub burst: u64,
    /// The window, in whole seconds (at least 1: Envoy 1.40 drops fractions).
    pub window: u64,
}

/// What one Envoy may hold of a budget: its token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Share {
    /// Tokens per window (`tokens_per_fill`, with the budget's window as `fill_interval`).
    pub rate: u64,
    /// Capacity (`max_tokens`).
    pub burst: u64,
}

impl Budget {
    /// Refill per second.
    pub fn per_second(&self, rate: u64) -> f64 {
        rate as f64 / self.window as f64
    }

    /// `part` of this budget's rate, with the burst in proportion (rounded down, and at least
    /// one token when there is any rate: a bucket of capacity 0 refuses everything).
    pub fn share_of(&self, rate: u64) -> Share {
        if rate == 0 || self.rate == 0 {
            return Share::default();
        }
        let burst = (u128::from(self.burst) * u128::from(rate) / u128::from(self.rate)) as u64;
        Share {
            rate,
            burst: burst.max(1),
        }
    }
}

impl Share {
    /// The larger of each part.
    pub fn max(self, other: Share) -> Share {
        Share {
            rate: self.rate.max(other.rate),
            burst: self.burst.max(other.burst),
        }
    }

    /// The smaller of each part.
    pub fn min(self, other: Share) -> Share {
        Share {
            rate: self.rate.min(other.rate),
            burst: self.burst.min(other.burst),
        }
    }

    /// Whether this share holds nothing (DENY_ALL).
    pub fn is_empty(&self) -> bool {
        self.rate == 0 || self.burst == 0
    }
}

/// The floor of each of `k` Envoys in `total` tokens per window: a quarter of an even split,
/// at least one token while there are as many tokens as Envoys.
pub fn floor(total: u64, k: u64) -> u64 {
    if k == 0 || total < k {
        return 0;
    }
    (total / (4 * k)).max(1)
}

/// The rate each of `demands.len()` Envoys should get of `total` tokens per window, given
/// their demands (tokens per window): a floor of a quarter of an even split (at least one
/// token while there are as many tokens as Envoys), then max-min fair by demand, then what
/// is left in proportion to demand. The parts add up to `total` exactly.
pub fn divide(total: u64, demands: &[f64]) -> Vec<u64> {
    let k = demands.len() as u64;
    if k == 0 {
        return Vec::new();
    }
    let floor = floor(total, k);
    let mut shares = vec![floor; demands.len()];
    let mut left = total - floor * k;
    // Max-min fair: the smallest unmet demands first, each at most an even split of what is
    // left among those still waiting.
    let unmet = |i: usize| (demands[i].max(0.0).ceil() as u64).saturating_sub(floor);
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| unmet(i));
    for (n, &i) in order.iter().enumerate() {
        let waiting = (demands.len() - n) as u64;
        let give = unmet(i).min(left / waiting);
        shares[i] += give;
        left -= give;
    }
    if left == 0 {
        return shares;
    }
    // What nobody asked for: in proportion to demand (plus one, so idle Envoys get some).
    let weights: Vec<f64> = demands.iter().map(|d| d.max(0.0) + 1.0).collect();
    let sum: f64 = weights.iter().sum();
    let mut given = 0;
    for (i, w) in weights.iter().enumerate() {
        let part = ((left as f64) * w / sum).floor() as u64;
        shares[i] += part;
        given += part;
    }
    // The rounding's remainder, one token each, to the largest demands first.
    let mut rest = left - given.min(left);
    order.reverse();
    for &i in order.iter().cycle() {
        if rest == 0 {
            break;
        }
        shares[i] += 1;
        rest -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_add_up_to_the_budget() {
        for total in [0, 1, 2, 3, 7, 10, 100, 12_345] {
            for demands in [
                vec![0.0],
                vec![0.0, 0.0],
                vec![5.0, 500.0, 0.0],
                vec![1e9, 1e9, 1e9, 1e9],
                vec![3.0, 1.0, 2.0, 0.5, 9.0],
            ] {
                let shares = divide(total, &demands);
                assert_eq!(shares.iter().sum::<u64>(), total, "{total} {demands:?}");
            }
        }
    }

    #[test]
    fn a_busy_envoy_gets_most_and_an_idle_one_keeps_its_floor() {
        let shares = divide(100, &[0.0, 1000.0]);
        assert!(shares[0] >= 12, "{shares:?}");
        assert!(shares[1] >= 85, "{shares:?}");
    }

    #[test]
    fn an_envoy_that_asks_for_little_gets_what_it_asks_and_the_rest_is_shared() {
        let shares = divide(100, &[10.0, 1000.0, 1000.0]);
        assert!((10..=14).contains(&shares[0]), "{shares:?}");
        assert!(shares[1].abs_diff(shares[2]) <= 1, "{shares:?}");
    }

    #[test]
    fn fewer_tokens_than_envoys_go_to_the_largest_demands() {
        let shares = divide(2, &[1.0, 50.0, 20.0]);
        assert_eq!(shares.iter().sum::<u64>(), 2);
        assert_eq!(shares[0], 0, "{shares:?}");
    }

    #[test]
    fn a_share_has_a_burst_in_proportion_and_never_an_empty_bucket() {
        let budget = Budget {
            rate: 100,
            burst: 10,
            window: 1,
        };
        assert_eq!(budget.share_of(50), Share { rate: 50, burst: 5 });
        assert_eq!(budget.share_of(1), Share { rate: 1, burst: 1 });
        assert!(budget.share_of(0).is_empty());
    }
}
