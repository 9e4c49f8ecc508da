//! The reference's stats over statsd (TCP) and DogStatsD (UDP): a listener in the test takes
//! the lines a known sequence of requests produces, and the reference's own statsd_exporter
//! mapping (`tests/fixtures/reference/statsd_exporter.yaml`) turns them into the series its
//! Prometheus dashboards use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{TestServer, config_dir, eventually};
use parking_lot::Mutex;
use sluice::metrics::statsd::{StatsdFormat, StatsdSettings};
use sluice::settings::Settings;
use tokio::io::AsyncBufReadExt;

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// Lines received so far, shared with the listener's task.
type Lines = Arc<Mutex<Vec<String>>>;

/// A statsd server over TCP: every line it is sent, in order.
async fn tcp_statsd() -> (u16, Lines) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lines: Lines = Arc::default();
    let sink = lines.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    sink.lock().push(line);
                }
            });
        }
    });
    (port, lines)
}

fn settings(format: StatsdFormat, port: u16, tags: &[(&str, &str)]) -> Settings {
    let mut settings = Settings::for_tests(config_dir("statsd", &[("shop.yaml", CONFIG)]));
    settings.statsd = Some(StatsdSettings {
        format,
        host: "127.0.0.1".into(),
        port,
        extra_tags: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        mogrifiers: Vec::new(),
        flush_interval: Duration::from_millis(100),
    });
    settings
}

