//! Shutdown: the delay before the listeners close and the grace for requests in flight.

use std::time::Duration;

use clap::Args;

use super::super::parse::parse_duration;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Shutdown")]
pub struct ShutdownArgs {
    /// Time in-flight requests get to finish after SIGTERM (e.g. 15s, 500ms)
    #[arg(long, env = "SHUTDOWN_GRACE_PERIOD", default_value = "15s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Time Sluice keeps serving after SIGTERM with health checks failing, before it stops
    /// accepting (so load balancers notice first)
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    #[arg(long, env = "KUBERNETES_SERVICE_HOST", hide = true)]
    pub kubernetes_service_host: Option<String>,
}
