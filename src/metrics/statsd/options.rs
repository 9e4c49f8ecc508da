//! What the statsd exporter is told: where to send, in which dialect, with which tags, and
//! the DogStatsD mogrifiers (`settings` reads them from the reference's variables).

use std::time::Duration;

/// Where and how the reference's stats are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdSettings {
    /// statsd over TCP, or DogStatsD over UDP.
    pub format: StatsdFormat,
    /// Server host.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// `EXTRA_TAGS`, sorted by key.
    pub extra_tags: Vec<(String, String)>,
    /// DogStatsD only: the reference's mogrifiers (`USE_DOG_STATSD_MOGRIFIERS`), in order.
    pub mogrifiers: Vec<Mogrifier>,
    /// How often stats are sent.
    pub flush_interval: Duration,
}

/// A DogStatsD mogrifier: a stat whose name matches `pattern` is sent as `name` with `tags`,
/// where `$1`, `$2`, ... are the pattern's groups (the settings refuse a group named any other
/// way, which the reference would send as written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mogrifier {
    /// Its name in `USE_DOG_STATSD_MOGRIFIERS`.
    pub id: String,
    /// A regular expression (checked when the settings are read).
    pub pattern: String,
    /// The name sent.
    pub name: String,
    /// Tags sent, `key`, `value` with `$n` in either.
    pub tags: Vec<(String, String)>,
}

/// The stats protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsdFormat {
    /// Plain statsd lines over TCP, tags in the name (`.__k=v`), as the reference's default sink.
    Statsd,
    /// DogStatsD over UDP, tags as `|#k:v`.
    DogStatsd,
}
