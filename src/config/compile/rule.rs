//! One descriptor's rule: its `rate_limit:` or `rate_limits:`, `unlimited`, `replaces`,
//! `priorities` and each limit's unit, algorithm and burst.

use super::Cx;
use crate::algorithm::Algorithm;
use crate::config::raw::{MAX_WINDOW_SECONDS, RawDescriptor, RawRateLimit};
use crate::policy::{
    Ladder, LadderChoice, MAX_LIMIT, MetaValue, Priorities, RateLimit, Rule, RuleLimit, Unit,
};

impl Cx<'_> {
    /// Compiles a descriptor's `rate_limit:` or `rate_limits:`; `None` when it has neither or
    /// they are invalid (with every error recorded).
    pub(super) fn rule(
        &mut self,
        descriptor: &RawDescriptor,
        path: &str,
        stats_key: &str,
    ) -> Option<Rule> {
        let errors_before = self.errors.len();
        let entries = self.rate_limit_entries(descriptor, path)?;
        let several = descriptor.rate_limits.is_some();
        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut replaces = Vec::new();
        for (path, raw) in &entries {
            let name = raw.name.as_deref().filter(|n| !n.is_empty());
            if raw.unlimited {
                self.check_unlimited(raw, path, several);
                unlimited = true;
            } else if let Some(limit) = self.limit(raw, path, name) {
                if limits.iter().any(|l: &RateLimit| {
                    l.window() == limit.window() && l.algorithm == limit.algorithm
                }) {
                    self.error(
                        path,
                        format!(
                            "two rate_limits with unit {} and algorithm {}: the stricter one always decides; keep one",
                            limit.window_name(),
                            limit.algorithm.as_str()
                        ),
                    );
                }
                limits.push(limit);
            }
            self.replaces(raw, path, name, &mut replaces);
        }
        let name = entries
            .iter()
            .find_map(|(_, raw)| raw.name.clone().filter(|n| !n.is_empty()));
        let priorities = self.priorities(descriptor, path, unlimited);
        let ladder = self.ladder(descriptor, path);
        self.check_leased(descriptor, path, &limits);
        let global = self.scope(descriptor, path, &limits);
        (self.errors.len() == errors_before).then(|| Rule {
            stats_key: stats_key.to_owned(),
            limit: if unlimited {
                RuleLimit::Unlimited
            } else {
                RuleLimit::Limited(limits)
            },
            name,
            replaces,
            shadow_mode: descriptor.shadow_mode,
            quota_mode: descriptor.quota_mode,
            detailed_metric: descriptor.detailed_metric,
            response_headers: descriptor.response_headers.unwrap_or(true),
            value_to_metric: self.levels.iter().any(|l| l.value_to_metric),
            shared: self.shared.clone(),
            failure_mode: self.failure_mode,
            consistency: if global {
                Some(crate::store::Consistency::Leased)
            } else {
                self.consistency
            },
            global,
            priorities,
            metadata: match descriptor.metadata.as_ref().map(MetaValue::from_yaml) {
                Some(MetaValue::Map(map)) if !map.is_empty() => Some(map),
                _ => None,
            },
            levels: self.levels.clone(),
            ladder,
        })
    }

    /// Compiles `ladder:`: `false`, `true`, or a mapping of `from`, `to` and
    /// `steps_per_doubling` (each defaulting to the default ladder's).
    fn ladder(&mut self, descriptor: &RawDescriptor, path: &str) -> LadderChoice {
        use serde_yaml::Value;
        let Some(raw) = &descriptor.ladder else {
            return LadderChoice::Default;
        };
        let path = format!("{path}.ladder");
        let map = match raw {
            Value::Bool(false) => return LadderChoice::Off,
            Value::Bool(true) => return LadderChoice::Default,
            Value::Mapping(map) => map,
            _ => {
                self.error(
                    &path,
                    "ladder must be false, true, or a mapping of from, to and steps_per_doubling",
                );
                return LadderChoice::Default;
            }
        };
        let default = Ladder::default();
        let mut number = |key: &str, fallback: f64| match map.get(key) {
            None => Some(fallback),
            Some(v) => match v.as_f64() {
                Some(n) => Some(n),
                None => {
                    self.error(&format!("{path}.{key}"), format!("{key} must be a number"));
                    None
                }
            },
        };
        let (from, to) = (number("from", default.from()), number("to", default.to()));
        let steps = number("steps_per_doubling", f64::from(default.steps()));
        let (Some(from), Some(to), Some(steps)) = (from, to, steps) else {
            return LadderChoice::Default;
        };
        if steps.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&steps) {
            self.error(
                &format!("{path}.steps_per_doubling"),
                format!("steps_per_doubling {steps} is not a whole number"),
            );
            return LadderChoice::Default;
        }
        match Ladder::new(from, to, steps as u32) {
            Ok(ladder) => LadderChoice::Own(ladder),
            Err(message) => {
                self.error(&path, message);
                LadderChoice::Default
            }
        }
    }

    /// A descriptor's limits with their paths: its `rate_limit:`, or each of its
    /// `rate_limits:`; `None` when it has neither, or both.
    fn rate_limit_entries<'r>(
        &mut self,
        descriptor: &'r RawDescriptor,
        path: &str,
    ) -> Option<Vec<(String, &'r RawRateLimit)>> {
        match (&descriptor.rate_limit, &descriptor.rate_limits) {
            (None, None) => {
                if descriptor.priorities.is_some() {
                    self.error(
                        &format!("{path}.priorities"),
                        "priorities without rate_limit or rate_limits",
                    );
                }
                None
            }
            (Some(_), Some(_)) => {
                self.error(
                    &format!("{path}.rate_limits"),
                    "rate_limit and rate_limits are mutually exclusive: use one",
                );
                None
            }
            (Some(one), None) => Some(vec![(format!("{path}.rate_limit"), one)]),
            (None, Some(many)) => {
                if many.is_empty() {
                    self.error(
                        &format!("{path}.rate_limits"),
                        "rate_limits must not be empty",
                    );
                }
                Some(
                    many.iter()
                        .enumerate()
                        .map(|(i, rl)| (format!("{path}.rate_limits[{i}]"), rl))
                        .collect(),
                )
            }
        }
    }

    /// A descriptor's own `consistency: leased` with a concurrency limit or a usage budget is
    /// an error: their releases and reports must reach the shared count. (Inherited from
    /// above, it leaves such a rule exact.)
    fn check_leased(&mut self, descriptor: &RawDescriptor, path: &str, limits: &[RateLimit]) {
        let own_leased = descriptor
            .consistency
            .as_deref()
            .is_some_and(|c| c.eq_ignore_ascii_case("leased"));
        if own_leased && limits.iter().any(|l| !l.algorithm.leasable()) {
            self.error(
                &format!("{path}.consistency"),
                "consistency: leased is not available with algorithm concurrency (its releases must reach the shared count); use exact",
            );
        }
        if own_leased && limits.iter().any(|l| l.overdraft) {
            self.error(
                &format!("{path}.consistency"),
                "consistency: leased is not available with overdraft (every usage report must reach the shared count); use exact",
            );
        }
    }

    /// A descriptor's `scope`: whether its rule is global. A global rule is leased (an
    /// explicit `consistency: exact` is an error: across regions that would be a round trip
    /// per request), on fixed and sliding windows and token buckets (refilling a token every
    /// 11 days at least, a burst within 30 days: what a region's pool counts with), and never
    /// a concurrency limit or a usage budget.
    fn scope(&mut self, descriptor: &RawDescriptor, path: &str, limits: &[RateLimit]) -> bool {
        let Some(value) = descriptor.scope.as_deref() else {
            return false;
        };
        let path = format!("{path}.scope");
        if value.eq_ignore_ascii_case("region") {
            return false;
        }
        if !value.eq_ignore_ascii_case("global") {
            self.error(
                &path,
                format!("invalid scope '{value}' (expected region or global)"),
            );
            return false;
        }
        if self.consistency == Some(crate::store::Consistency::Exact) {
            self.error(
                &path,
                "scope: global needs consistency: leased (one budget across regions without a round trip to the root per request); this rule is exact",
            );
        }
        for limit in limits {
            let problem = if !limit.algorithm.leasable() {
                "algorithm concurrency (its releases must reach one count)"
            } else if limit.overdraft {
                "overdraft (every usage report must reach one count)"
            } else if limit.algorithm == Algorithm::TokenBucket && !bucket_in_reach(limit) {
                "a token bucket refilling slower than a token every 11 days, or with a burst that takes more than 30 days to refill (a region's pool counts its tokens over 30 days at most)"
            } else {
                continue;
            };
            self.error(
                &path,
                format!("scope: global is not available with {problem}"),
            );
        }
        true
    }

    /// An `unlimited: true` limit takes nothing else, and only as the one `rate_limit:`.
    fn check_unlimited(&mut self, raw: &RawRateLimit, path: &str, several: bool) {
        if several {
            self.error(
                &format!("{path}.unlimited"),
                "unlimited is not allowed in rate_limits; use rate_limit",
            );
        }
        if raw.unit.as_deref().is_some_and(|u| !u.is_empty()) {
            self.error(
                &format!("{path}.unit"),
                "should not specify rate limit unit when unlimited",
            );
        }
        if raw.algorithm.is_some() {
            self.error(
                &format!("{path}.algorithm"),
                "should not specify an algorithm when unlimited",
            );
        }
        if raw.burst.is_some() {
            self.error(
                &format!("{path}.burst"),
                "should not specify burst when unlimited",
            );
        }
        if raw.overdraft {
            self.error(
                &format!("{path}.overdraft"),
                "should not specify overdraft when unlimited",
            );
        }
        if raw.unit_multiplier.is_some() {
            self.error(
                &format!("{path}.unit_multiplier"),
                "should not specify unit_multiplier when unlimited",
            );
        }
    }

    /// Adds the names in a limit's `replaces:` (named `name`) to `into`.
    fn replaces(
        &mut self,
        raw: &RawRateLimit,
        path: &str,
        name: Option<&str>,
        into: &mut Vec<String>,
    ) {
        for (i, entry) in raw.replaces.iter().flatten().enumerate() {
            let entry_path = format!("{path}.replaces[{i}]");
            match entry.name.as_deref().filter(|n| !n.is_empty()) {
                None => self.error(&entry_path, "should not have an empty replaces entry"),
                Some(n) if Some(n) == name => self.error(
                    &entry_path,
                    "replaces should not contain name of same descriptor",
                ),
                Some(n) => into.push(n.to_owned()),
            }
        }
    }

    /// Checks and compiles `priorities:`.
    fn priorities(
        &mut self,
        descriptor: &RawDescriptor,
        path: &str,
        unlimited: bool,
    ) -> Option<Priorities> {
        let raw = descriptor.priorities.as_ref()?;
        let path = format!("{path}.priorities");
        if descriptor.value.as_deref().is_some_and(|v| !v.is_empty()) {
            self.error(
                &path,
                "priorities need a key-only descriptor (no value): the request's value names the priority class",
            );
        }
        if unlimited {
            self.error(&path, "priorities need a counted limit, not unlimited");
        }
        if raw.is_empty() {
            self.error(&path, "priorities must name at least one class");
        }
        for (class, share) in raw {
            if !(*share > 0.0 && *share <= 1.0) {
                self.error(
                    &format!("{path}.{class}"),
                    format!("priority share {share} is not in (0, 1]"),
                );
            }
        }
        Priorities::new(raw.iter().map(|(c, s)| (c.clone(), *s)).collect())
    }

    /// Compiles one counted limit; `None` (with errors recorded) when it is invalid.
    fn limit(&mut self, raw: &RawRateLimit, path: &str, name: Option<&str>) -> Option<RateLimit> {
        let unit_text = raw.unit.as_deref().unwrap_or_default();
        let unit = unit_text.parse().ok();
        if unit.is_none() {
            self.error(
                &format!("{path}.unit"),
                format!("invalid rate limit unit '{unit_text}'"),
            );
        }
        if raw.requests_per_unit.is_none() {
            self.error(
                path,
                "rate limit has no requests_per_unit (use 0 to reject everything, or unlimited: true)",
            );
        }
        let algorithm = match raw.algorithm.as_deref() {
            None => Some(Algorithm::FixedWindow),
            Some(text) => {
                let found = Algorithm::ALL
                    .into_iter()
                    .find(|a| a.as_str().eq_ignore_ascii_case(text));
                if found.is_none() {
                    self.error(
                        &format!("{path}.algorithm"),
                        format!(
                            "invalid algorithm '{text}' (expected fixed_window, sliding_window, token_bucket or concurrency)"
                        ),
                    );
                }
                found
            }
        };
        if let Some(requests) = raw.requests_per_unit.filter(|&n| n > MAX_LIMIT) {
            self.error(
                &format!("{path}.requests_per_unit"),
                format!(
                    "requests_per_unit {requests} is over the largest limit, {MAX_LIMIT} (2^53 - 1)"
                ),
            );
        }
        if let Some(burst) = raw.burst.filter(|&n| n > MAX_LIMIT) {
            self.error(
                &format!("{path}.burst"),
                format!("burst {burst} is over the largest limit, {MAX_LIMIT} (2^53 - 1)"),
            );
        }
        if let Some(burst) = raw.burst {
            if !algorithm.is_some_and(Algorithm::refills) {
                self.error(
                    &format!("{path}.burst"),
                    "burst is only valid with algorithm: token_bucket",
                );
            } else if burst == 0 {
                self.error(&format!("{path}.burst"), "burst must be at least 1");
            }
        }
        let unit_multiplier = self.unit_multiplier(raw, unit, path);
        if raw.overdraft && algorithm.is_some_and(|a| !a.takes_overdraft()) {
            self.error(
                &format!("{path}.overdraft"),
                "overdraft is not valid with algorithm: concurrency (requests in flight are not a usage budget)",
            );
        }
        Some(RateLimit {
            requests_per_unit: raw.requests_per_unit?,
            unit: unit?,
            algorithm: algorithm?,
            burst: raw.burst,
            overdraft: raw.overdraft,
            unit_multiplier: unit_multiplier?,
            name: name.map(str::to_owned),
        })
    }

    /// A limit's `unit_multiplier` (1 when absent): at least 1, and a window of at most
    /// [`MAX_WINDOW_SECONDS`] so that every store's arithmetic on window starts and ends stays
    /// exact; `None` (with the error recorded) otherwise.
    fn unit_multiplier(
        &mut self,
        raw: &RawRateLimit,
        unit: Option<Unit>,
        path: &str,
    ) -> Option<u32> {
        let Some(n) = raw.unit_multiplier else {
            return Some(1);
        };
        let path = format!("{path}.unit_multiplier");
        if n == 0 {
            self.error(&path, "unit_multiplier must be at least 1");
            return None;
        }
        match unit {
            Some(unit) if unit.seconds().saturating_mul(u64::from(n)) > MAX_WINDOW_SECONDS => {
                self.error(
                    &path,
                    format!(
                        "a window of {n} x {} is longer than 100 years",
                        unit.proto_name()
                    ),
                );
                None
            }
            _ => Some(n),
        }
    }
}

/// Whether a global token bucket's pools can count its tokens exactly: an emission interval
/// of at most [`MAX_INTERVAL`](crate::store::pool::MAX_INTERVAL) and a burst refilled within
/// [`MAX_SPAN`](crate::store::pool::MAX_SPAN).
fn bucket_in_reach(limit: &RateLimit) -> bool {
    use crate::store::pool::{MAX_INTERVAL, MAX_SPAN};
    let limit = limit.algorithm_limit();
    let requests = limit.requests.max(1) as u128;
    let interval_ns = (limit.window as u128 * 1_000).div_ceil(requests);
    let refill = limit.capacity() as u128 * limit.window as u128 / requests;
    interval_ns <= MAX_INTERVAL as u128 && refill <= MAX_SPAN as u128
}
