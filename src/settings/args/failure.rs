//! The failure policy: the store call's deadline, the circuit breaker and what answers
//! while the store fails.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use clap::Args;

use super::super::parse::{parse_count, parse_duration, parse_positive_duration};
use crate::store::FailureMode;
use crate::store::resilient::ResilienceOptions;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Failure policy")]
pub struct FailureArgs {
    /// Deadline of every store call; past it the failure mode answers
    ///
    /// Keep it below Envoy's 20 ms default timeout; it is shortened further to the caller's
    /// grpc-timeout. A call past it goes on in the background and its hits still count.
    #[arg(long, env = "REDIS_DEADLINE", default_value = "15ms", value_parser = parse_positive_duration)]
    pub redis_deadline: Duration,

    /// Consecutive store failures that open the circuit breaker
    #[arg(long, env = "REDIS_BREAKER_FAILURES", default_value = "3", value_parser = parse_count::<NonZeroU32>)]
    redis_breaker_failures: NonZeroU32,

    /// Time the open breaker waits before trying the store again
    #[arg(long, env = "REDIS_BREAKER_COOLDOWN", default_value = "250ms", value_parser = parse_duration)]
    redis_breaker_cooldown: Duration,

    /// Failure mode of rules and domains that declare none: allow (fail open), deny (fail
    /// closed), local (count in this instance's memory) or envoy (a prompt gRPC UNAVAILABLE,
    /// which Envoy's failure_mode_deny decides, as the reference answers) [default: allow;
    /// envoy when run as /bin/ratelimit, the reference's name]
    #[arg(long, env = "FAILURE_MODE", value_enum, ignore_case = true)]
    pub failure_mode: Option<FailureMode>,

    /// Set when the binary runs under the reference's name (`/bin/ratelimit`): the
    /// reference's defaults where Sluice's would change what Envoy does (FAILURE_MODE envoy)
    #[arg(long, hide = true)]
    pub as_reference: bool,

    /// Report unhealthy (/healthcheck, /ready, gRPC health) while the store does not answer
    /// (its circuit breaker is open), so that an orchestrator can move traffic elsewhere
    #[arg(long, env = "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")]
    pub redis_health_check_active_connection: bool,

    /// At start-up, retry the store for at most this long before serving (first wait
    /// REDIS_STARTUP_INITIAL_INTERVAL, doubling up to REDIS_STARTUP_MAX_INTERVAL); 0: one
    /// attempt of at most 5 s, then serve by the failure mode
    #[arg(long, env = "REDIS_STARTUP_MAX_ELAPSED_TIME", default_value = "0", value_parser = parse_duration)]
    pub redis_startup_max_elapsed_time: Duration,

    /// First wait between start-up attempts
    #[arg(long, env = "REDIS_STARTUP_INITIAL_INTERVAL", default_value = "1s", value_parser = parse_positive_duration)]
    pub redis_startup_initial_interval: Duration,

    /// Longest wait between start-up attempts
    #[arg(long, env = "REDIS_STARTUP_MAX_INTERVAL", default_value = "30s", value_parser = parse_positive_duration)]
    pub redis_startup_max_interval: Duration,

    /// Sluice instances sharing the limits; `failure_mode: local` divides each limit by it
    #[arg(long, env = "FAILURE_MODE_LOCAL_INSTANCES", default_value = "1", value_parser = parse_count::<NonZeroU64>)]
    failure_mode_local_instances: NonZeroU64,
}

impl FailureArgs {
    /// The failure mode of rules that declare none: the one set, else `envoy` under the
    /// reference's name (the reference's answer to a store failure is a gRPC error, which
    /// Envoy's `failure_mode_deny` decides), else `allow`.
    pub fn default_failure_mode(&self) -> FailureMode {
        self.failure_mode.unwrap_or(if self.as_reference {
            FailureMode::Envoy
        } else {
            FailureMode::Allow
        })
    }

    pub(super) fn resilience(&self) -> ResilienceOptions {
        ResilienceOptions {
            deadline: self.redis_deadline,
            breaker_failures: self.redis_breaker_failures.get(),
            breaker_cooldown: self.redis_breaker_cooldown,
            local_instances: self.failure_mode_local_instances.get(),
        }
    }
}
