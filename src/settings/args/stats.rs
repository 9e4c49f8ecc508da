//! statsd and DogStatsD: the reference's sinks (`USE_STATSD`, `USE_DOG_STATSD`, `STATSD_*`,
//! `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL`, `DISABLE_STATS`).

use std::time::Duration;

use clap::Args;

use super::super::parse::parse_positive_duration;
use super::named;
use crate::metrics::statsd::{Mogrifier, StatsdFormat, StatsdSettings};
use crate::settings::SettingsError;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "statsd and DogStatsD")]
pub struct StatsArgs {
    /// Send the reference's stats to a statsd server over TCP (STATSD_HOST:STATSD_PORT)
    #[arg(long, env = "USE_STATSD")]
    use_statsd: bool,

    /// Send them to a DogStatsD agent over UDP, EXTRA_TAGS as tags
    #[arg(long, env = "USE_DOG_STATSD")]
    use_dog_statsd: bool,

    /// The statsd server's or DogStatsD agent's host
    #[arg(long, env = "STATSD_HOST", default_value = "localhost")]
    statsd_host: String,

    /// Its port
    #[arg(long, env = "STATSD_PORT", default_value = "8125", value_parser = clap::value_parser!(u16).range(1..))]
    statsd_port: u16,

    /// Tags on every stat: k:v pairs separated by commas
    #[arg(long, env = "EXTRA_TAGS", default_value = "")]
    extra_tags: String,

    /// How often stats are sent
    #[arg(long, env = "STATS_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_positive_duration)]
    stats_flush_interval: Duration,

    /// DogStatsD mogrifiers, in order, each defined by DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS
    #[arg(long, env = "USE_DOG_STATSD_MOGRIFIERS", default_value = "")]
    use_dog_statsd_mogrifiers: String,

    /// Send no stats (statsd, DogStatsD, the USE_PROMETHEUS listener); /metrics stays
    #[arg(long, env = "DISABLE_STATS")]
    pub disable_stats: bool,
}

impl StatsArgs {
    /// The statsd sink, when one is asked for and stats are not disabled.
    pub(super) fn resolve(&self) -> Result<Option<StatsdSettings>, SettingsError> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`StatsArgs::resolve`], reading the mogrifiers' variables through `env`.
    fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<StatsdSettings>, SettingsError> {
        let format = match (self.use_statsd, self.use_dog_statsd) {
            (true, true) => {
                return Err(named(
                    &["use_dog_statsd", "use_statsd"],
                    "set one of them: both send to STATSD_HOST:STATSD_PORT",
                ));
            }
            (true, false) => StatsdFormat::Statsd,
            (false, true) => StatsdFormat::DogStatsd,
            (false, false) => return Ok(None),
        };
        if self.disable_stats {
            return Ok(None);
        }
        let host = self.statsd_host.trim();
        if host.is_empty() || host.contains(['/', ' ']) {
            return Err(named(
                &["statsd_host"],
                format!("'{host}' is not a host name"),
            ));
        }
        Ok(Some(StatsdSettings {
            format,
            host: host.to_owned(),
            port: self.statsd_port,
            extra_tags: parse_tags(&self.extra_tags).map_err(|m| named(&["extra_tags"], m))?,
            mogrifiers: match format {
                StatsdFormat::DogStatsd => mogrifiers(&self.use_dog_statsd_mogrifiers, env)?,
                StatsdFormat::Statsd => Vec::new(),
            },
            flush_interval: self.stats_flush_interval,
        }))
    }
}

/// The mogrifiers `list` names, from their `DOG_STATSD_MOGRIFIER_<NAME>_*` variables; each
/// missing or bad one is named.
fn mogrifiers(
    list: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<Mogrifier>, SettingsError> {
    let mut out = Vec::new();
    for id in list.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let var = |part: &str| format!("DOG_STATSD_MOGRIFIER_{id}_{part}");
        let bad = |part: &str, message: String| SettingsError {
            name: var(part),
            message,
        };
        let pattern = env(&var("PATTERN"))
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                bad(
                    "PATTERN",
                    format!("empty or not set: mogrifier {id} needs a pattern"),
                )
            })?;
        let compiled =
            regex::Regex::new(&pattern).map_err(|e| bad("PATTERN", format!("'{pattern}': {e}")))?;
        let name = env(&var("NAME")).filter(|n| !n.is_empty()).ok_or_else(|| {
            bad(
                "NAME",
                format!("empty or not set: mogrifier {id} needs a name"),
            )
        })?;
        protocol_safe(&name, Some(&compiled)).map_err(|m| bad("NAME", m))?;
        let tags = match env(&var("TAGS")) {
            Some(text) => parse_map(&text).map_err(|m| bad("TAGS", m))?,
            None => Vec::new(),
        };
        for (key, value) in &tags {
            protocol_safe(key, Some(&compiled))
                .and_then(|()| protocol_safe(value, Some(&compiled)))
                .map_err(|m| bad("TAGS", m))?;
        }
        out.push(Mogrifier {
            id: id.to_owned(),
            pattern,
            name,
            tags,
        });
    }
    Ok(out)
}

