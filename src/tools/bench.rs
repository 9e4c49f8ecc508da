//! `sluice bench`: a closed-loop load generator over gRPC.
//!
//! `--concurrency` workers each send one request at a time over `--connections` HTTP/2
//! connections, for `--duration` after a `--warmup`. Each request carries `--descriptors`
//! descriptors `(key, k<N>)` with N drawn from `--keys` distinct values by a fixed-seed
//! generator, so runs are repeatable. Prints requests/s and latency percentiles.
//!
//! One thread per core (at most one per connection) runs its share of the connections and
//! their workers on a single-threaded runtime, as h2load does: no request crosses threads.
//! With one multi-threaded runtime instead, this client cost 9.5 µs of CPU per request
//! against the Redis store (7.7 now), and its own wake-ups showed as a 4 ms p99 that the
//! server did not have (docs/performance.md).

use std::time::{Duration, Instant};

use clap::Args;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{ClientTls, ToolError, connect};
use crate::settings::parse_duration;

/// `sluice bench` arguments.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// gRPC address of the rate limit service
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Domain of the requests
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// Descriptor entry key
    #[arg(long, default_value = "bench_key")]
    pub key: String,
    /// Distinct descriptor values (key cardinality)
    #[arg(long, default_value = "1")]
    pub keys: u64,
    /// Descriptors per request
    #[arg(long, default_value = "1")]
    pub descriptors: usize,
    /// Hits each request charges (its `hits_addend`; e.g. a usage report of 100 tokens
    /// with `--key bench_budget`)
    #[arg(long, default_value = "1")]
    pub hits: u32,
    /// Requests in flight at once
    #[arg(long, default_value = "64")]
    pub concurrency: usize,
    /// HTTP/2 connections
    #[arg(long, default_value = "4")]
    pub connections: usize,
    /// Measured duration (e.g. 10s)
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before the measurement
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Walk the key values in order instead of drawing them at random (each value once per
    /// round, e.g. to fill a store with exactly --keys counters)
    #[arg(long)]
    pub sequential: bool,
    /// RLQS streams that re-report `--rlqs-buckets` buckets of `--domain` and `--key` as
    /// fast as the server reads them, meanwhile (each on a connection of its own)
    #[arg(long, default_value = "0")]
    pub rlqs_flood: usize,
    /// Buckets in each report of `--rlqs-flood`
    #[arg(long, default_value = "10000")]
    pub rlqs_buckets: usize,
    /// Print the result as one JSON object (for scripts) instead of text
    #[arg(long)]
    pub json: bool,
    /// TLS to the server
    #[command(flatten)]
    pub tls: ClientTls,
}

/// What a run measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Requests answered within the measured period.
    pub requests: u64,
    /// Of those, answered OVER_LIMIT.
    pub over_limit: u64,
    /// Requests that failed (gRPC errors).
    pub errors: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Latency percentiles in microseconds: p50, p99, p99.9, max.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Slowest request.
    pub max: u64,
    /// RLQS reports the flood sent (`--rlqs-flood`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlqs_reports: Option<u64>,
}

impl Report {
    /// Requests answered per second.
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// The report as one JSON object: the fields above (latencies in microseconds) and
    /// `per_second`.
    pub fn to_json(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert("per_second".into(), serde_json::json!(self.per_second()));
        }
        value.to_string()
    }
}

/// What one worker measured: latencies (µs), over-limit answers, errors.
type Measured = (Vec<u32>, u64, u64);

