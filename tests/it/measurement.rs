//! Limits from measurement (issue 40): the ladder of candidate limits counted fleet-wide from
//! the shared counter, by three instances on one Redis, and on the memory store for each
//! algorithm.

use crate::common::redis::{RedisCluster, RedisServer, cluster_args};
use crate::common::{SluiceProcess, config_dir, http_get};

/// A shadow rule of 20 a day (a day-long window: no boundary inside a run) and an enforced
/// one; the ladder's default rungs (1/16 to 16 times the limit, four per doubling).
const CONFIG: &str = r#"
domain: measure
descriptors:
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 20}
  - key: enforced
    rate_limit: {unit: day, requests_per_unit: 20}
"#;

/// The sum over `pages` of the series `name` of rule `rule` with `le` (none: without it).
pub fn fleet_sum(pages: &[String], name: &str, rule: &str, le: Option<&str>) -> u64 {
    let wanted = format!("rule=\"{rule}\"");
    pages
        .iter()
        .flat_map(|page| page.lines())
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(&wanted))
        .filter(|line| match le {
            Some(le) => line.contains(&format!(",le=\"{le}\"")),
            None => !line.contains(",le=\""),
        })
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

/// Each instance's `/metrics`.
pub async fn scrape(instances: &[SluiceProcess]) -> Vec<String> {
    let mut pages = Vec::new();
    for instance in instances {
        let (status, page) = http_get(instance.http.parse().unwrap(), "/metrics")
            .await
            .unwrap();
        assert_eq!(status, 200);
        pages.push(page);
    }
    pages
}

/// Sends `hits` requests for `(key, value)`, round-robin over `instances`.
pub async fn spread(instances: &[SluiceProcess], key: &str, value: &str, hits: usize) {
    crate::common::drive_processes(instances, "measure", &[(key, value)], hits, 4).await;
}

/// Ten keys with peaks 5, 10, …, 50 on a limit of 20, spread over three instances on one
/// Redis: the ladder summed over the instances is exactly what the peaks imply (one key on
/// three instances is one key-window; each hit is placed once, at the shared count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_measure_each_key_window_once() {
    let redis = RedisServer::start();
    let dir = config_dir("measure-fleet", &[("m.yaml", CONFIG)]);
    let instances: Vec<SluiceProcess> = (0..3)
        .map(|_| SluiceProcess::on_redis(&dir, &redis, &["--redis-deadline", "2s"]))
        .collect();
    let peaks: Vec<u64> = (1..=10).map(|i| i * 5).collect();
    for (i, &peak) in peaks.iter().enumerate() {
        spread(&instances, "shadowed", &format!("k{i}"), peak as usize).await;
        spread(&instances, "enforced", &format!("k{i}"), peak as usize).await;
    }
    let pages = scrape(&instances).await;
    let sum = |name: &str, rule: &str, le: Option<&str>| fleet_sum(&pages, name, rule, le);
    let (windows, past, hits) = (
        "sluice_rule_key_windows_total",
        "sluice_rule_key_windows_past_total",
        "sluice_rule_hits_past_total",
    );
    let rule = "measure.shadowed";
    assert_eq!(sum(windows, rule, None), 10);
    let total: u64 = peaks.iter().sum();
    assert_eq!(sum("sluice_rule_hits_measured_total", rule, None), total);
    // Rungs as counts on a limit of 20: 0.5 → 10, 1 → 20, 1.4142 → 28, 2 → 40, 2.3784 → 47.
    for (le, rung) in [
        ("0.5", 10),
        ("1", 20),
        ("1.4142", 28),
        ("2", 40),
        ("2.3784", 47),
    ] {
        let above = peaks.iter().filter(|&&p| p > rung).count() as u64;
        let beyond: u64 = peaks.iter().map(|&p| p.saturating_sub(rung)).sum();
        assert_eq!(sum(past, rule, Some(le)), above, "key-windows past {le}");
        assert_eq!(sum(hits, rule, Some(le)), beyond, "hits past {le}");
    }
    assert_eq!(sum(past, rule, Some("+Inf")), 0);
    // The enforced rule: the same below its limit; its refused hits past it, no key-window
    // measured above it (its counter stops at the limit).
    let rule = "measure.enforced";
    assert_eq!(sum(past, rule, Some("0.5")), 8);
    assert_eq!(sum(hits, rule, Some("0.5")), total - 5 - 10 - 8 * 10);
    assert_eq!(sum(past, rule, Some("1")), 0);
    let refused: u64 = peaks.iter().map(|&p| p.saturating_sub(20)).sum();
    assert_eq!(sum(hits, rule, Some("1")), refused);
    assert_eq!(sum(hits, rule, Some("1.1892")), 0);
}

