//! The reference's stats over statsd (TCP, its default sink) or DogStatsD (UDP), every
//! `STATS_FLUSH_INTERVAL`. They are read from the registry `/metrics` serves (no counter is
//! kept twice) and named as the reference names them, so that its statsd_exporter mapping
//! gives the same Prometheus series:
//!
//! | Sluice series | stat |
//! |---|---|
//! | `ratelimit_service_rate_limit_<what>{rule}` | `ratelimit.service.rate_limit.<rule>.<what>` |
//! | `ratelimit_service_domain_not_found{domain}` | `ratelimit.service.rate_limit.<domain>.domain_not_found` |
//! | `ratelimit_service_should_rate_limit_error{err_type}` | `ratelimit.service.call.should_rate_limit.<err_type>` |
//! | `ratelimit_service_config_load_{success,error}` | `ratelimit.service.config_load_{success,error}` |
//! | `ratelimit_service_global_shadow_mode` | `ratelimit.service.global_shadow_mode` |
//! | `sluice_grpc_requests_total{method="ShouldRateLimit"}` | `ratelimit_server.ShouldRateLimit.total_requests` |
//! | `sluice_grpc_request_duration_seconds{method="ShouldRateLimit"}` | `ratelimit_server.ShouldRateLimit.response_time` (timer, ms) |
//!
//! Counters are sent as their increase since the last flush, and not at all when it is zero
//! (as the reference's stats library does). The response time is a histogram here, so each
//! flush sends one timer sample per bucket that grew, valued at the bucket's middle (whole
//! milliseconds, as the reference sends them) with a sample rate of 1/count, which statsd
//! servers count as that many samples.
//!
//! A statsd server that is down or slow costs one connection attempt and one write of at
//! most [`IO_TIMEOUT`] per flush, off the request path; the lines of a failed flush are
//! dropped, counted in `sluice_stats_dropped_total`, and logged at most once a minute.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use cadence::{Counted, MetricSink, StatsdClient, Timed};
use parking_lot::Mutex;
use prometheus::Registry;
use prometheus::proto::{MetricFamily, MetricType};

use names::Mogrifiers;
pub use names::sanitize;
use transport::Transport;

mod names;
mod options;
mod transport;

pub use options::{Mogrifier, StatsdFormat, StatsdSettings};

/// Longest wait to connect to the statsd server, and to write one flush.
pub const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// Sends the registry's reference stats every flush interval until `stop`, then once more.
pub async fn run(
    settings: StatsdSettings,
    registry: Registry,
    stop: impl std::future::Future<Output = ()>,
) {
    let dropped = super::counter(
        &registry,
        "sluice_stats_dropped_total",
        "statsd/DogStatsD lines dropped because the server could not take them",
    );
    let mut exporter = Exporter::new(&settings);
    let mut transport = Transport::new(&settings);
    tracing::info!(
        server = %format!("{}:{}", settings.host, settings.port),
        format = ?settings.format,
        interval = ?settings.flush_interval,
        "sending stats"
    );
    let mut ticks = tokio::time::interval(settings.flush_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    tokio::pin!(stop);
    loop {
        let last = tokio::select! {
            _ = ticks.tick() => false,
            _ = &mut stop => true,
        };
        let lines = exporter.lines(&registry.gather());
        transport.send(&lines, &dropped).await;
        if last {
            return;
        }
    }
}

/// What one flush needs to remember of the last.
pub struct Exporter {
    client: StatsdClient,
    collected: Arc<Mutex<Vec<String>>>,
    /// Plain statsd carries the tags in the name (`.__k=v`); DogStatsD as tags.
    name_tags: String,
    /// Counter totals at the last flush, by stat name.
    counters: HashMap<String, u64>,
    /// Cumulative bucket counts of the response time at the last flush.
    buckets: Vec<u64>,
    /// DogStatsD's mogrifiers, compiled.
    mogrifiers: Mogrifiers,
}

/// A sink that keeps the formatted lines, for the transport to send.
struct Collect(Arc<Mutex<Vec<String>>>);

// A panic while a line is pushed leaves at worst a line too few; nothing is half-written.
impl std::panic::RefUnwindSafe for Collect {}

impl MetricSink for Collect {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        self.0.lock().push(metric.to_owned());
        Ok(metric.len())
    }
}

impl Exporter {
    /// An exporter in `settings`' format and tags.
    pub fn new(settings: &StatsdSettings) -> Self {
        let collected = Arc::new(Mutex::new(Vec::new()));
        let mut builder = StatsdClient::builder("", Collect(collected.clone()));
        let mut name_tags = String::new();
        // Sorted by key, as the reference's stats library writes them.
        let mut tags = settings.extra_tags.clone();
        tags.sort();
        for (key, value) in &tags {
            match settings.format {
                StatsdFormat::DogStatsd => {
                    builder = builder.with_tag(key.clone(), tag_value(value))
                }
                StatsdFormat::Statsd => {
                    name_tags.push_str(&format!(".__{key}={}", tag_value(value)));
                }
            }
        }
        let mogrifiers = Mogrifiers::new(&settings.mogrifiers);
        Self {
            client: builder.build(),
            collected,
            name_tags,
            counters: HashMap::new(),
            buckets: Vec::new(),
            mogrifiers,
        }
    }

