//! Envoy's `rate_limit_quota` filter (RLQS): assignment TTLs, when idle buckets are
//! abandoned, and the caps on streams and buckets.

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use clap::Args;

use super::super::parse::{parse_count, parse_duration};
use crate::quota::RlqsOptions;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Envoy's rate_limit_quota filter (RLQS)")]
pub struct RlqsArgs {
    /// How long an RLQS assignment holds in Envoy without being renewed (it is renewed with
    /// half of it left); whole seconds, at least 2, as Envoy 1.40 drops fractions
    #[arg(long, env = "RLQS_ASSIGNMENT_TTL", default_value = "10s", value_parser = parse_ttl)]
    rlqs_assignment_ttl: Duration,

    /// A bucket without requests for this many report intervals (5 s each in Envoy 1.40) is
    /// abandoned: Envoy and Sluice forget it
    #[arg(long, env = "RLQS_ABANDON_AFTER_REPORTS", default_value = "12", value_parser = parse_count::<NonZeroU32>)]
    rlqs_abandon_after_reports: NonZeroU32,

    /// Buckets tracked per RLQS stream; a new bucket past it is answered DENY_ALL, untracked
    #[arg(long, env = "RLQS_MAX_BUCKETS_PER_STREAM", default_value = "10000", value_parser = parse_count::<NonZeroUsize>)]
    rlqs_max_buckets_per_stream: NonZeroUsize,

    /// Buckets tracked on all RLQS streams together; a new bucket past it is answered
    /// DENY_ALL, untracked
    #[arg(long, env = "RLQS_MAX_BUCKETS", default_value = "100000", value_parser = parse_count::<NonZeroUsize>)]
    rlqs_max_buckets: NonZeroUsize,

    /// RLQS streams open at once (one per Envoy and domain); a stream past it is refused
    /// with RESOURCE_EXHAUSTED
    #[arg(long, env = "RLQS_MAX_STREAMS", default_value = "1000", value_parser = parse_count::<NonZeroUsize>)]
    rlqs_max_streams: NonZeroUsize,
}

/// A TTL of whole seconds, at least 2 (renewed at half of it, so never expiring in Envoy
/// between two renewals).
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl.subsec_nanos() != 0 {
        return Err(format!(
            "'{text}': whole seconds only (Envoy 1.40 drops the fraction of an assignment's TTL)"
        ));
    }
    if ttl < Duration::from_secs(2) {
        return Err(format!("'{text}': at least 2s"));
    }
    Ok(ttl)
}

impl RlqsArgs {
    /// The options, for the process `instance` (a nonce is added: claims are per process,
    /// so that a restarted process never takes over the claims of the one before).
    pub(super) fn options(&self, instance: &str) -> RlqsOptions {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RlqsOptions {
            assignment_ttl: self.rlqs_assignment_ttl,
            abandon_after_reports: self.rlqs_abandon_after_reports.get(),
            max_buckets_per_stream: self.rlqs_max_buckets_per_stream.get(),
            max_buckets: self.rlqs_max_buckets.get(),
            max_streams: self.rlqs_max_streams.get(),
            instance: format!("{instance}-{nonce:08x}"),
            ..RlqsOptions::default()
        }
    }
}