/// The longest tag key, value or mogrifier template.
const MAX_TAG_BYTES: usize = 200;

/// Checks that `text` (a tag or a mogrifier's template) cannot break a stats line: no
/// control character (a newline ends the line), no `|` (the protocol's field separator), no
/// `#` (DogStatsD's tag list) and no `,` (the separator between tags), at most
/// [`MAX_TAG_BYTES`]; and, for a mogrifier's templates, that every `$n` names one of its
/// `pattern`'s groups and none names a group as `${..}` or `$name`: the reference expands
/// only `$n`, so those would be sent as written, `$` included.
fn protocol_safe(text: &str, pattern: Option<&regex::Regex>) -> Result<(), String> {
    if text.len() > MAX_TAG_BYTES {
        return Err(format!(
            "'{}...' is longer than {MAX_TAG_BYTES} bytes",
            text.chars().take(32).collect::<String>()
        ));
    }
    if let Some(c) = text
        .chars()
        .find(|c| c.is_control() || matches!(c, '|' | '#' | ','))
    {
        return Err(format!(
            "'{}' holds {c:?}, which would break the stats line",
            text.escape_debug()
        ));
    }
    let Some(pattern) = pattern else {
        return Ok(());
    };
    let groups = pattern.captures_len() - 1;
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty()
            && let Some(group) = group_by_name(after, pattern)
        {
            return Err(named_group(text, group, pattern));
        }
        if let Ok(n) = digits.parse::<usize>()
            && n > groups
        {
            return Err(format!(
                "'{text}' names ${n}, but the pattern has {groups} group(s)"
            ));
        }
        rest = &after[digits.len()..];
    }
    Ok(())
}

/// The group a template names just after a `$` other than as `$n`: anything in braces
/// (`${domain}`, `${1}`, as Go's and the regex crate's templates write a group), or a name
/// of one of `pattern`'s groups (`$domain`; other text after a `$` is sent as written).
fn group_by_name<'t>(after: &'t str, pattern: &regex::Regex) -> Option<&'t str> {
    if let Some(braced) = after.strip_prefix('{') {
        let end = braced.find('}').unwrap_or(braced.len());
        return Some(&braced[..end]);
    }
    let end = after
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(after.len());
    let name = &after[..end];
    pattern
        .capture_names()
        .flatten()
        .any(|group| group == name)
        .then_some(name)
}

/// The refusal of a template naming `group` other than as `$n`, with the `$n` to write.
fn named_group(text: &str, group: &str, pattern: &regex::Regex) -> String {
    let number = group
        .parse::<usize>()
        .ok()
        .or_else(|| pattern.capture_names().position(|name| name == Some(group)));
    let instead = match number {
        Some(n) if n < pattern.captures_len() => format!("write ${n}"),
        _ => format!(
            "the pattern has no group {group}; write $1 to ${} for its groups",
            pattern.captures_len() - 1
        ),
    };
    format!(
        "'{text}' names the group {group} by name, which the reference's templates do not expand (only $1, $2, ...): {instead}"
    )
}

/// `k:v,k2:v2`, in the order given (a tag's value may be `$1`).
fn parse_map(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || value.is_empty() {
            return Err(format!("'{pair}' has an empty key or value"));
        }
        out.push((key.to_owned(), value.to_owned()));
    }
    Ok(out)
}

