//! The `sluice` binary: parse the command line, set up logging, run, map errors to exit codes.

use std::process::ExitCode;

use std::io::Write as _;

use sluice::cli::{Cli, Command};
use sluice::tools::{ToolError, admin, bench, check, trivial};
use sluice::{app, config, settings, shutdown};

/// A faster allocator than glibc's for this many small, short-lived, cross-thread
/// allocations (protobuf messages, futures): see docs/performance.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for bad settings or config (BSD `EX_USAGE`).
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    match runtime() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Tokio's multi-threaded runtime, one worker per core. Built with `--cfg tokio_unstable`
/// (as `.cargo/config.toml` does), it runs without the LIFO slot: a task woken by another
/// then waits its turn instead of running next, so an HTTP/2 connection flushes the answers
/// of many finished requests in one write instead of one write each (-15 % CPU per request,
/// -35 % p99 in docs/performance.md).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

/// The arguments, with `serve` put first when the binary runs under the reference's name
/// (`/bin/ratelimit`, as Envoy Gateway's Deployment starts it) without a subcommand.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|name| name.to_string_lossy().into_owned());
    if invoked_as.as_deref() == Some("ratelimit") {
        use clap::CommandFactory as _;
        let first = args.get(1).and_then(|a| a.to_str());
        let subcommand = first.is_some_and(|first| {
            Cli::command().find_subcommand(first).is_some()
                || ["help", "--help", "-h", "--version", "-V"].contains(&first)
        });
        if !subcommand {
            args.insert(1, "serve".into());
        }
        // The reference's defaults where Sluice's would change what Envoy does.
        if args.get(1).is_some_and(|a| a == "serve") {
            args.insert(2, "--as-reference".into());
        }
    }
    args
}

async fn run() -> ExitCode {
    let cli = match Cli::try_parse_with_env(arguments(), &|name| std::env::var_os(name)) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}", usage_error(&e));
            return ExitCode::from(EX_USAGE);
        }
    };
    match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Validate {
            dir,
            merge_domain_config,
            lease_period,
            region_lease_period,
            root_deadline,
        } => {
            let region = sluice::store::RegionOptions {
                period: region_lease_period,
                lease_period,
                root_deadline,
                ..Default::default()
            };
            validate(&dir, merge_domain_config, &region)
        }
        Command::Check(args) => match check::run(args).await {
            Ok(check::Answer::Ok) => ExitCode::SUCCESS,
            Ok(check::Answer::OverLimit) => ExitCode::from(2),
            Err(e) => tool_error(e),
        },
        Command::Explain(args) => match admin::explain(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => tool_error(e),
        },
        Command::Counters(args) => match admin::counters(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => tool_error(e),
        },
        Command::Top(args) => match sluice::tools::top::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => tool_error(e),
        },
        Command::Advise(args) => match sluice::tools::advise::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => tool_error(e),
        },
        Command::Bench(args) => match bench::run(args.clone()).await {
            Ok(report) if args.json => {
                let _ = writeln!(std::io::stdout(), "{}", report.to_json());
                ExitCode::SUCCESS
            }
            Ok(report) => {
                let _ = writeln!(std::io::stdout(), "{report}");
                ExitCode::SUCCESS
            }
            Err(e) => tool_error(e),
        },
        Command::TrivialServer { grpc_addr } => {
            let listener = match tokio::net::TcpListener::bind(grpc_addr).await {
                Ok(l) => l,
                Err(e) => {
                    return tool_error(ToolError::Usage(format!(
                        "cannot listen on {grpc_addr}: {e}"
                    )));
                }
            };
            match trivial::serve(listener, shutdown::signal()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => tool_error(ToolError::Rpc(e.to_string())),
            }
        }
    }
}

/// The first line of clap's message; when the bad value came from an environment variable
/// (as in a Kubernetes manifest), the variable is named too, not only the flag.
fn usage_error(e: &clap::Error) -> String {
    use clap::CommandFactory as _;
    use clap::error::{ContextKind, ContextValue};
    let first = e.to_string().lines().next().unwrap_or_default().to_owned();
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return first;
    };
    // e.g. "--grpc-port <GRPC_PORT>" or "--shadow-mode[=<BOOL>]"
    let long = arg
        .trim_start_matches("--")
        .split(['[', ' ', '='])
        .next()
        .unwrap_or_default();
    let given_as_flag =
        std::env::args().any(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
    let command = Cli::command();
    let env = command
        .get_subcommands()
        .chain(std::iter::once(&command))
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .filter(|var| !given_as_flag && std::env::var_os(var).is_some());
    match env {
        Some(var) => format!(
            "{first} (from the environment variable {})",
            var.to_string_lossy()
        ),
        None => first,
    }
}