    /// The name and tags a stat is sent with: the first mogrifier whose pattern matches
    /// renames it and adds its tags, as the reference's DogStatsD sink does.
    fn mogrify(&self, name: &str) -> (String, Vec<(String, String)>) {
        self.mogrifiers
            .apply(name)
            .unwrap_or_else(|| (format!("{name}{}", self.name_tags), Vec::new()))
    }

    /// The lines of one flush: what changed since the last.
    pub fn lines(&mut self, families: &[MetricFamily]) -> Vec<String> {
        let (totals, histogram) = reference_stats(families);
        for (name, total) in &totals {
            // A series dropped and made again (a reload) starts from zero.
            let before = self.counters.get(name).copied().unwrap_or(0);
            let delta = if *total >= before {
                total - before
            } else {
                *total
            };
            if delta > 0 {
                let (name, tags) = self.mogrify(name);
                let mut line = self.client.count_with_tags(&name, delta);
                for (k, v) in &tags {
                    line = line.with_tag(k, v);
                }
                let _ = line.try_send();
            }
        }
        self.counters = totals;
        if let Some((bounds, cumulative)) = histogram {
            self.timer_samples(&bounds, &cumulative);
            self.buckets = cumulative;
        }
        std::mem::take(&mut *self.collected.lock())
    }

    /// One timer sample per bucket that grew since the last flush.
    fn timer_samples(&self, bounds: &[f64], cumulative: &[u64]) {
        let (name, tags) = self.mogrify("ratelimit_server.ShouldRateLimit.response_time");
        let mut lower = 0.0;
        let mut previous_total = (0, 0);
        for (i, &count) in cumulative.iter().enumerate() {
            let before = self.buckets.get(i).copied().unwrap_or(0);
            // Per-bucket counts now and at the last flush.
            let now = count.saturating_sub(previous_total.0);
            let then = before.saturating_sub(previous_total.1);
            previous_total = (count, before);
            let upper = bounds.get(i).copied().unwrap_or(f64::INFINITY);
            let middle_ms = if upper.is_finite() {
                (lower + upper) / 2.0 * 1000.0
            } else {
                lower * 1000.0
            };
            lower = upper;
            let grew = now.saturating_sub(then);
            if grew == 0 {
                continue;
            }
            let mut sample = self.client.time_with_tags(&name, middle_ms as u64);
            for (k, v) in &tags {
                sample = sample.with_tag(k, v);
            }
            let sample = if grew > 1 {
                sample.with_sampling_rate(1.0 / grew as f64)
            } else {
                sample
            };
            let _ = sample.try_send();
        }
    }
}

/// The reference's counters (totals by stat name) and the response-time histogram (bucket
/// bounds in seconds and cumulative counts, `+Inf` last) in `families`.
type ReferenceStats = (HashMap<String, u64>, Option<(Vec<f64>, Vec<u64>)>);

fn reference_stats(families: &[MetricFamily]) -> ReferenceStats {
    let mut totals: HashMap<String, u64> = HashMap::new();
    let mut histogram = None;
    for family in families {
        let name = family.name();
        if family.get_field_type() == MetricType::HISTOGRAM {
            if name == "sluice_grpc_request_duration_seconds" {
                histogram = family
                    .get_metric()
                    .iter()
                    .find(|m| label(m, "method") == Some("ShouldRateLimit"))
                    .map(|m| {
                        let h = m.get_histogram();
                        let buckets = h.get_bucket();
                        let mut bounds: Vec<f64> =
                            buckets.iter().map(|b| b.upper_bound()).collect();
                        let mut counts: Vec<u64> =
                            buckets.iter().map(|b| b.cumulative_count()).collect();
                        bounds.push(f64::INFINITY);
                        counts.push(h.get_sample_count());
                        (bounds, counts)
                    });
            }
            continue;
        }
        if family.get_field_type() != MetricType::COUNTER {
            continue;
        }
        for metric in family.get_metric() {
            let Some(stat) = stat_name(name, metric) else {
                continue;
            };
            *totals.entry(stat).or_default() += metric.get_counter().get_value() as u64;
        }
    }
    (totals, histogram)
}

