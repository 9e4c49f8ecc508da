//! The command line: `sluice serve | validate | check | explain | counters | top | advise | bench`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::settings::ServeArgs;
use crate::tools::admin::{CountersArgs, ExplainArgs};
use crate::tools::advise::AdviseArgs;
use crate::tools::bench::BenchArgs;
use crate::tools::check::CheckArgs;
use crate::tools::top::TopArgs;

/// Sluice: a global rate limit service for Envoy.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses `args`, reading the environment through `get`, where an empty variable counts
    /// as unset ([`crate::settings::empty_env_is_unset`]).
    pub fn try_parse_with_env(
        args: impl IntoIterator<Item = std::ffi::OsString>,
        get: &dyn Fn(&std::ffi::OsStr) -> Option<std::ffi::OsString>,
    ) -> Result<Self, clap::Error> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let command = crate::settings::empty_env_is_unset(Self::command(), get);
        let mut matches = command.try_get_matches_from(args)?;
        Self::from_arg_matches_mut(&mut matches)
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the RateLimitService (gRPC) and the admin HTTP endpoints
    Serve(Box<ServeArgs>),
    /// Validate a config directory: exit 0 when valid, 1 with every error otherwise
    #[command(mut_args = crate::settings::switch)]
    Validate {
        /// The config directory
        dir: PathBuf,
        /// Merge files that declare the same domain
        #[arg(long, env = "MERGE_DOMAIN_CONFIG", require_equals = true)]
        merge_domain_config: bool,
        /// For the bounds printed of global rules (`scope: global`): the instances' lease period
        #[arg(long, env = "LEASE_PERIOD", default_value = "1s", value_parser = crate::settings::parse_positive_duration)]
        lease_period: std::time::Duration,
        /// For the bounds printed of global rules: the region lease period
        #[arg(long, env = "REGION_LEASE_PERIOD", default_value = "2s", value_parser = crate::settings::parse_positive_duration)]
        region_lease_period: std::time::Duration,
        /// For the bounds printed of global rules: the root deadline, taken as the longest
        /// round trip to the root
        #[arg(long, env = "ROOT_DEADLINE", default_value = "1s", value_parser = crate::settings::parse_positive_duration)]
        root_deadline: std::time::Duration,
    },
    /// Send one request and print the answer (exit 0 OK, 2 OVER_LIMIT, 1 error)
    Check(CheckArgs),
    /// Explain how a request is matched: rule, path, limits and counter keys; charges nothing
    Explain(ExplainArgs),
    /// Read (get) or clear (reset) the counters of one descriptor
    Counters(CountersArgs),
    /// Each rule's top refused keys, from one instance or merged over several
    Top(TopArgs),
    /// A limit for each rule from what Prometheus measured of its ladder of candidate limits
    Advise(AdviseArgs),
    /// Drive load at a server and print requests/s and latency percentiles
    Bench(BenchArgs),
    /// Serve an always-OK RateLimitService: the transport's ceiling for benchmarks
    #[command(hide = true)]
    TrivialServer {
        /// gRPC listen address
        #[arg(long, default_value = "127.0.0.1:8091")]
        grpc_addr: std::net::SocketAddr,
    },
}