async fn serve(args: settings::ServeArgs) -> ExitCode {
    let settings = match args.into_settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    sluice::logging::init(&settings.log);
    settings::reference::audit(|name| std::env::var(name).ok()).log();
    let prepared = match app::prepare(settings.clone()) {
        Ok(p) => p,
        Err(app::AppError::Config(errors)) => {
            errors.iter().for_each(|e| eprintln!("{e}"));
            return ExitCode::from(EX_USAGE);
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let listeners = match app::Listeners::bind(&settings).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    // Registered now, so the first signal counts toward the second.
    let second = shutdown::signals(2);
    let prepared = prepared.hurry_on(async move {
        let name = second.await;
        tracing::info!("second {name}: skipping the rest of the shutdown delay");
    });
    match prepared.serve(listeners, shutdown::signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

fn tool_error(e: ToolError) -> ExitCode {
    eprintln!("{e}");
    match e {
        ToolError::Usage(_) => ExitCode::from(EX_USAGE),
        ToolError::Rpc(_) => ExitCode::FAILURE,
    }
}

/// `sluice validate`: every error, or the warnings, each global limit's bounds (with the
/// periods of `region`) and "ok".
fn validate(
    dir: &std::path::Path,
    merge_domains: bool,
    region: &sluice::store::RegionOptions,
) -> ExitCode {
    let options = config::LoadOptions { merge_domains };
    match config::load_dir_within(dir, options, sluice::source::LOAD_DEADLINE) {
        Ok(loaded) => {
            for warning in loaded.policy.warnings() {
                eprintln!("warning: {warning}");
            }
            for line in global_bounds(&loaded.policy, region) {
                let _ = writeln!(std::io::stdout(), "{line}");
            }
            let _ = writeln!(std::io::stdout(), "all rate limit configs ok");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            errors.iter().for_each(|e| eprintln!("{e}"));
            ExitCode::FAILURE
        }
    }
}

/// A line per limit of each global rule (`scope: global`): its over bound by failure mode,
/// and what a region holds at most at the limit's own rate with the periods given (the
/// under bound's term per region).
fn global_bounds(
    policy: &sluice::policy::Policy,
    region: &sluice::store::RegionOptions,
) -> Vec<String> {
    use sluice::store::FailureMode;
    let round_trip = region.root_deadline.as_micros().min(u64::MAX as u128) as u64;
    let mut lines = Vec::new();
    for (domain, rule) in policy.rules_by_domain() {
        let sluice::policy::RuleLimit::Limited(limits) = &rule.limit else {
            continue;
        };
        if !rule.global {
            continue;
        }
        let mode = rule.failure_mode.or(policy.failure_mode_of(domain));
        for limit in limits {
            let requests = limit.requests_per_unit;
            let over = match mode {
                Some(FailureMode::Deny) => "never over".to_owned(),
                Some(FailureMode::Local) => format!(
                    "never over while the regions reach the root; a cut region admits its share (PARTITION_SHARE, one over the regions by default) of {requests} per window on top"
                ),
                Some(FailureMode::Envoy) => {
                    "never over while the regions reach the root; then Envoy's failure_mode_deny decides".to_owned()
                }
                Some(FailureMode::Allow) | None => {
                    "never over while the regions reach the root; a cut region fails open (allow) once its pool ends".to_owned()
                }
            };
            let held = sluice::store::region::held_at_own_rate(
                (requests, limit.capacity().max(requests)),
                limit.window(),
                region,
                round_trip,
            );
            let periods = format!(
                "with LEASE_PERIOD {:?}, REGION_LEASE_PERIOD {:?} and round trips up to ROOT_DEADLINE {:?}",
                region.lease_period, region.period, region.root_deadline,
            );
            let per = limit.window_name().to_lowercase();
            if limit.algorithm == sluice::algorithm::Algorithm::TokenBucket {
                let burst = limit.capacity();
                // Regions sharing its refill each take ⌊R / 2n⌋ every quarter region lease
                // period: the root keeps about half a period's refill.
                let kept = (requests as f64 * region.period.as_secs_f64()
                    / (2.0 * limit.window() as f64 / 1e6))
                    .ceil()
                    .min(burst as f64);
                lines.push(format!(
                    "{}: scope: global, token bucket of {requests} per {per}, burst {burst}: {over} (at most the burst plus the rate over any time); a region holds up to about {held} tokens at this rate, and the root, the pools and the blocks never hold more than the burst together: with more regions busy than burst / {held}, they share it and admit less, the root keeping about {kept} tokens while their demand is above the rate ({periods})",
                    rule.stats_key,
                ));
                continue;
            }
            lines.push(format!(
                "{}: scope: global, {requests} per {per}: {over}; a region holds at most about {held} units unused at this limit's own rate ({:.1} % of it; under bound: the regions' sum), {periods}",
                rule.stats_key,
                held as f64 * 100.0 / requests.max(1) as f64,
            ));
        }
    }
    lines
}
