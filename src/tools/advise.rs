//! `sluice advise`: a limit for each rule from what Prometheus recorded of its ladder (see
//! docs/guides/limits-from-measurement.md): the per-key window peaks' percentiles, what each
//! candidate limit would have refused, and a limit above the legitimate peak with headroom,
//! withheld when the data are too thin to trust.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::ToolError;

mod prometheus;
use crate::settings::parse_positive_duration;
use prometheus::{Prometheus, queries, quoted};

/// `sluice advise` arguments.
#[derive(Debug, Clone, Args)]
pub struct AdviseArgs {
    /// Prometheus's URL (http://host:port, with any path prefix it is served under)
    #[arg(long, env = "PROMETHEUS_URL")]
    pub prometheus: String,
    /// Only this domain's rules
    #[arg(long)]
    pub domain: Option<String>,
    /// Only this rule (its stats key)
    #[arg(long)]
    pub rule: Option<String>,
    /// How far back to look
    #[arg(long, default_value = "7d", value_parser = parse_positive_duration)]
    pub range: Duration,
    /// The legitimate peak: this quantile of per-key window peaks
    #[arg(long, default_value = "0.99", value_parser = parse_quantile)]
    pub quantile: f64,
    /// Headroom above the legitimate peak (0.25: a limit 25 % above it)
    #[arg(long, default_value = "0.25", value_parser = parse_headroom)]
    pub headroom: f64,
    /// Fewest key-windows a recommendation is made from (default: 10 / (1 - quantile), so
    /// that 10 key-windows lie above the peak: 1,000 for the p99)
    #[arg(long)]
    pub min_key_windows: Option<u64>,
    /// Shortest range a recommendation is made from: a week holds the weekly peaks
    #[arg(long, default_value = "7d", value_parser = parse_positive_duration)]
    pub min_range: Duration,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

fn parse_quantile(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(q) if q > 0.0 && q < 1.0 => Ok(q),
        _ => Err(format!("'{text}' is not a quantile in (0, 1)")),
    }
}

fn parse_headroom(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(h) if (0.0..=10.0).contains(&h) => Ok(h),
        _ => Err(format!("'{text}' is not a headroom in [0, 10]")),
    }
}

/// A rule's limit as the ladder labels it.
type RuleKey = (String, String, String, String);

/// What Prometheus holds of one limit of a rule over the range.
#[derive(Debug, Default)]
struct RuleData {
    key_windows: f64,
    hits: f64,
    /// Per rung (its ratio): key-windows and hits past it.
    rungs: BTreeMap<Rung, (f64, f64)>,
    limit: Option<f64>,
    limit_changes: f64,
    /// Hits the rule refused while enforcing (over limit, not shadow).
    enforced: f64,
    /// Whether its series reach back the range (or `--min-range`, if shorter).
    reaches: bool,
}