/// The reference's name of a series, if it has one.
fn stat_name(family: &str, metric: &prometheus::proto::Metric) -> Option<String> {
    if let Some(what) = family.strip_prefix("ratelimit_service_rate_limit_") {
        let rule = label(metric, "rule")?;
        return Some(format!(
            "ratelimit.service.rate_limit.{}.{what}",
            sanitize(rule)
        ));
    }
    Some(match family {
        "ratelimit_service_domain_not_found" => format!(
            "ratelimit.service.rate_limit.{}.domain_not_found",
            sanitize(label(metric, "domain")?)
        ),
        "ratelimit_service_should_rate_limit_error" => format!(
            "ratelimit.service.call.should_rate_limit.{}",
            label(metric, "err_type")?
        ),
        "ratelimit_service_config_load_success" => "ratelimit.service.config_load_success".into(),
        "ratelimit_service_config_load_error" => "ratelimit.service.config_load_error".into(),
        "ratelimit_service_global_shadow_mode" => "ratelimit.service.global_shadow_mode".into(),
        "sluice_grpc_requests_total" if label(metric, "method") == Some("ShouldRateLimit") => {
            "ratelimit_server.ShouldRateLimit.total_requests".into()
        }
        _ => return None,
    })
}

fn label<'m>(metric: &'m prometheus::proto::Metric, name: &str) -> Option<&'m str> {
    metric
        .get_label()
        .iter()
        .find(|l| l.name() == name)
        .map(|l| l.value())
}

/// A tag value as the reference's stats library cleans it: `.`, `:` and `|` as `_`.
fn tag_value(value: &str) -> String {
    value.replace(['.', ':', '|'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntCounter;

    #[test]
    fn keys_are_sanitized_as_the_reference_does() {
        assert_eq!(
            sanitize("d.remote_address_10.0.0.7.path_/a:b|c"),
            "d.remote_address_10_0_0_7.path_/a_b_c"
        );
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.k_1234.5.6.7"), "d.k_1234.5.6.7");
        assert_eq!(sanitize("line\nbreak"), "line_break");
    }

    fn settings(format: StatsdFormat, tags: &[(&str, &str)]) -> StatsdSettings {
        StatsdSettings {
            format,
            host: "localhost".into(),
            port: 8125,
            extra_tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            mogrifiers: Vec::new(),
            flush_interval: Duration::from_secs(10),
        }
    }

    fn registry_with_hits(hits: u64) -> (Registry, IntCounter) {
        let registry = Registry::new();
        let hits_vec = super::super::counter_vec(
            &registry,
            "ratelimit_service_rate_limit_total_hits",
            "h",
            &["domain", "rule", "key1", "key2"],
        );
        let c = hits_vec.with_label_values(&["d", "d.api_key", "api_key", ""]);
        c.inc_by(hits);
        (registry, c)
    }

    #[test]
    fn counters_are_sent_as_increases_and_not_when_unchanged() {
        let (registry, c) = registry_with_hits(3);
        let mut exporter = Exporter::new(&settings(StatsdFormat::Statsd, &[]));
        assert_eq!(
            exporter.lines(&registry.gather()),
            vec!["ratelimit.service.rate_limit.d.api_key.total_hits:3|c"]
        );
        assert!(exporter.lines(&registry.gather()).is_empty());
        c.inc_by(2);
        assert_eq!(
            exporter.lines(&registry.gather()),
            vec!["ratelimit.service.rate_limit.d.api_key.total_hits:2|c"]
        );
    }

    #[test]
    fn mogrifiers_rename_dogstatsd_stats_and_tag_them_with_their_groups() {
        let (registry, _c) = registry_with_hits(2);
        let mut dog = settings(StatsdFormat::DogStatsd, &[("zone", "eu")]);
        dog.mogrifiers = vec![Mogrifier {
            id: "HITS".into(),
            pattern: r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$".into(),
            name: "ratelimit.service.rate_limit.$3".into(),
            tags: vec![
                ("domain".into(), "$1".into()),
                ("descriptor".into(), "$2$9".into()),
            ],
        }];
        let mut exporter = Exporter::new(&dog);
        assert_eq!(
            exporter.lines(&registry.gather()),
            vec![
                "ratelimit.service.rate_limit.total_hits:2|c|#zone:eu,domain:d,descriptor:api_key$9"
            ]
        );
    }

    #[test]
    fn extra_tags_go_in_the_name_for_statsd_and_as_tags_for_dogstatsd() {
        let (registry, _c) = registry_with_hits(1);
        let tags = [("app", "rl"), ("zone", "eu.1")];
        let mut plain = Exporter::new(&settings(StatsdFormat::Statsd, &tags));
        assert_eq!(
            plain.lines(&registry.gather()),
            vec!["ratelimit.service.rate_limit.d.api_key.total_hits.__app=rl.__zone=eu_1:1|c"]
        );
        let mut dog = Exporter::new(&settings(StatsdFormat::DogStatsd, &tags));
        assert_eq!(
            dog.lines(&registry.gather()),
            vec!["ratelimit.service.rate_limit.d.api_key.total_hits:1|c|#app:rl,zone:eu_1"]
        );
    }
}