/// On the memory store, each algorithm's key-window: a fixed window's key in its window, a
/// sliding window's from an empty estimate, a token bucket's from a full bucket, a
/// concurrency key from nothing in flight. One key of 12 hits on a limit of 8, each in shadow
/// mode: one key-window, past the limit, 4 hits past it. A concurrency rule's counter stops at
/// its limit even in shadow mode (what it refuses is never released): its key-window is not
/// measured past the limit, its refused hits are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_measures_a_key_window_and_its_peak() {
    every_algorithm_measures(&[]).await;
}

/// The same on Redis: the counts come from the script's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_measures_a_key_window_and_its_peak_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    every_algorithm_measures(&["--backend", "redis", "--redis-url", &url]).await;
}

async fn every_algorithm_measures(args: &[&str]) {
    let mut yaml = String::from("domain: measure\ndescriptors:\n");
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "token_bucket",
        "concurrency",
    ] {
        yaml.push_str(&format!(
            "  - key: {algorithm}\n    shadow_mode: true\n    rate_limit: {{unit: day, requests_per_unit: 8, algorithm: {algorithm}}}\n"
        ));
    }
    let dir = config_dir("measure-algorithms", &[("m.yaml", &yaml)]);
    let instance = SluiceProcess::spawn(&dir, args);
    let instances = std::slice::from_ref(&instance);
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "token_bucket",
        "concurrency",
    ] {
        spread(instances, algorithm, "a", 12).await;
    }
    let pages = scrape(instances).await;
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "token_bucket",
        "concurrency",
    ] {
        let rule = format!("measure.{algorithm}");
        let sum = |name: &str, le: Option<&str>| fleet_sum(&pages, name, &rule, le);
        assert_eq!(sum("sluice_rule_key_windows_total", None), 1, "{algorithm}");
        let past_limit = u64::from(algorithm != "concurrency");
        assert_eq!(
            sum("sluice_rule_key_windows_past_total", Some("1")),
            past_limit,
            "{algorithm}"
        );
        assert_eq!(
            sum("sluice_rule_hits_past_total", Some("1")),
            4,
            "{algorithm}"
        );
        assert_eq!(
            sum("sluice_rule_hits_past_total", Some("0.5")),
            8,
            "{algorithm}"
        );
    }
}

/// `ladder:` mistakes are config errors naming the field and what is wrong.
#[test]
fn a_bad_ladder_is_a_config_error_naming_the_field() {
    let errors = |ladder: &str| {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    ladder: {ladder}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        let sources = vec![("d.yaml".to_owned(), yaml)];
        sluice::config::load_sources(&sources, Default::default())
            .expect_err("should be rejected")
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let text = errors("{from: 0, to: 4}");
    assert!(
        text.contains("descriptors[0].ladder") && text.contains("from 0 is not in"),
        "{text}"
    );
    let text = errors("{from: 1, to: 2, steps_per_doubling: 1.5}");
    assert!(
        text.contains("ladder.steps_per_doubling") && text.contains("not a whole number"),
        "{text}"
    );
    let text = errors("{from: 0.5, upto: 2}");
    assert!(text.contains("unknown key 'upto'"), "{text}");
    let text = errors("often");
    assert!(
        text.contains("ladder must be false, true, or a mapping"),
        "{text}"
    );
    let text = errors("{from: 0.001, to: 1000, steps_per_doubling: 8}");
    assert!(text.contains("more than 64"), "{text}");
}

/// Windows of four seconds: a phase of requests fits in one, and its counts come 3 s after
/// it ends.
const REFUSING: &str = r#"
domain: measure
descriptors:
  - key: user
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 1}
"#;

const WINDOW: std::time::Duration = std::time::Duration::from_secs(4);