/// Sum of the counter lines named `name` (`name:n|c`), over all flushes.
fn total(lines: &[String], name: &str) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.strip_suffix("|c"))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// Three hits on a limit of 2, two on a `value_to_metric` route, one unknown domain.
async fn known_sequence(server: &TestServer) {
    let shop = server.domain("shop");
    for _ in 0..3 {
        shop.hit("api_key=k-1").await;
    }
    shop.hit("route=draw | method=GET").await;
    shop.hit("route=draw,method=GET").await;
    server.domain("nowhere").hit("a=b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_over_tcp_gets_the_reference_names_and_counts() {
    let (port, lines) = tcp_statsd().await;
    let server = TestServer::start_with(settings(StatsdFormat::Statsd, port, &[])).await;
    known_sequence(&server).await;
    let expected = [
        ("ratelimit.service.rate_limit.shop.api_key.total_hits", 3),
        ("ratelimit.service.rate_limit.shop.api_key.within_limit", 2),
        ("ratelimit.service.rate_limit.shop.api_key.over_limit", 1),
        ("ratelimit.service.rate_limit.shop.api_key.near_limit", 1),
        (
            "ratelimit.service.rate_limit.shop.route_draw.method.total_hits",
            1,
        ),
        ("ratelimit.service.rate_limit.nowhere.domain_not_found", 1),
        ("ratelimit.service.config_load_success", 1),
        ("ratelimit_server.ShouldRateLimit.total_requests", 6),
    ];
    // A flush's counters come before its timer samples, and a flush may arrive in several
    // reads: wait for both.
    let timed = |l: &String| l.starts_with("ratelimit_server.ShouldRateLimit.response_time:");
    eventually("statsd has every stat of the sequence", || {
        let lines = lines.lock().clone();
        let expected = &expected;
        async move {
            expected.iter().all(|(name, n)| total(&lines, name) == *n) && lines.iter().any(timed)
        }
    })
    .await;
    let lines = lines.lock().clone();
    // Every counter line is a whole increase; unchanged counters are not sent again.
    assert!(
        lines.iter().all(|l| l.ends_with("|c") || l.contains("|ms")),
        "{lines:?}"
    );
    // The value_to_metric level's runtime value, never the descriptor's other values.
    assert!(!lines.iter().any(|l| l.contains("k-1")), "{lines:?}");

    // The reference's statsd_exporter mapping gives its dashboards' series.
    let series = map_with_reference_exporter(&lines);
    for (name, value) in [
        (
            r#"ratelimit_service_rate_limit_total_hits{domain="shop",key1="api_key"}"#,
            3.0,
        ),
        (
            r#"ratelimit_service_rate_limit_over_limit{domain="shop",key1="api_key"}"#,
            1.0,
        ),
        (
            r#"ratelimit_service_rate_limit_within_limit{domain="shop",key1="api_key"}"#,
            2.0,
        ),
        (
            r#"ratelimit_service_rate_limit_total_hits{domain="shop",key1="route_draw",key2="method"}"#,
            1.0,
        ),
        (
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#,
            6.0,
        ),
        ("ratelimit_service_config_load_success", 1.0),
    ] {
        assert_eq!(series.get(name), Some(&value), "{name} in {series:?}");
    }
    assert!(
        series.contains_key(
            r#"ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}"#
        ),
        "{series:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_are_in_every_statsd_name_as_the_reference_writes_them() {
    let (port, lines) = tcp_statsd().await;
    let tags = [("zone", "eu-1"), ("app", "edge.rl")];
    let server = TestServer::start_with(settings(StatsdFormat::Statsd, port, &tags)).await;
    server.domain("shop").hit("api_key=k-1").await;
    let name = "ratelimit.service.rate_limit.shop.api_key.total_hits.__app=edge_rl.__zone=eu-1";
    eventually("the tagged stat arrives", || {
        let lines = lines.lock().clone();
        async move { total(&lines, name) == 1 }
    })
    .await;
    let lines = lines.lock().clone();
    assert!(
        lines
            .iter()
            .all(|l| l.contains(".__app=edge_rl.__zone=eu-1:")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_over_udp_carries_extra_tags_as_tags() {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let tags = [("zone", "eu-1")];
    let server = TestServer::start_with(settings(StatsdFormat::DogStatsd, port, &tags)).await;
    let shop = server.domain("shop");
    for _ in 0..3 {
        shop.hit("api_key=k-1").await;
    }
    let wanted = "ratelimit.service.rate_limit.shop.api_key.over_limit:1|c|#zone:eu-1";
    let lines = datagram_lines(&socket, |lines| lines.iter().any(|l| l == wanted)).await;
    assert!(
        lines.iter().all(|l| l.ends_with("|#zone:eu-1")),
        "{lines:?}"
    );
    assert!(
        lines.contains(
            &"ratelimit.service.rate_limit.shop.api_key.total_hits:3|c|#zone:eu-1".to_owned()
        ),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statsd_server_that_is_down_costs_decisions_nothing_and_is_counted() {
    let port = crate::common::redis::free_port();
    let server = TestServer::start_with(settings(StatsdFormat::Statsd, port, &[])).await;
    let shop = server.domain("shop");
    assert!(shop.hit("api_key=k-1").await.is_ok());
    eventually("dropped lines are counted", || async {
        let (_, page) = crate::common::http_get(server.http_addr, "/metrics")
            .await
            .unwrap();
        crate::common::metric::<u64>(&page, "sluice_stats_dropped_total").is_some_and(|n| n > 0)
    })
    .await;
    assert!(shop.hit("api_key=k-1").await.is_ok());
    assert!(shop.hit("api_key=k-1").await.is_over_limit());
}

/// statsd_exporter's glob mapping, as its users configure it: the first rule whose pattern
/// (`*` one dot-separated component) and metric type match names the series; `$n` are the
/// components matched. Counters sum; timers count their samples (sample rates included).
fn map_with_reference_exporter(lines: &[String]) -> BTreeMap<String, f64> {
    let yaml = std::fs::read_to_string("tests/fixtures/reference/statsd_exporter.yaml").unwrap();
    let config: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    let mappings = config["mappings"].as_sequence().unwrap();
    let mut series = BTreeMap::new();
    for line in lines {
        let (name, rest) = line.split_once(':').unwrap();
        let mut fields = rest.split('|');
        let value: f64 = fields.next().unwrap().parse().unwrap();
        let kind = fields.next().unwrap();
        let rate = fields
            .find_map(|f| f.strip_prefix('@'))
            .map_or(1.0, |r| r.parse::<f64>().unwrap());
        for mapping in mappings {
            let wanted_type = mapping["match_metric_type"].as_str();
            let type_ok = matches!(
                (wanted_type, kind),
                (None, _) | (Some("counter"), "c") | (Some("observer" | "timer"), "ms")
            );
            let Some(captures) = glob(mapping["match"].as_str().unwrap(), name) else {
                continue;
            };
            if !type_ok {
                continue;
            }
            let mut labels: Vec<String> = mapping["labels"]
                .as_mapping()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            let mut v = v.as_str().unwrap().to_owned();
                            for (i, c) in captures.iter().enumerate().rev() {
                                v = v.replace(&format!("${}", i + 1), c);
                            }
                            format!("{}=\"{v}\"", k.as_str().unwrap())
                        })
                        .collect()
                })
                .unwrap_or_default();
            labels.sort();
            let series_name = mapping["name"].as_str().unwrap();
            let key = if labels.is_empty() {
                series_name.to_owned()
            } else {
                format!("{series_name}{{{}}}", labels.join(","))
            };
            let add = if kind == "ms" { 1.0 / rate } else { value };
            *series.entry(key).or_insert(0.0) += add;
            break;
        }
    }
    series
}

/// The components `*` matched, if `name` matches `pattern`.
fn glob(pattern: &str, name: &str) -> Option<Vec<String>> {
    let (p, n): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), name.split('.').collect());
    if p.len() != n.len() {
        return None;
    }
    let mut captures = Vec::new();
    for (p, n) in p.iter().zip(&n) {
        match *p {
            "*" => captures.push((*n).to_owned()),
            p if p == *n => {}
            _ => return None,
        }
    }
    Some(captures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_counts_are_flushed_at_shutdown() {
    let (port, lines) = tcp_statsd().await;
    let mut settings = settings(StatsdFormat::Statsd, port, &[]);
    if let Some(statsd) = settings.statsd.as_mut() {
        statsd.flush_interval = Duration::from_secs(3600);
    }
    settings.shutdown_delay = Duration::ZERO;
    let server = TestServer::start_with(settings).await;
    server.domain("shop").hit("api_key=k-1").await;
    server.stop().await.unwrap();
    let name = "ratelimit.service.rate_limit.shop.api_key.total_hits";
    eventually("the shutdown's flush arrives", || {
        let lines = lines.lock().clone();
        async move { total(&lines, name) == 1 }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_variables_give_mogrified_dogstatsd_stats() {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port().to_string();
    let dir = config_dir("statsd-env", &[("shop.yaml", CONFIG)]);
    let served = crate::common::SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[
            ("USE_DOG_STATSD", "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &port),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "zone:eu-1"),
            ("USE_DOG_STATSD_MOGRIFIERS", "HITS"),
            (
                "DOG_STATSD_MOGRIFIER_HITS_PATTERN",
                r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
            ),
            (
                "DOG_STATSD_MOGRIFIER_HITS_NAME",
                "ratelimit.service.rate_limit.$3",
            ),
            ("DOG_STATSD_MOGRIFIER_HITS_TAGS", "domain:$1,descriptor:$2"),
        ],
    );
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{}", served.grpc))
        .await
        .unwrap();
    crate::common::should_rate_limit(
        &mut client,
        crate::common::request("shop", crate::common::descriptors("api_key=k-1")),
    )
    .await;
    let wanted =
        "ratelimit.service.rate_limit.total_hits:1|c|#zone:eu-1,domain:shop,descriptor:api_key";
    let mut lines: Vec<String> = Vec::new();
    while !lines.iter().any(|l| l == wanted) {
        let mut packet = vec![0; 65536];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut packet))
            .await
            .unwrap_or_else(|_| panic!("no {wanted} within 10 s in {lines:?}"))
            .unwrap();
        lines.extend(
            String::from_utf8_lossy(&packet[..n])
                .lines()
                .map(str::to_owned),
        );
    }
}

/// One stat line longer than a datagram (a detailed rule with long values) is dropped alone
/// and counted; every other line of the flush arrives, in datagrams within the bound; and a
/// request value cannot forge another series through the characters statsd_exporter reads as
/// tags (`,` `=` `#` `[` `]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_line_is_dropped_alone_and_values_cannot_forge_tags() {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    // Twelve levels of detailed values of 120 bytes: a name of about 1.5 KB.
    let mut deep = String::from("  - key: l0\n");
    let mut indent = String::from("    ");
    for level in 1..12 {
        deep += &format!("{indent}descriptors:\n{indent}  - key: l{level}\n");
        indent += "    ";
    }
    deep += &format!(
        "{indent}detailed_metric: true\n{indent}rate_limit: {{unit: hour, requests_per_unit: 100}}\n"
    );
    let config = format!("{CONFIG}{deep}");
    let mut settings = settings(StatsdFormat::DogStatsd, port, &[]);
    settings.config_dir = config_dir("statsd-oversized", &[("shop.yaml", &config)]);
    let server = TestServer::start_with(settings).await;
    let shop = server.domain("shop");
    let long = "v".repeat(120);
    let spec: Vec<String> = (0..12).map(|l| format!("l{l}={long}")).collect();
    shop.hit(&spec.join(",")).await;
    for route in 0..300 {
        shop.hit(&format!("route=r{route},method=GET")).await;
    }
    shop.hit("route=victim.over_limit#x=y[z],method=GET").await;
    let done = |lines: &[String]| {
        (0..300).all(|r| {
            let name =
                format!("ratelimit.service.rate_limit.shop.route_r{r}.method.total_hits:1|c");
            lines.contains(&name)
        }) && lines.iter().any(|l| l.contains("victim"))
    };
    let lines = datagram_lines(&socket, done).await;
    assert!(
        !lines.iter().any(|l| l.contains(&long)),
        "the oversized line was sent"
    );
    let victim: Vec<&String> = lines.iter().filter(|l| l.contains("victim")).collect();
    assert!(
        victim
            .iter()
            .all(|l| !l.contains(',') && !l.contains('=') && !l.contains('[') && !l.contains("#x")),
        "{victim:?}"
    );
    let (_, page) = crate::common::http_get(server.http_addr, "/metrics")
        .await
        .unwrap();
    assert!(page.contains("l11_"), "the deep rule was counted: {page}");
    let dropped: u64 = crate::common::metric(&page, "sluice_stats_dropped_total").unwrap_or(0);
    assert!(dropped >= 1, "the oversized line is counted: {page}");
}

/// The lines of the DogStatsD datagrams `socket` receives until `done` holds for them; every
/// datagram within the 1,432-byte bound.
async fn datagram_lines(
    socket: &tokio::net::UdpSocket,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    while !done(&lines) {
        let mut packet = vec![0; 65536];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut packet))
            .await
            .expect("a datagram within 10 s")
            .unwrap();
        assert!(n <= 1432, "a datagram of {n} bytes");
        let text = String::from_utf8(packet[..n].to_vec()).unwrap();
        lines.extend(text.lines().map(str::to_owned));
    }
    lines
}
