//! Each rule's top refused keys (for a shadow rule, the keys it would refuse), over the
//! current window and the last completed one, in bounded memory: a [`TopKeys`] summary per
//! rule and window, fed with the hits of every refused decision. Windows are the rule's own,
//! aligned to the Unix epoch like fixed windows.
//!
//! Bounds: at most [`CAPACITY`] keys per rule and window, each key at most [`MAX_KEY_BYTES`];
//! so about `rules × 2 × CAPACITY × (MAX_KEY_BYTES + 64)` bytes at the worst. Cost: nothing on
//! an allowed decision; on a refused one a lock and one summary update.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Descriptor;
use super::fnv::FnvMap;
use super::top::{Counted, TopKeys};
use crate::algorithm::{Decision, Micros};
use crate::clock::{Clock, SystemClock};
use crate::policy::{Policy, RateLimit, Rule};

/// Keys kept per rule and window.
pub const CAPACITY: usize = 100;

/// A key longer than this is kept shortened (on a character boundary), marked with `…`.
pub const MAX_KEY_BYTES: usize = 256;

/// The refused keys of every rule of this instance.
pub struct RefusedKeys {
    clock: Arc<dyn Clock>,
    /// Whether values are kept as `#` and 12 hex digits of their SHA-256.
    hashed: bool,
    rules: Mutex<FnvMap<String, RuleWindows>>,
}

/// One rule's summaries.
struct RuleWindows {
    domain: String,
    shadow: bool,
    window: Micros,
    current: (Micros, TopKeys<String>),
    last: Option<(Micros, TopKeys<String>)>,
}

/// One rule's top refused keys, as `/top` shows them.
#[derive(Debug, Clone)]
pub struct RuleTop {
    /// The rule's domain.
    pub domain: String,
    /// The rule's stats key.
    pub rule: String,
    /// Whether the rule is in shadow mode (its keys are those it would refuse).
    pub shadow: bool,
    /// The rule's window, in microseconds.
    pub window: Micros,
    /// The current window and the last completed one (if it had refusals), each with its
    /// start (µs since the epoch).
    pub windows: Vec<WindowTop>,
}

/// The refused keys of one window.
#[derive(Debug, Clone)]
pub struct WindowTop {
    /// When the window started, µs since the epoch.
    pub start: Micros,
    /// Refused hits in all, of every key.
    pub total: u64,
    /// The most a key not listed can have had refused.
    pub floor: u64,
    /// The heaviest keys, heaviest first.
    pub keys: Vec<Counted<String>>,
}