/// Waits for the start of the next window (windows are aligned to the Unix epoch), so that a
/// phase of requests falls in one window.
pub async fn next_window() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = std::time::Duration::from_nanos((now.as_nanos() % WINDOW.as_nanos()) as u64);
    tokio::time::sleep(WINDOW - into + std::time::Duration::from_millis(20)).await;
}

/// The largest value any instance gives `name` for the rule: the fleet's figure.
fn fleet_max(pages: &[String], name: &str) -> Option<u64> {
    pages
        .iter()
        .flat_map(|p| p.lines())
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("rule=\"measure.user\""))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .max()
}

/// Refuses each of `keys` once (two requests each, round-robin: the second is refused), all
/// in one window, then waits for the fleet's counts of that window: (distinct, new).
async fn refuse_in_one_window(
    instances: &[SluiceProcess],
    keys: std::ops::Range<u32>,
    before: (u64, u64),
) -> (u64, u64) {
    next_window().await;
    for k in keys {
        spread(instances, "user", &format!("u{k}"), 2).await;
    }
    let started = std::time::Instant::now();
    loop {
        let pages = scrape(instances).await;
        let distinct = fleet_max(&pages, "sluice_rule_refused_keys");
        let new = fleet_max(&pages, "sluice_rule_newly_refused_keys");
        let counts = (distinct.unwrap_or(0), new.unwrap_or(0));
        if counts != before && counts != (0, 0) {
            return counts;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "never counted: the window's refused keys"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Distinct and newly refused keys, fleet-wide: ten keys refused across three instances on one
/// Redis are ten keys, all new; the next window's eight, of which five were refused before,
/// are eight keys and three new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_count_distinct_and_newly_refused_keys_once() {
    let redis = RedisServer::start();
    let dir = config_dir("measure-distinct", &[("m.yaml", REFUSING)]);
    let instances: Vec<SluiceProcess> = (0..3)
        .map(|_| SluiceProcess::on_redis(&dir, &redis, &["--redis-deadline", "2s"]))
        .collect();
    let first = refuse_in_one_window(&instances, 0..10, (0, 0)).await;
    assert_eq!(first, (10, 10));
    let second = refuse_in_one_window(&instances, 5..13, first).await;
    assert_eq!(second, (8, 3));
}

/// The same on a Redis Cluster: a rule's sets share one hash slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_count_distinct_refused_keys_once() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let dir = config_dir("measure-distinct-cluster", &[("m.yaml", REFUSING)]);
    let mut args = cluster_args(&url).to_vec();
    args.extend(["--redis-deadline", "2s"]);
    let instances: Vec<SluiceProcess> = (0..3).map(|_| SluiceProcess::spawn(&dir, &args)).collect();
    let first = refuse_in_one_window(&instances, 0..10, (0, 0)).await;
    assert_eq!(first, (10, 10));
}

/// The same on the memory store, one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_on_memory_counts_distinct_and_newly_refused_keys() {
    let dir = config_dir("measure-distinct-memory", &[("m.yaml", REFUSING)]);
    let instance = SluiceProcess::spawn(&dir, &[]);
    let instances = std::slice::from_ref(&instance);
    let first = refuse_in_one_window(instances, 0..4, (0, 0)).await;
    assert_eq!(first, (4, 4));
    let second = refuse_in_one_window(instances, 2..7, first).await;
    assert_eq!(second, (5, 3));
}

/// `TOP_REFUSED_KEYS_VALUES=hashed`: the top refused keys name each value by 12 hex digits of
/// its SHA-256, and the value itself appears nowhere in `/top`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_refused_keys_can_hold_hashed_values() {
    use crate::common::TestServer;
    let mut settings = sluice::settings::Settings::for_tests(config_dir(
        "measure-hashed",
        &[(
            "t.yaml",
            "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )],
    ));
    settings.limiter.top_refused_keys_hashed = true;
    let server = TestServer::start_with(settings).await;
    let t = server.domain("t");
    for _ in 0..3 {
        t.hit("user=alice@example.com").await;
    }
    let (status, text) = http_get(server.http_addr, "/top?domain=t").await.unwrap();
    assert_eq!(status, 200, "{text}");
    let digest = ring::digest::digest(&ring::digest::SHA256, b"alice@example.com");
    let hex: String = digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["rules"][0]["windows"][0]["keys"][0]["key"],
        format!("user=#{hex}"),
        "{text}"
    );
    assert!(!text.contains("alice"), "{text}");
}
