//! Descriptor values with `*` wildcards, matched like a shell glob without character classes.

/// A value pattern: literal parts separated by `*`, each `*` matching any run of characters
/// (including none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    parts: Vec<String>,
}

impl Pattern {
    /// Compiles `source`; returns `None` when it has no `*` (an exact value).
    pub fn new(source: &str) -> Option<Self> {
        if !source.contains('*') {
            return None;
        }
        Some(Self {
            source: source.to_owned(),
            parts: source.split('*').map(str::to_owned).collect(),
        })
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `value` matches the whole pattern.
    pub fn matches(&self, value: &str) -> bool {
        // `parts` has at least two elements because the source contains a `*`.
        let (first, rest) = self.parts.split_first().expect("pattern has a '*'");
        let (last, middle) = rest.split_last().expect("pattern has a '*'");
        let Some(mut tail) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        if tail.len() < last.len() {
            return false;
        }
        let end = tail.len() - last.len();
        if !tail.is_char_boundary(end) || &tail[end..] != last {
            return false;
        }
        tail = &tail[..end];
        // Greedy leftmost matching of the middle parts is exact for `*`-only globs.
        for part in middle {
            match tail.find(part.as_str()) {
                Some(at) => tail = &tail[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, value: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(value)
    }

    #[test]
    fn trailing_star_is_a_prefix_match() {
        assert!(matches("/api/*", "/api/users"));
        assert!(matches("/api/*", "/api/"));
        assert!(!matches("/api/*", "/apx/users"));
    }

    #[test]
    fn stars_anywhere_and_several() {
        assert!(matches("*.example.com", "a.example.com"));
        assert!(!matches("*.example.com", "example.com"));
        assert!(matches("/v*/users/*/orders", "/v2/users/42/orders"));
        assert!(!matches("/v*/users/*/orders", "/v2/users/42/order"));
        assert!(matches("*", ""));
        assert!(matches("a*a", "aa"));
        assert!(!matches("a*a", "a"));
        assert!(matches("a**b", "ab"));
    }

    #[test]
    fn a_value_without_star_is_not_a_pattern() {
        assert!(Pattern::new("plain").is_none());
    }

    #[test]
    fn multibyte_values_do_not_panic() {
        assert!(matches("*é", "café"));
        assert!(!matches("*é", "caf"));
        assert!(!matches("é*", "e"));
    }
}
