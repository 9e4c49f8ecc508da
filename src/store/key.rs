//! Counter identity, encoded unambiguously.
//!
//! A counter is identified by its domain, every descriptor entry's key and value, and the
//! limit (window and algorithm), so two limits on one descriptor never share state. The
//! reference service joins parts with `_`, which lets `a_b` collide with `a` + `b`; here `|`,
//! `=` and `\` inside a part are escaped with `\`, so distinct counters always get distinct keys
//! while the key stays readable in `redis-cli`.
//!
//! A part longer than [`LONG_PART`] bytes (a long header value, an attacker's 1 MB one) is
//! written as `\#` and 32 hex digits of its SHA-256 instead, so a key is at most a few
//! kilobytes whatever the request, in Redis as in memory. `\#` cannot come out of escaping
//! (a backslash is only ever followed by `|`, `=` or `\`), so a digest never equals a
//! written-out part; SHA-256 is the same on every instance (the fleet must agree on keys)
//! and no one can make two values share a digest.
//!
//! Under `REDIS_KEY_FORMAT=reference` a fixed-window counter takes the reference's key
//! instead ([`CounterKey::reference`]), so that the reference and Sluice count together
//! while both run; its ambiguity comes back with it.

use std::fmt::{self, Write as _};

use crate::algorithm::Limit;

/// A counter's key, e.g. `api|api_key=partner-a|path=/login|60s:fw`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(Box<str>);

/// Parts of a reference-layout key longer than this many bytes are written as their digest
/// (a path or a user agent is written out, an attacker's megabyte is not).
pub const LONG_REFERENCE_PART: usize = 4096;

impl CounterKey {
    /// Builds the key for `domain`, the `(key, value)` entries and `limit`.
    pub fn new<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        limit: &Limit,
    ) -> Self {
        let mut out = String::with_capacity(64);
        escape_into(&mut out, domain);
        for (key, value) in entries {
            out.push('|');
            escape_into(&mut out, key);
            out.push('=');
            escape_into(&mut out, value);
        }
        let _ = write!(
            out,
            "|{}s:{}",
            limit.window / crate::algorithm::SECOND,
            limit.algorithm.key_tag()
        );
        Self(out.into_boxed_str())
    }

    /// The reference's key for `domain` and the `(key, value)` entries without its window
    /// start, e.g. `api_api_key_partner-a_path_/login_` (the Redis store adds the key prefix
    /// before and the window start after: `envoyproxy/ratelimit`'s `src/limiter/cache_key.go`
    /// layout). Parts are joined with `_` unescaped, as the reference joins them; a part
    /// that holds `\#` (which begins every digest) is written as its digest too, so that no
    /// value can spell out another value's digest and share its counter.
    pub fn reference<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut out = String::with_capacity(64);
        let part = |out: &mut String, text: &str| {
            if text.len() > LONG_REFERENCE_PART || text.contains("\\#") {
                push_digest(out, text);
            } else {
                out.push_str(text);
            }
            out.push('_');
        };
        part(&mut out, domain);
        for (key, value) in entries {
            part(&mut out, key);
            part(&mut out, value);
        }
        Self(out.into_boxed_str())
    }

    /// Whether this is a reference-layout key ([`CounterKey::reference`]): it ends with `_`,
    /// which no Sluice key does (they end with the limit's tag).
    pub fn is_reference(&self) -> bool {
        self.0.ends_with('_')
    }

    /// The same counter, global (`scope: global`): one budget for every region, kept at the
    /// root and leased through each region's pool. Its key ends with `|global`, after the
    /// limit's tag, which no other key does (a value's `|` is escaped, and the reference
    /// layout ends with `_`).
    pub fn global(self) -> Self {
        if self.is_global() {
            return self;
        }
        let mut key = self.0.into_string();
        key.push_str(GLOBAL);
        Self(key.into_boxed_str())
    }

    /// A global fixed window's counter at the root for the window starting at `start` (µs):
    /// one key per window, so that a region can charge the next window ahead of it. Still a
    /// global key (`@<start>` goes before `|global`).
    pub fn windowed(self, start: u64) -> Self {
        let base = self.0.strip_suffix(GLOBAL).unwrap_or(&self.0);
        Self(format!("{base}@{start}{GLOBAL}").into_boxed_str())
    }

    /// Whether this is a global counter's key ([`CounterKey::global`]).
    pub fn is_global(&self) -> bool {
        self.0.ends_with(GLOBAL)
    }

    /// The encoded key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The end of a global counter's key.
const GLOBAL: &str = "|global";

/// Parts longer than this many bytes are written as their digest.
pub const LONG_PART: usize = 128;

