//! statsd and DogStatsD: the reference's sinks (`USE_STATSD`, `USE_DOG_STATSD`, `STATSD_*`,
//! `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL`, `DISABLE_STATS`).

use std::time::Duration;

use clap::Args;

use super::super::parse::parse_positive_duration;
use super::named;
use crate::settings::{SettingsError, StatsdFormat, StatsdSettings};

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

    /// Send no stats (statsd, DogStatsD, the USE_PROMETHEUS listener); /metrics stays
    #[arg(long, env = "DISABLE_STATS")]
    pub disable_stats: bool,
}

impl StatsArgs {
    /// The statsd sink, when one is asked for and stats are not disabled.
    pub(super) fn resolve(&self) -> Result<Option<StatsdSettings>, SettingsError> {
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
            flush_interval: self.stats_flush_interval,
        }))
    }
}

/// `k:v,k2:v2`, the reference's map form; sorted by key, as its stats library sorts them.
fn parse_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || value.is_empty() {
            return Err(format!("'{pair}' has an empty key or value"));
        }
        tags.retain(|(k, _): &(String, String)| k != key);
        tags.push((key.to_owned(), value.to_owned()));
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
}
