//! The counter script's answer (its layout is in `lua/batch.lua`), split into one reply per
//! request of the call.

use super::{Part, Reply};
use crate::algorithm::{Decision, Micros};
use crate::store::StoreError;

/// Splits a script call's answer into one reply per part (the layout is in `lua/batch.lua`).
/// Each request's answer is framed by its header, so one that makes no sense fails that
/// request alone; only an answer whose frames do not add up fails them all.
pub(super) fn decode(
    values: &[i64],
    parts: &[&Part],
) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
    let (&now, mut rest) = values
        .split_first()
        .ok_or_else(|| StoreError::Internal("the script returned no values".into()))?;
    let now = now.max(0) as Micros;
    let mut replies = Vec::with_capacity(parts.len());
    for (index, part) in parts.iter().enumerate() {
        let frame = rest
            .split_first()
            .and_then(|(&header, tail)| {
                let len = usize::try_from(header >> 1).ok()?;
                (header >= 0 && len <= tail.len()).then(|| (header & 1 == 1, tail.split_at(len)))
            })
            .ok_or_else(|| {
                StoreError::Internal(format!(
                    "script answer breaks off at request {index} of {}",
                    parts.len()
                ))
            })?;
        let (admitted, (own, tail)) = frame;
        rest = tail;
        replies.push(decode_request(own, part).map(|decisions| Reply {
            admitted,
            now,
            decisions,
            shared: parts.len(),
        }));
    }
    if !rest.is_empty() {
        return Err(StoreError::Internal(format!(
            "script returned {} values more than {} requests need",
            rest.len(),
            parts.len()
        )));
    }
    Ok(replies)
}

/// Whether counter `i` of `part` is a usage budget (its refusals carry its overdraft).
fn is_budget(part: &Part, i: usize) -> bool {
    use super::args::{ALGORITHM, HEADER, OVERDRAFT, PER_COUNTER};
    part.args
        .get(HEADER + i * PER_COUNTER + ALGORITHM)
        .is_some_and(|&code| code >= OVERDRAFT)
}

/// One request's decisions from its `values`: per counter, remaining and reset when allowed,
/// or `-1 - remaining`, reset and retry (-1: none) when not, then a budget's overdraft as
/// `hi * 1e9 + lo` (saturating).
fn decode_request(values: &[i64], part: &Part) -> Result<Vec<Decision>, StoreError> {
    let counters = part.keys.len();
    let bad = || {
        StoreError::Internal(format!(
            "script answered {} values for {counters} counters",
            values.len()
        ))
    };
    let micros = |v: i64| v.max(0) as Micros;
    let mut values = values.iter().copied();
    let mut decisions = Vec::with_capacity(counters);
    for i in 0..counters {
        let (first, reset) = values.next().zip(values.next()).ok_or_else(bad)?;
        decisions.push(if first >= 0 {
            Decision {
                overdraft: 0,
                allowed: true,
                remaining: first as u64,
                reset_after: micros(reset),
                retry_after: None,
            }
        } else {
            let retry = values.next().ok_or_else(bad)?;
            let overdraft = if is_budget(part, i) {
                let (hi, lo) = values.next().zip(values.next()).ok_or_else(bad)?;
                (hi.max(0) as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(lo.max(0) as u64)
            } else {
                0
            };
            Decision {
                overdraft,
                allowed: false,
                // -1 - remaining, written so that no value can overflow.
                remaining: (-(first + 1)) as u64,
                reset_after: micros(reset),
                retry_after: (retry >= 0).then(|| micros(retry)),
            }
        });
    }
    match values.next() {
        None => Ok(decisions),
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(counters: usize) -> Part {
        Part {
            keys: (0..counters).map(|i| format!("k{i}")).collect(),
            args: Vec::new(),
        }
    }

    #[test]
    fn a_request_whose_answer_makes_no_sense_fails_alone() {
        let (one, two, three) = (part(1), part(1), part(2));
        // now; request 1: admitted, 2 values but only 1 counter's worth plus junk (3 values
        // framed); request 2: admitted, remaining 4, reset 10; request 3: refused, one counter
        // allowed (2 values) and one over (-1 - 0, reset 5, retry 5).
        let values = [
            1_000,
            1 + 2 * 3,
            7,
            8,
            9,
            1 + 2 * 2,
            4,
            10,
            2 * 5,
            3,
            20,
            -1,
            5,
            5,
        ];
        let replies = decode(&values, &[&one, &two, &three]).unwrap();
        assert!(replies[0].is_err(), "three values for one counter");
        let two = replies[1].as_ref().unwrap();
        assert!(two.admitted);
        assert_eq!(two.decisions[0].remaining, 4);
        let three = replies[2].as_ref().unwrap();
        assert!(!three.admitted);
        assert_eq!(three.decisions[1].remaining, 0);
        assert_eq!(three.decisions[1].retry_after, Some(5));
    }

    #[test]
    fn frames_that_do_not_add_up_fail_the_whole_call_and_extreme_values_do_not_overflow() {
        let one = part(1);
        assert!(
            decode(&[1_000, 1 + 2 * 5, 1], &[&one]).is_err(),
            "frame past the end"
        );
        assert!(
            decode(&[1_000, 1 + 2 * 2, 1, 1, 99], &[&one]).is_err(),
            "values left over"
        );
        assert!(decode(&[], &[&one]).is_err());
        // i64::MIN as "-1 - remaining" must not overflow.
        let replies = decode(&[0, 2 * 3, i64::MIN, i64::MIN, i64::MIN], &[&one]).unwrap();
        let decision = replies[0].as_ref().unwrap().decisions[0];
        assert_eq!(decision.remaining, i64::MAX as u64);
        assert_eq!(decision.reset_after, 0);
        assert_eq!(decision.retry_after, None);
    }
}
