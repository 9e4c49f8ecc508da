//! `sluice top`: each rule's top refused keys from one instance's admin port (`GET /top`), or
//! from several merged into one fleet-wide list: a name that resolves to several addresses
//! (a headless Service) asks each. A key an instance does not list counts there at that
//! instance's floor (the most it can have had refused), added to its error, so a merged count
//! is never under the fleet's true count.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::ToolError;
use super::http::encode;

/// Longest wait for one instance's answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Largest answer read from one instance.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;

/// `sluice top` arguments.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// Admin HTTP address of an instance (host:port); repeat, or give a name that resolves to
    /// every instance, for a fleet-wide list
    #[arg(long = "addr", default_value = "127.0.0.1:8080")]
    pub addrs: Vec<String>,
    /// Only this domain's rules
    #[arg(long)]
    pub domain: Option<String>,
    /// Only this rule (its stats key, as /rlconfig lists it)
    #[arg(long)]
    pub rule: Option<String>,
    /// Keys per rule and window
    #[arg(short = 'n', long, default_value = "20")]
    pub n: usize,
    /// Print the merged list as JSON (the shape of GET /top)
    #[arg(long)]
    pub json: bool,
}

/// One key of a merged window.
struct Merged {
    refused: u64,
    error: u64,
}

/// One instance's list of a window: each key's refused hits and error, and its floor.
type Part = (BTreeMap<String, (u64, u64)>, u64);

/// One rule's window, merged over the instances.
#[derive(Default)]
struct Window {
    refused_hits: u64,
    floor: u64,
    /// Per instance that listed the window.
    parts: Vec<Part>,
}

/// Runs `sluice top`.
pub async fn run(args: TopArgs) -> Result<(), ToolError> {
    if args.n == 0 || args.n > 100 {
        return Err(ToolError::Usage("-n must be from 1 to 100".into()));
    }
    let mut targets = Vec::new();
    for addr in &args.addrs {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ToolError::Usage(format!("cannot resolve --addr {addr}: {e}")))?
            .collect();
        targets.extend(resolved);
    }
    targets.sort();
    targets.dedup();
    let mut query = String::from("/top?n=100");
    for (name, value) in [("domain", &args.domain), ("rule", &args.rule)] {
        if let Some(value) = value {
            query.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    // (domain, rule, shadow, window seconds) → window start → merged window.
    let mut rules: BTreeMap<(String, String, bool, String), BTreeMap<u64, Window>> =
        BTreeMap::new();
    for target in &targets {
        let answer = fetch(*target, &query).await?;
        for rule in answer["rules"].as_array().into_iter().flatten() {
            let key = (
                text(&rule["domain"]),
                text(&rule["rule"]),
                rule["shadow"].as_bool().unwrap_or(false),
                rule["window_seconds"].to_string(),
            );
            let windows = rules.entry(key).or_default();
            for w in rule["windows"].as_array().into_iter().flatten() {
                let window = windows.entry(w["start"].as_u64().unwrap_or(0)).or_default();
                window.refused_hits += w["refused_hits"].as_u64().unwrap_or(0);
                let floor = w["floor"].as_u64().unwrap_or(0);
                window.floor += floor;
                let keys = w["keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|k| {
                        let counts = (
                            k["refused"].as_u64().unwrap_or(0),
                            k["error"].as_u64().unwrap_or(0),
                        );
                        (text(&k["key"]), counts)
                    })
                    .collect();
                window.parts.push((keys, floor));
            }
        }
    }
    print(&rules, targets.len(), &args)
}

/// A window's keys merged: each key's refused hits and error over every instance that listed
/// the window, heaviest first.
fn merge(window: &Window, n: usize) -> Vec<(String, Merged)> {
    let mut all: BTreeMap<&str, Merged> = BTreeMap::new();
    for (keys, _) in &window.parts {
        for key in keys.keys() {
            all.entry(key).or_insert(Merged {
                refused: 0,
                error: 0,
            });
        }
    }
    for (key, merged) in &mut all {
        for (keys, floor) in &window.parts {
            let (refused, error) = keys.get(*key).copied().unwrap_or((*floor, *floor));
            merged.refused += refused;
            merged.error += error;
        }
    }
    let mut out: Vec<(String, Merged)> = all.into_iter().map(|(k, m)| (k.to_owned(), m)).collect();
    out.sort_by(|a, b| {
        b.1.refused
            .cmp(&a.1.refused)
            .then(a.1.error.cmp(&b.1.error))
    });
    out.truncate(n);
    out
}

type Rules = BTreeMap<(String, String, bool, String), BTreeMap<u64, Window>>;

fn print(rules: &Rules, instances: usize, args: &TopArgs) -> Result<(), ToolError> {
    let mut out = std::io::stdout().lock();
    let write = |e: std::io::Error| ToolError::Rpc(format!("cannot write: {e}"));
    if args.json {
        let json = serde_json::json!({
            "instances": instances,
            "rules": rules.iter().map(|((domain, rule, shadow, window), windows)| serde_json::json!({
                "domain": domain,
                "rule": rule,
                "shadow": shadow,
                "window_seconds": window.parse::<f64>().unwrap_or(0.0),
                "windows": windows.iter().rev().map(|(start, w)| serde_json::json!({
                    "start": start,
                    "refused_hits": w.refused_hits,
                    "floor": w.floor,
                    "keys": merge(w, args.n).into_iter().map(|(key, m)| serde_json::json!({
                        "key": key, "refused": m.refused, "error": m.error,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        return writeln!(out, "{json}").map_err(write);
    }
    writeln!(out, "{instances} instance(s)").map_err(write)?;
    for ((_, rule, shadow, window), windows) in rules {
        let mode = if *shadow {
            ", shadow: would refuse"
        } else {
            ""
        };
        writeln!(out, "\n{rule} (window {window} s{mode})").map_err(write)?;
        for (start, w) in windows.iter().rev() {
            writeln!(
                out,
                "  window from {start}: {} refused hits; an unlisted key at most {}",
                w.refused_hits, w.floor
            )
            .map_err(write)?;
            for (key, m) in merge(w, args.n) {
                writeln!(out, "  {:>10}  ±{:<8} {key}", m.refused, m.error).map_err(write)?;
            }
        }
    }
    Ok(())
}

/// `GET path` of the admin port at `addr`: its JSON.
async fn fetch(addr: SocketAddr, path: &str) -> Result<Value, ToolError> {
    let failed = |e: String| ToolError::Rpc(format!("{addr}{path}: {e}"));
    let answer = super::http::get(&addr.to_string(), path, ANSWER_LIMIT, MAX_ANSWER_BYTES)
        .await
        .map_err(failed)?;
    if answer.status != 200 {
        return Err(failed(format!(
            "answered {}: {}",
            answer.status,
            answer.body.trim()
        )));
    }
    serde_json::from_str(&answer.body).map_err(|e| failed(format!("not the JSON of /top: {e}")))
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}