/// Appends the first `bytes` bytes of `text`'s SHA-256 to `out`, in hex: a short name for a
/// long text that every instance computes alike and no one can aim at another's.
pub(crate) fn push_sha256_hex(out: &mut String, text: &str, bytes: usize) {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    for byte in &digest.as_ref()[..bytes] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// A long part as `\#` and 32 hex digits of its SHA-256 (escaping never writes `\#`).
fn push_digest(out: &mut String, part: &str) {
    out.push_str("\\#");
    push_sha256_hex(out, part, 16);
}

fn escape_into(out: &mut String, part: &str) {
    if part.len() > LONG_PART {
        push_digest(out, part);
        return;
    }
    if !part.contains(['|', '=', '\\']) {
        out.push_str(part);
        return;
    }
    for c in part.chars() {
        if matches!(c, '|' | '=' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};

    #[test]
    fn only_a_global_counters_key_ends_as_one() {
        let key = CounterKey::new("api", [("tenant", "x|global")], &MINUTE);
        assert!(!key.is_global());
        let global = key.clone().global();
        assert!(global.is_global());
        assert_eq!(global.as_str(), format!("{key}|global"));
        assert_eq!(global.clone().global(), global);
        assert!(!CounterKey::reference("api", [("tenant", "|global")]).is_global());
    }

    const MINUTE: Limit = Limit {
        overdraft: false,
        requests: 10,
        window: 60 * SECOND,
        algorithm: Algorithm::FixedWindow,
        burst: 10,
    };

    #[test]
    fn key_format_is_stable() {
        let key = CounterKey::new(
            "api",
            [("api_key", "partner-a"), ("path", "/login")],
            &MINUTE,
        );
        assert_eq!(key.as_str(), "api|api_key=partner-a|path=/login|60s:fw");
    }

    #[test]
    fn separators_inside_values_cannot_collide() {
        let joined = CounterKey::new("d", [("a", "b|c=d")], &MINUTE);
        let split = CounterKey::new("d", [("a", "b"), ("c", "d")], &MINUTE);
        assert_ne!(joined, split);
        assert_eq!(joined.as_str(), r"d|a=b\|c\=d|60s:fw");
        // The reference's `key_value` joining collides on these two.
        assert_ne!(
            CounterKey::new("d", [("a_b", "c")], &MINUTE),
            CounterKey::new("d", [("a", "b_c")], &MINUTE)
        );
    }

    #[test]
    fn long_parts_are_written_as_their_digest() {
        let long = "x".repeat(LONG_PART + 1);
        let key = CounterKey::new("d", [("path", long.as_str())], &MINUTE);
        // The first 128 bits of SHA-256("x" × 129): every instance writes the same key.
        assert_eq!(
            key.as_str(),
            r"d|path=\#0ec9eb33e74510bcdd1f2ea55206e82f|60s:fw"
        );
        // A megabyte costs what 129 bytes cost, and different values stay different.
        let huge = "y".repeat(1 << 20);
        assert_eq!(
            CounterKey::new("d", [("path", huge.as_str())], &MINUTE)
                .as_str()
                .len(),
            key.as_str().len()
        );
        assert_ne!(
            CounterKey::new("d", [("path", huge.as_str())], &MINUTE),
            key
        );
        // At the threshold a part is still written out.
        let edge = "z".repeat(LONG_PART);
        assert!(
            CounterKey::new("d", [("path", edge.as_str())], &MINUTE)
                .as_str()
                .contains(&edge)
        );
    }

    #[test]
    fn reference_keys_join_parts_as_the_reference_does() {
        let key = CounterKey::reference("api", [("api_key", "partner-a"), ("path", "/login")]);
        assert_eq!(key.as_str(), "api_api_key_partner-a_path_/login_");
        assert!(key.is_reference());
        assert!(!CounterKey::new("api", [("k", "v_")], &MINUTE).is_reference());
        // The reference's ambiguity comes back with its layout.
        assert_eq!(
            CounterKey::reference("d", [("a_b", "c")]),
            CounterKey::reference("d", [("a", "b_c")])
        );
        let huge = "y".repeat(1 << 20);
        let digested = CounterKey::reference("d", [("path", huge.as_str())]);
        assert!(digested.as_str().len() < 64);
        // A short value that spells out that digest is digested itself: another counter.
        let spelled = digested.as_str()["d_path_".len()..]
            .trim_end_matches('_')
            .to_owned();
        assert!(spelled.starts_with("\\#"), "{spelled}");
        assert_ne!(
            CounterKey::reference("d", [("path", spelled.as_str())]),
            digested
        );
        assert_ne!(
            CounterKey::reference("d", [("path", format!("x_{spelled}").as_str())]),
            CounterKey::reference("d", [("path", "x"), ("", huge.as_str())])
        );
    }

    #[test]
    fn different_windows_are_different_counters() {
        let hour = Limit {
            window: 3600 * SECOND,
            ..MINUTE
        };
        assert_ne!(
            CounterKey::new("d", [("a", "b")], &MINUTE),
            CounterKey::new("d", [("a", "b")], &hour)
        );
    }
}
