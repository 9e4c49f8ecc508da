//! Stats names as the reference writes them, and DogStatsD's mogrifiers, which rewrite them.

use super::Mogrifier;

/// A stats key as the reference writes it: `:` and `|` (the protocol's separators) as `_`,
/// and the dots of an IPv4 address as `_` (so that an address is one name component).
/// Control characters, which would end a line, become `_` too; and unlike the reference,
/// `,` `#` `[` `]` `=`, which statsd_exporter reads as InfluxDB, Librato and SignalFX tags in
/// a name (a request value `victim.over_limit,x=y` must not count as another series).
pub fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| match b {
            b':' | b'|' | b',' | b'#' | b'[' | b']' | b'=' => b'_',
            b if b.is_ascii_control() => b'_',
            b => b,
        })
        .collect();
    // Dotted quads: four runs of 1-3 digits joined by dots, not inside a longer number.
    let mut i = 0;
    while i < out.len() {
        let starts = out[i].is_ascii_digit() && (i == 0 || !out[i - 1].is_ascii_digit());
        if let Some(end) = starts.then(|| dotted_quad(&out[i..])).flatten() {
            for b in &mut out[i..i + end] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i += end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The length of the IPv4 address at the start of `bytes`, if there is one.
fn dotted_quad(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    for part in 0..4 {
        if part > 0 {
            if bytes.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = bytes[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=3).contains(&digits) {
            return None;
        }
        at += digits;
    }
    Some(at)
}

/// The mogrifiers of `USE_DOG_STATSD_MOGRIFIERS`, compiled, in order.
pub(super) struct Mogrifiers(Vec<(regex::Regex, Mogrifier)>);

impl Mogrifiers {
    /// `mogrifiers` compiled (their patterns were checked with the settings; one that does not
    /// compile is skipped and logged).
    pub(super) fn new(mogrifiers: &[Mogrifier]) -> Self {
        let compiled = mogrifiers
            .iter()
            .filter_map(|m| match regex::Regex::new(&m.pattern) {
                Ok(re) => Some((re, m.clone())),
                Err(error) => {
                    tracing::warn!(mogrifier = %m.id, %error, "mogrifier skipped");
                    None
                }
            })
            .collect();
        Self(compiled)
    }

    /// The name and tags of `name` by the first mogrifier whose pattern matches it, as the
    /// reference's DogStatsD sink rewrites them.
    pub(super) fn apply(&self, name: &str) -> Option<(String, Vec<(String, String)>)> {
        self.0.iter().find_map(|(pattern, mogrifier)| {
            let groups = pattern.captures(name)?;
            // A group copies request text: it must not add tags or end the line.
            let tags = mogrifier
                .tags
                .iter()
                .map(|(k, v)| (tag_text(&expand(k, &groups)), tag_text(&expand(v, &groups))))
                .collect();
            Some((expand(&mogrifier.name, &groups), tags))
        })
    }
}

/// A tag key or value with the characters that would split or end DogStatsD's tag list (`,`
/// `|` `#`, control characters) as `_`.
fn tag_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, ',' | '|' | '#') {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// `template` with `$1`, `$2`, ... replaced by the groups of a match (a `$n` past the last
/// group stays as written).
fn expand(template: &str, groups: &regex::Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let group = rest[at + 1..at + 1 + digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| groups.get(n));
        match group {
            Some(g) => out.push_str(g.as_str()),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_captured_value_cannot_add_tags_or_end_the_line() {
        let mogrifiers = Mogrifiers::new(&[Mogrifier {
            id: "M".into(),
            pattern: r"^ratelimit\.service\.rate_limit\.(.*)\.total_hits$".into(),
            name: "hits".into(),
            tags: vec![("rule".into(), "$1".into())],
        }]);
        let (name, tags) = mogrifiers
            .apply("ratelimit.service.rate_limit.a,evil:1|#x\r.total_hits")
            .unwrap();
        assert_eq!(name, "hits");
        assert_eq!(tags, vec![("rule".to_owned(), "a_evil:1__x_".to_owned())]);
    }

    #[test]
    fn tag_characters_of_other_dialects_are_not_left_in_names() {
        assert_eq!(
            sanitize("victim.over_limit,x=y#[z]"),
            "victim.over_limit_x_y__z_"
        );
    }
}
