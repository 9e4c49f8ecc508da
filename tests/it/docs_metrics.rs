//! docs/reference/metrics.md is rendered from what the code registers: a server runs here
//! with every optional exporter on (statsd, tracing), and the metrics kit's catalog
//! (`sluice::metrics::catalog`, every family registered in this process, with its type,
//! help and labels) becomes the page. A family added without the page renders differently
//! and this test fails: `UPDATE_DOCS=1 cargo test --test it docs_` renders it again.

use std::fmt::Write as _;
use std::time::Duration;

use sluice::metrics::statsd::{StatsdFormat, StatsdSettings};
use sluice::settings::Settings;
use sluice::traces::OtlpProtocol;

use crate::common::{TestServer, config_dir, eventually_within};

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn metrics_page() -> String {
    let mut out = String::from(
        "# Metrics reference\n\n\
         Generated from the code: every metric family Sluice registers (with statsd and tracing\n\
         on), its type, labels and help. Do not edit by hand: `UPDATE_DOCS=1 cargo test --test\n\
         it docs_` renders it again. What the series tell an operator, and the reference's\n\
         names, are in [observability](../operations/observability.md).\n\n\
         | name | type | labels | help |\n|---|---|---|---|\n",
    );
    for (name, family) in sluice::metrics::catalog() {
        let labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} |",
            family.kind,
            labels.join(", "),
            cell(&family.help)
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_reference_is_what_the_code_registers() {
    let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut settings = Settings::for_tests(config_dir("docs-metrics", &[("d.yaml", CONFIG)]));
    settings.statsd = Some(StatsdSettings {
        format: StatsdFormat::Statsd,
        host: "127.0.0.1".into(),
        port: statsd.local_addr().unwrap().port(),
        extra_tags: Vec::new(),
        mogrifiers: Vec::new(),
        flush_interval: Duration::from_millis(100),
    });
    // Nothing listens there: the exporter registers its counters all the same.
    settings.tracing = Some(crate::common::otlp::tracing_settings(
        OtlpProtocol::Http,
        "http://127.0.0.1:9/v1/traces".into(),
    ));
    let _server = TestServer::start_with(settings).await;
    // The exporters register as their tasks start.
    eventually_within(
        Duration::from_secs(10),
        "the exporters' metrics",
        || async {
            let catalog = sluice::metrics::catalog();
            catalog.contains_key("sluice_stats_dropped_total")
                && catalog.contains_key("sluice_trace_spans_exported_total")
        },
    )
    .await;
    crate::docs_reference::check("docs/reference/metrics.md", &metrics_page());
}