/// `k:v,k2:v2`, the reference's map form; sorted by key, as its stats library sorts them (the
/// last of a repeated key wins).
fn parse_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for (key, value) in parse_map(text)? {
        protocol_safe(&key, None)?;
        protocol_safe(&value, None)?;
        tags.retain(|(k, _)| *k != key);
        tags.push((key, value));
    }
    tags.sort();
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_sorted_and_a_pair_without_colon_is_named() {
        assert_eq!(
            parse_tags("zone:a, app:rl").unwrap(),
            vec![("app".into(), "rl".into()), ("zone".into(), "a".into())]
        );
        assert!(parse_tags("app=rl").unwrap_err().contains("'app=rl'"));
    }

    #[test]
    fn mogrifiers_come_from_their_variables_and_bad_ones_are_named() {
        let env = |name: &str| {
            let value = match name {
                "DOG_STATSD_MOGRIFIER_HITS_PATTERN" => {
                    r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$"
                }
                "DOG_STATSD_MOGRIFIER_HITS_NAME" => "ratelimit.service.rate_limit.$3",
                "DOG_STATSD_MOGRIFIER_HITS_TAGS" => "domain:$1,descriptor:$2",
                "DOG_STATSD_MOGRIFIER_BAD_PATTERN" => "(unclosed",
                "DOG_STATSD_MOGRIFIER_BAD_NAME" => "x",
                _ => return None,
            };
            Some(value.to_owned())
        };
        let hits = mogrifiers("HITS", env).unwrap();
        assert_eq!(hits[0].name, "ratelimit.service.rate_limit.$3");
        assert_eq!(
            hits[0].tags,
            vec![
                ("domain".into(), "$1".into()),
                ("descriptor".into(), "$2".into())
            ]
        );
        let err = mogrifiers("HITS,BAD", env).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_BAD_PATTERN");
        let err = mogrifiers("NONE", env).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_NONE_PATTERN");
        assert!(err.message.contains("not set"));
    }

    #[test]
    fn tags_and_templates_that_would_break_a_stats_line_are_refused() {
        for bad in ["zone:eu\n1", "zone:a|#evil:1", "zone:a|c", "zone:a#b"] {
            assert!(parse_tags(bad).is_err(), "{bad:?}");
        }
        let huge = format!("zone:{}", "x".repeat(100_000));
        assert!(parse_tags(&huge).unwrap_err().contains("longer than"));
        assert!(
            parse_tags("zone:eu-1,team:rate$1").is_ok(),
            "a $ in a plain tag is text"
        );
        let env = |groups: &'static str, name: &'static str, tags: &'static str| {
            move |var: &str| match var {
                "DOG_STATSD_MOGRIFIER_M_PATTERN" => Some(groups.to_owned()),
                "DOG_STATSD_MOGRIFIER_M_NAME" => Some(name.to_owned()),
                "DOG_STATSD_MOGRIFIER_M_TAGS" => Some(tags.to_owned()),
                _ => None,
            }
        };
        let err = mogrifiers("M", env("^a\\.(.*)$", "x.$9", "")).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_M_NAME");
        assert!(err.message.contains("$9"), "{}", err.message);
        let err = mogrifiers("M", env("^a\\.(.*)$", "x", "k:$1|#y")).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_M_TAGS");
        assert!(mogrifiers("M", env("^a\\.(.*)$", "x.$1", "k:$1")).is_ok());
    }

    #[test]
    fn a_template_naming_a_group_by_name_is_refused_with_its_number() {
        let env = |name: &'static str, tags: &'static str| {
            move |var: &str| match var {
                "DOG_STATSD_MOGRIFIER_M_PATTERN" => {
                    Some(r"^ratelimit\.service\.rate_limit\.(?P<domain>[^.]+)\.(.*)$".to_owned())
                }
                "DOG_STATSD_MOGRIFIER_M_NAME" => Some(name.to_owned()),
                "DOG_STATSD_MOGRIFIER_M_TAGS" => Some(tags.to_owned()),
                _ => None,
            }
        };
        let err = mogrifiers("M", env("rl.${domain}", "")).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_M_NAME");
        assert!(
            err.message.contains("'rl.${domain}'")
                && err.message.contains("group domain by name")
                && err.message.contains("write $1"),
            "{}",
            err.message
        );
        let err = mogrifiers("M", env("rl.$2", "domain:$domain")).unwrap_err();
        assert_eq!(err.name, "DOG_STATSD_MOGRIFIER_M_TAGS");
        assert!(err.message.contains("write $1"), "{}", err.message);
        let err = mogrifiers("M", env("rl.${2}", "")).unwrap_err();
        assert!(err.message.contains("write $2"), "{}", err.message);
        let err = mogrifiers("M", env("rl.${zone}", "")).unwrap_err();
        assert!(err.message.contains("no group zone"), "{}", err.message);
        // Other text after a `$` is no group: sent as written, as the reference sends it.
        let ok = mogrifiers("M", env("rl.$2", "currency:$usd")).unwrap();
        assert_eq!(ok[0].tags, vec![("currency".into(), "$usd".into())]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever EXTRA_TAGS holds, the tags accepted cannot break a stats line.
        #[test]
        fn accepted_tags_are_safe_in_a_line(text in "(\\PC|[\n|#,:]){0,300}") {
            if let Ok(tags) = parse_tags(&text) {
                for (k, v) in tags {
                    for part in [k, v] {
                        proptest::prop_assert!(part.len() <= MAX_TAG_BYTES);
                        proptest::prop_assert!(!part.contains(['\n', '|', '#', ',']));
                    }
                }
            }
        }
    }
}
