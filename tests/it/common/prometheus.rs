//! A real Prometheus (Debian's `prometheus` package; `scripts/test` installs it) scraping
//! Sluice instances every second, in a temporary directory, on a free port; killed on drop.

use std::process::{Child, Command, Stdio};

use super::redis::free_port;
use super::temp_dir;

/// One `prometheus` process.
pub struct PrometheusServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    port: u16,
}

impl PrometheusServer {
    /// Scrapes `/metrics` of each of `targets` (`host:port`) every second, as job `sluice`;
    /// waits until Prometheus is ready and has scraped every target once.
    pub async fn scraping(targets: &[&str]) -> Self {
        Self::scraping_with_rules(targets, None).await
    }

    /// [`PrometheusServer::scraping`], evaluating the rule file at `rules` (a path) every
    /// second.
    pub async fn scraping_with_rules(targets: &[&str], rules: Option<&std::path::Path>) -> Self {
        let dir = temp_dir("prometheus");
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let rule_files = rules.map_or(String::new(), |p| {
            format!("rule_files:\n  - '{}'\n", p.display())
        });
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rule_files}scrape_configs:\n  - job_name: sluice\n    metrics_path: /metrics\n    static_configs:\n      - targets: [{list}]\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus; scripts/test installs it)");
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let want = targets.len();
        super::eventually_within(
            std::time::Duration::from_secs(30),
            "Prometheus ready, every target scraped",
            || async {
                server
                    .query("sum(up)")
                    .await
                    .is_some_and(|v| v as usize == want)
            },
        )
        .await;
        server
    }

    /// The value of an instant query whose result is one sample; `None` otherwise (not ready,
    /// an error, no data).
    pub async fn query(&self, promql: &str) -> Option<f64> {
        match self.instant(promql).await.ok()?.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// An instant query's result vector, or the error Prometheus gave.
    pub async fn instant(&self, promql: &str) -> Result<Vec<serde_json::Value>, String> {
        let body = self
            .get(&format!("/api/v1/query?query={}", encode(promql)))
            .await?;
        let json: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if json["status"] != "success" {
            return Err(json["error"].to_string());
        }
        Ok(json["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The body of `GET path` of Prometheus's HTTP API (any status).
    pub async fn get(&self, path: &str) -> Result<String, String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let (_, body) = super::http_get(addr, path)
            .await
            .map_err(|e| e.to_string())?;
        Ok(body)
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
