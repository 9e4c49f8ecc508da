//! The store's own vocabulary, for the tests that drive a `Store` or an algorithm directly
//! rather than through a server: a limit, one counter's operation, a batch of them.

use sluice::algorithm::{Algorithm, Limit, Micros};
use sluice::store::{Admission, Batch, CounterKey, CounterOp, FailureMode, Role};

/// `requests` per `window` by `algorithm`; `burst` is a token bucket's capacity (the other
/// algorithms hold their limit).
pub fn limit(requests: u64, window: Micros, algorithm: Algorithm, burst: u64) -> Limit {
    Limit {
        overdraft: false,
        requests,
        window,
        algorithm,
        burst: if algorithm == Algorithm::TokenBucket {
            burst
        } else {
            requests
        },
    }
}

/// `hits` in `role` on the counter of `limit` keyed `namespace` and `entries`, allowed when
/// its store fails, with the default consistency.
pub fn op<'a>(
    namespace: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    limit: Limit,
    hits: i64,
    role: Role,
) -> CounterOp {
    CounterOp {
        key: CounterKey::new(namespace, entries, &limit),
        limit,
        hits,
        role,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    }
}

/// `ops` as one batch: each rule admitted on its own, without a deadline.
pub fn batch(ops: Vec<CounterOp>) -> Batch {
    Batch {
        ops,
        admission: Admission::ByRule,
        deadline: None,
        charged_at: None,
    }
}