impl Default for RefusedKeys {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl RefusedKeys {
    /// Tracking on `clock`'s windows.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            hashed: false,
            rules: Mutex::default(),
        }
    }

    /// Keeping each value as `#` and 12 hex digits of its SHA-256, never the value.
    pub fn hashing_values(mut self, hashed: bool) -> Self {
        self.hashed = hashed;
        self
    }

    /// `hits` of `key` were refused by `rule` (of `domain`, in shadow mode or not), whose
    /// window is `window` µs.
    pub fn refused(
        &self,
        (domain, rule, shadow): (&str, &str, bool),
        window: Micros,
        key: &str,
        hits: u64,
    ) {
        let window = window.max(1);
        let now = self.clock.now();
        let start = now - now % window;
        let mut rules = self.rules.lock();
        if !rules.contains_key(rule) {
            rules.insert(
                rule.to_owned(),
                RuleWindows {
                    domain: domain.to_owned(),
                    shadow,
                    window,
                    current: (start, TopKeys::new(CAPACITY)),
                    last: None,
                },
            );
        }
        let windows = rules.get_mut(rule).expect("inserted above");
        windows.shadow = shadow;
        if windows.window != window {
            // The rule's window changed (a reload): start again.
            windows.window = window;
            windows.current = (start, TopKeys::new(CAPACITY));
            windows.last = None;
        }
        if windows.current.0 != start {
            let ended = std::mem::replace(&mut windows.current, (start, TopKeys::new(CAPACITY)));
            // The last completed window is the one just before this one, if it had refusals.
            windows.last = (ended.0 + window == start).then_some(ended);
        }
        windows.current.1.offer(shortened(key).as_ref(), hits);
    }

    /// `rule` of `domain` decided `descriptor` under `limit`: a refusal (its hits) is kept.
    pub fn decided(
        &self,
        domain: &str,
        rule: &Rule,
        limit: &RateLimit,
        decision: &Decision,
        descriptor: &Descriptor,
    ) {
        if decision.allowed || descriptor.hits <= 0 {
            return;
        }
        let mut key = String::new();
        for (i, e) in descriptor.entries.iter().enumerate() {
            if i > 0 {
                key.push_str(", ");
            }
            key.push_str(&e.key);
            key.push('=');
            if self.hashed {
                key.push('#');
                crate::store::push_sha256_hex(&mut key, &e.value, 6);
            } else {
                key.push_str(&e.value);
            }
        }
        let rule_of = (domain, rule.stats_key.as_str(), rule.shadow_mode);
        self.refused(rule_of, limit.window(), &key, descriptor.hits as u64);
    }

    /// Forgets the rules `policy` no longer has (a reload removed them).
    pub fn follow(&self, policy: &Policy) {
        let kept: HashSet<&str> = policy
            .rules()
            .iter()
            .map(|r| r.stats_key.as_str())
            .collect();
        self.rules
            .lock()
            .retain(|rule, _| kept.contains(rule.as_str()));
    }

    /// The top `n` refused keys of each rule (of `domain` and named `rule`, when given), by
    /// rule.
    pub fn view(&self, domain: Option<&str>, rule: Option<&str>, n: usize) -> Vec<RuleTop> {
        let now = self.clock.now();
        let rules = self.rules.lock();
        let mut out: Vec<RuleTop> = rules
            .iter()
            .filter(|(name, w)| {
                domain.is_none_or(|d| d == w.domain) && rule.is_none_or(|r| r == name.as_str())
            })
            .map(|(name, w)| {
                let start = now - now % w.window;
                // What is current and last at `now`, whatever the last refusal found.
                let (current, last) = if w.current.0 == start {
                    (Some(&w.current), w.last.as_ref())
                } else if w.current.0 + w.window == start {
                    (None, Some(&w.current))
                } else {
                    (None, None)
                };
                let view = |(start, top): &(Micros, TopKeys<String>)| WindowTop {
                    start: *start,
                    total: top.total(),
                    floor: top.floor(),
                    keys: top.top(n),
                };
                RuleTop {
                    domain: w.domain.clone(),
                    rule: name.clone(),
                    shadow: w.shadow,
                    window: w.window,
                    windows: current.into_iter().chain(last).map(view).collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.rule.cmp(&b.rule));
        out
    }
}

/// `key`, at most [`MAX_KEY_BYTES`].
fn shortened(key: &str) -> std::borrow::Cow<'_, str> {
    if key.len() <= MAX_KEY_BYTES {
        return key.into();
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &key[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;

    #[test]
    fn refusals_are_kept_for_the_current_and_the_last_completed_window() {
        let clock = Arc::new(ManualClock::new(1_700_000_000 * SECOND));
        let refused = RefusedKeys::new(clock.clone());
        let rule = ("api", "api.key", false);
        let minute = 60 * SECOND;
        refused.refused(rule, minute, "key=a", 3);
        refused.refused(rule, minute, "key=b", 1);
        refused.refused(rule, minute, "key=a", 2);
        let view = refused.view(Some("api"), None, 10);
        assert_eq!(view.len(), 1);
        let keys: Vec<(String, u64)> = view[0].windows[0]
            .keys
            .iter()
            .map(|k| (k.key.clone(), k.count))
            .collect();
        assert_eq!(keys, [("key=a".to_owned(), 5), ("key=b".to_owned(), 1)]);
        // The next window: the first is the last completed one.
        clock.advance(minute);
        refused.refused(rule, minute, "key=c", 1);
        let view = refused.view(None, Some("api.key"), 10);
        let totals: Vec<u64> = view[0].windows.iter().map(|w| w.total).collect();
        assert_eq!(totals, [1, 6]);
        // Two windows on, nothing refused since: the window with key=c is the last.
        clock.advance(minute);
        let view = refused.view(None, None, 10);
        let totals: Vec<u64> = view[0].windows.iter().map(|w| w.total).collect();
        assert_eq!(totals, [1]);
        assert!(refused.view(Some("other"), None, 10).is_empty());
    }

    #[test]
    fn a_long_key_is_shortened_on_a_character_boundary() {
        let key = "é".repeat(200);
        let short = shortened(&key);
        assert!(short.len() <= MAX_KEY_BYTES + '…'.len_utf8());
        assert!(short.ends_with('…'));
    }
}