/// Runs the load and returns the measurements.
///
/// The connections are spread over one thread per core, each running its connections and
/// their workers on a single-threaded runtime: a request's hops (worker, channel, HTTP/2
/// connection) then never cross threads, which keeps the load generator's own cost per
/// request low and leaves the cores to the server under test.
pub async fn run(args: BenchArgs) -> Result<Report, ToolError> {
    if args.keys == 0 || args.descriptors == 0 || args.concurrency == 0 || args.connections == 0 {
        return Err(ToolError::Usage(
            "--keys, --descriptors, --concurrency and --connections must be at least 1".into(),
        ));
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(args.connections);
    let flood = flood(&args);
    let start = Instant::now() + args.warmup;
    let end = start + args.duration;
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let args = args.clone();
            std::thread::spawn(move || -> Result<Vec<Measured>, ToolError> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| ToolError::Rpc(format!("cannot start a bench thread: {e}")))?;
                runtime.block_on(load(args, thread, threads, start, end))
            })
        })
        .collect();
    let joined = tokio::task::spawn_blocking(move || {
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ToolError::Rpc("a bench thread panicked".into())))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ToolError::Rpc(format!("bench threads failed: {e}")))?;
    let mut measured = Vec::with_capacity(args.concurrency);
    for result in joined {
        measured.extend(result?);
    }
    let rlqs_reports = match flood {
        Some(flood) => Some(flood.finish().await?),
        None => None,
    };
    let mut all = Vec::new();
    let mut report = Report {
        seconds: args.duration.as_secs_f64(),
        rlqs_reports,
        ..Report::default()
    };
    for (latencies, over, errors) in measured {
        all.extend(latencies);
        report.over_limit += over;
        report.errors += errors;
    }
    all.sort_unstable();
    report.requests = all.len() as u64;
    let pct = |p: f64| -> u64 {
        if all.is_empty() {
            return 0;
        }
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        u64::from(all[i])
    };
    report.p50 = pct(0.50);
    report.p99 = pct(0.99);
    report.p999 = pct(0.999);
    report.max = all.last().copied().map_or(0, u64::from);
    Ok(report)
}

/// The RLQS flood `--rlqs-flood` asks for, started.
fn flood(args: &BenchArgs) -> Option<super::flood::Flood> {
    (args.rlqs_flood > 0).then(|| {
        super::flood::Flood::start(
            &args.addr,
            &args.tls,
            (&args.domain, &args.key),
            args.rlqs_flood,
            args.rlqs_buckets,
        )
    })
}

/// One thread's share: connections `thread`, `thread + threads`, ... and the workers that
/// use them (worker w uses connection w mod --connections).
async fn load(
    args: BenchArgs,
    thread: usize,
    threads: usize,
    start: Instant,
    end: Instant,
) -> Result<Vec<Measured>, ToolError> {
    let mut clients = Vec::new();
    for connection in (thread..args.connections).step_by(threads) {
        clients.push((connection, connect(&args.addr, &args.tls).await?));
    }
    let mut workers = Vec::new();
    for (connection, client) in &clients {
        for worker in (*connection..args.concurrency).step_by(args.connections) {
            let client = client.clone();
            let args = args.clone();
            workers.push(tokio::spawn(work(client, args, worker, start, end)));
        }
    }
    let mut measured = Vec::with_capacity(workers.len());
    for worker in workers {
        measured.push(
            worker
                .await
                .map_err(|e| ToolError::Rpc(format!("bench worker failed: {e}")))?,
        );
    }
    Ok(measured)
}

/// One worker: one request at a time until `end`, measuring those sent from `start`.
async fn work(
    mut client: RateLimitServiceClient<Channel>,
    args: BenchArgs,
    worker: usize,
    start: Instant,
    end: Instant,
) -> Measured {
    let mut rng = XorShift::new(0x5eed_0000 + worker as u64);
    // Sequential: worker w takes values w, w + C, w + 2C, ...
    let mut next_value = worker as u64;
    let mut pick = move |keys: u64, sequential: bool, concurrency: u64| {
        if sequential {
            let v = next_value % keys;
            next_value += concurrency;
            v
        } else {
            rng.next() % keys
        }
    };
    let mut latencies = Vec::with_capacity(1 << 16);
    let (mut over, mut errors) = (0u64, 0u64);
    loop {
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: (0..args.descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: args.key.clone(),
                        value: format!(
                            "k{}",
                            pick(args.keys, args.sequential, args.concurrency as u64)
                        ),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: args.hits,
        };
        let sent = Instant::now();
        let result = client.should_rate_limit(request).await;
        let done = Instant::now();
        if done >= end {
            break;
        }
        if sent < start {
            continue;
        }
        match result {
            Ok(r) => {
                latencies.push(done.duration_since(sent).as_micros() as u32);
                over += u64::from(r.get_ref().overall_code == Code::OverLimit as i32);
            }
            Err(_) => errors += 1,
        }
    }
    (latencies, over, errors)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |us: u64| us as f64 / 1000.0;
        writeln!(
            f,
            "requests: {} in {:.1}s = {:.0} req/s ({} over limit, {} errors)",
            self.requests,
            self.seconds,
            self.per_second(),
            self.over_limit,
            self.errors
        )?;
        write!(
            f,
            "latency: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max)
        )?;
        if let Some(reports) = self.rlqs_reports {
            write!(f, "\nrlqs flood: {reports} reports sent")?;
        }
        Ok(())
    }
}

/// A tiny deterministic generator: benches must be repeatable, not cryptographic.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