/// A ratio as a map key (ordered; ratios are finite and positive).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rung(f64);
impl Eq for Rung {}
impl PartialOrd for Rung {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Rung {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Runs `sluice advise`.
pub async fn run(args: AdviseArgs) -> Result<(), ToolError> {
    let prometheus = Prometheus::new(&args.prometheus)?;
    let mut matchers = Vec::new();
    if let Some(d) = &args.domain {
        matchers.push(format!("domain={}", quoted(d)));
    }
    if let Some(r) = &args.rule {
        matchers.push(format!("rule={}", quoted(r)));
    }
    let selector = format!("{{{}}}", matchers.join(","));
    let range = format!("{}s", args.range.as_secs().max(1));
    let need = format!("{}s", args.range.min(args.min_range).as_secs().max(1));
    let queries = queries(&selector, &range, &need);
    let mut rules: BTreeMap<RuleKey, RuleData> = BTreeMap::new();
    let mut enforced: BTreeMap<(String, String), f64> = BTreeMap::new();
    let mut progress = std::io::stderr().lock();
    for (i, (what, promql)) in queries.iter().enumerate() {
        let _ = write!(
            progress,
            "\rsluice advise: query {}/{} ({what}) of {}\x1b[K",
            i + 1,
            queries.len(),
            prometheus.url
        );
        let _ = progress.flush();
        let samples = prometheus.query(promql).await;
        let samples = match samples {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(progress);
                return Err(e);
            }
        };
        if *what == "key_windows" && samples.is_empty() {
            let _ = writeln!(progress);
            return Err(ToolError::Rpc(format!(
                "Prometheus at {} has no sluice_rule_key_windows_total{selector} in the last {range}: is it scraping Sluice's /metrics, with the ladder on (LIMIT_LADDER)?\n  query: {promql}",
                prometheus.url
            )));
        }
        fill(what, samples, &mut rules, &mut enforced);
    }
    let _ = write!(progress, "\r\x1b[K");
    let _ = progress.flush();
    for ((domain, rule, _, _), data) in &mut rules {
        data.enforced = enforced
            .get(&(domain.clone(), rule.clone()))
            .copied()
            .unwrap_or(0.0);
    }
    let advice: Vec<Advice> = rules
        .iter()
        .map(|(key, data)| advise(key, data, &args))
        .collect();
    print(&advice, &args, &prometheus.url)
}

/// Records one query's samples (`what` names the query): the enforced refusals by rule, the
/// rest into each limit's data (a limit is known by its key-windows, the first query).
fn fill(
    what: &str,
    samples: Vec<(BTreeMap<String, String>, f64)>,
    rules: &mut BTreeMap<RuleKey, RuleData>,
    enforced: &mut BTreeMap<(String, String), f64>,
) {
    for (labels, value) in samples {
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        if what == "enforced" {
            enforced.insert((label("domain"), label("rule")), value);
            continue;
        }
        let key = (
            label("domain"),
            label("rule"),
            label("window"),
            label("algorithm"),
        );
        if what != "key_windows" && !rules.contains_key(&key) {
            continue;
        }
        let data = rules.entry(key).or_default();
        let rung = || labels.get("le").and_then(|le| le.parse::<f64>().ok());
        match what {
            "key_windows" => data.key_windows = value,
            "hits" => data.hits = value,
            "windows_past" | "hits_past" => {
                let Some(r) = rung().filter(|r| r.is_finite()) else {
                    continue;
                };
                let entry = data.rungs.entry(Rung(r)).or_default();
                if what == "windows_past" {
                    entry.0 = value;
                } else {
                    entry.1 = value;
                }
            }
            "limit" => data.limit = data.limit.or(Some(value)),
            // A token bucket's ratios apply to its burst.
            "burst" => data.limit = Some(value),
            "limit_changes" => data.limit_changes = value,
            "reaches" => data.reaches = true,
            _ => {}
        }
    }
}

/// One limit's advice.
struct Advice {
    key: RuleKey,
    limit: Option<f64>,
    key_windows: f64,
    hits: f64,
    /// p50, p90 and the asked quantile of per-key window peaks, in hits: `Peak::At(v)`, or
    /// above the ladder's top, or past a limit that was enforcing (unknown).
    peaks: Vec<(f64, Peak)>,
    /// Per rung: ratio, the candidate limit, key-windows and hits it would have refused.
    candidates: Vec<(f64, f64, f64, f64)>,
    /// The limit advised, with what it would have refused at most (hits, key-windows).
    recommended: Option<(f64, f64, f64)>,
    /// Why no recommendation is made (empty: one is).
    warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Peak {
    At(f64),
    AboveLadder(f64),
    PastEnforcedLimit(f64),
}

impl Peak {
    fn text(self) -> String {
        match self {
            Peak::At(v) => format!("{}", v.round()),
            Peak::AboveLadder(v) => format!("> {}", v.round()),
            Peak::PastEnforcedLimit(v) => format!(">= {} (enforced)", v.round()),
        }
    }

    fn json(self) -> Value {
        match self {
            Peak::At(v) => json!({"at": v.round()}),
            Peak::AboveLadder(v) => json!({"above": v.round()}),
            Peak::PastEnforcedLimit(v) => json!({"at_least": v.round(), "enforced": true}),
        }
    }
}

/// The `q` quantile of per-key window peaks, in hits, from the ladder (linear between rungs,
/// as Prometheus's `histogram_quantile` reads buckets).
fn quantile(data: &RuleData, limit: f64, q: f64) -> Peak {
    let total = data.key_windows;
    let mut below = (0.0, 0.0); // (ratio, share at or under it)
    for (&Rung(r), &(past, _)) in &data.rungs {
        let share = if total > 0.0 {
            ((total - past) / total).clamp(0.0, 1.0)
        } else {
            1.0
        };
        if share >= q {
            if data.enforced > 0.0 && r >= 1.0 {
                return Peak::PastEnforcedLimit(limit);
            }
            let (r0, s0) = below;
            let at = if share > s0 {
                r0 + (r - r0) * (q - s0) / (share - s0)
            } else {
                r
            };
            return Peak::At(at * limit);
        }
        below = (r, share);
    }
    let top = data.rungs.keys().next_back().map_or(1.0, |r| r.0);
    if data.enforced > 0.0 && top >= 1.0 {
        return Peak::PastEnforcedLimit(limit);
    }
    Peak::AboveLadder(top * limit)
}

fn advise(key: &RuleKey, data: &RuleData, args: &AdviseArgs) -> Advice {
    let limit = data.limit.filter(|l| *l > 0.0);
    let mut warnings = Vec::new();
    let Some(l) = limit else {
        return Advice {
            key: key.clone(),
            limit: None,
            key_windows: data.key_windows,
            hits: data.hits,
            peaks: Vec::new(),
            candidates: Vec::new(),
            recommended: None,
            warnings: vec!["no sluice_rule_limit for it: its limit is not known".into()],
        };
    };
    let peaks: Vec<(f64, Peak)> = [0.5, 0.9, args.quantile]
        .into_iter()
        .map(|q| (q, quantile(data, l, q)))
        .collect();
    let candidates = data
        .rungs
        .iter()
        .map(|(&Rung(r), &(windows, hits))| (r, (r * l).floor(), windows.round(), hits.round()))
        .collect();
    let wanted = args
        .min_key_windows
        .unwrap_or_else(|| (10.0 / (1.0 - args.quantile)).ceil() as u64);
    if data.key_windows.round() < wanted as f64 {
        warnings.push(format!(
            "only {} key-windows: too few to read a p{} from (at least {wanted}; --min-key-windows)",
            data.key_windows.round(),
            args.quantile * 100.0
        ));
    }
    if args.range < args.min_range {
        warnings.push(format!(
            "the range, {}, is shorter than {} (--min-range): peaks that come once a week may be missing",
            human(args.range.as_secs_f64()),
            human(args.min_range.as_secs_f64())
        ));
    } else if !data.reaches {
        warnings.push(format!(
            "the data do not reach back {} (--min-range {}): peaks that come once a week may be missing",
            human(args.range.as_secs_f64()),
            human(args.min_range.as_secs_f64())
        ));
    }
    if data.enforced > 0.0 {
        warnings.push(format!(
            "it refused {} hits while enforcing: nothing above its limit was measured (measure it in shadow mode)",
            data.enforced.round()
        ));
    }
    if data.limit_changes > 0.0 {
        warnings.push(
            "its limit changed within the range: the ladder mixes ratios of two limits".into(),
        );
    }
    let recommended = match peaks.last().map(|p| p.1) {
        Some(Peak::At(peak)) => {
            let advised = (peak * (1.0 + args.headroom)).ceil().max(1.0);
            // What it would have refused, at most: the counts at the rung at or under it.
            let under = data
                .rungs
                .range(..=Rung(advised / l))
                .next_back()
                .map_or((data.hits, data.key_windows), |(_, &(w, h))| (h, w));
            Some((advised, under.0.round(), under.1.round()))
        }
        Some(Peak::AboveLadder(_)) => {
            warnings.push(format!(
                "its p{} is above the ladder's top: widen it (LIMIT_LADDER_TO, or the rule's ladder:)",
                args.quantile * 100.0
            ));
            None
        }
        _ => None,
    };
    Advice {
        key: key.clone(),
        limit,
        key_windows: data.key_windows,
        hits: data.hits,
        peaks,
        candidates,
        recommended,
        warnings,
    }
}

fn human(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3_600 => format!("{:.1}h", seconds / 3_600.0),
        s if s >= 60 => format!("{:.1}m", seconds / 60.0),
        s => format!("{s}s"),
    }
}

fn print(advice: &[Advice], args: &AdviseArgs, url: &str) -> Result<(), ToolError> {
    let text = if args.json {
        format!("{}\n", json_of(advice, args, url))
    } else {
        let mut text = format!(
            "From {url}, the last {}; the legitimate peak is the p{} of per-key window peaks, the headroom {} %.\n",
            human(args.range.as_secs_f64()),
            args.quantile * 100.0,
            (args.headroom * 100.0).round()
        );
        for a in advice {
            text.push_str(&text_of(a));
        }
        text
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| ToolError::Rpc(format!("cannot write: {e}")))
}

/// The advice as `--json` prints it.
fn json_of(advice: &[Advice], args: &AdviseArgs, url: &str) -> Value {
    let rules: Vec<Value> = advice
        .iter()
        .map(|a| {
            let (domain, rule, window, algorithm) = &a.key;
            json!({
                "domain": domain,
                "rule": rule,
                "window_seconds": window.trim_end_matches('s').parse::<f64>().unwrap_or(0.0),
                "algorithm": algorithm,
                "limit": a.limit,
                "key_windows": a.key_windows.round(),
                "hits": a.hits.round(),
                "peaks": a.peaks.iter().map(|(q, p)| json!({"quantile": q, "peak": p.json()})).collect::<Vec<_>>(),
                "candidates": a.candidates.iter().map(|&(r, limit, windows, hits)| json!({
                    "ratio": r, "limit": limit, "key_windows_refused": windows, "hits_refused": hits,
                })).collect::<Vec<_>>(),
                "recommendation": a.recommended.map(|(limit, hits, windows)| json!({
                    "limit": limit, "hits_refused_at_most": hits, "key_windows_refused_at_most": windows,
                    "trusted": a.warnings.is_empty(),
                })),
                "warnings": a.warnings,
            })
        })
        .collect();
    json!({
        "prometheus": url,
        "range_seconds": args.range.as_secs(),
        "quantile": args.quantile,
        "headroom": args.headroom,
        "rules": rules,
    })
}

/// One limit's advice as text.
fn text_of(a: &Advice) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let (domain, rule, window, algorithm) = &a.key;
    let limit = a.limit.map_or("unknown".into(), |l| format!("{l}"));
    let _ = writeln!(
        out,
        "\n{rule} (domain {domain}, {algorithm}, window {window})"
    );
    let _ = writeln!(out, "  configured limit   {limit}");
    let _ = writeln!(
        out,
        "  key-windows seen   {}   hits measured {}",
        a.key_windows.round(),
        a.hits.round()
    );
    if !a.peaks.is_empty() {
        let peaks: Vec<String> = a
            .peaks
            .iter()
            .map(|(q, p)| format!("p{} {}", q * 100.0, p.text()))
            .collect();
        let _ = writeln!(
            out,
            "  per-key peaks      {}   (hits in a window; within one rung of the ladder)",
            peaks.join("  ")
        );
    }
    let shown = shown_candidates(a);
    if !shown.is_empty() {
        let _ = writeln!(
            out,
            "  {:>10}  {:>8}  {:>14}  {:>19}",
            "candidate", "x limit", "hits refused", "key-windows refused"
        );
        for &(r, limit, windows, hits) in shown {
            let r = (r * 1000.0).round() / 1000.0;
            let mark = if (r - 1.0).abs() < 1e-9 {
                "  <- configured"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {limit:>10}  {r:>8}  {hits:>14}  {windows:>19}{mark}"
            );
        }
    }
    for w in &a.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }
    let _ = match (a.recommended, a.warnings.is_empty()) {
        (Some((limit, hits, windows)), true) => writeln!(
            out,
            "  recommended limit  {limit}   (would have refused at most {hits} hits from {windows} key-windows)"
        ),
        (Some((limit, _, _)), false) => writeln!(
            out,
            "  recommended limit  none: the data are too thin (above); tentatively {limit}"
        ),
        (None, _) => writeln!(out, "  recommended limit  none (above)"),
    };
    out
}

/// The candidates worth a row: one per candidate limit (small limits repeat across rungs),
/// from the last that refuses every key-window through the first that refuses none.
fn shown_candidates(a: &Advice) -> Vec<&(f64, f64, f64, f64)> {
    let mut shown: Vec<&(f64, f64, f64, f64)> = Vec::new();
    for c in &a.candidates {
        if c.1 < 1.0 || shown.last().is_some_and(|last| last.1 == c.1) {
            continue;
        }
        if c.2 >= a.key_windows && shown.last().is_some_and(|last| last.2 >= a.key_windows) {
            shown.pop();
        }
        shown.push(c);
        if c.2 == 0.0 && c.0 >= 1.0 {
            break;
        }
    }
    shown
}
