//! How requests are decided: their size bounds and the global shadow and quota modes.

use std::num::NonZeroUsize;

use clap::Args;

use super::super::parse::{parse_count, parse_positive_duration};

use crate::limiter::LimiterOptions;
use crate::store::{Consistency, FailureMode};

/// How refused keys hold descriptor values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyValues {
    /// As sent.
    Plain,
    /// 12 hex digits of the value's SHA-256.
    Hashed,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Requests")]
pub struct RequestArgs {
    /// Never answer OVER_LIMIT overall (per-descriptor statuses still tell the truth)
    #[arg(long, env = "SHADOW_MODE")]
    shadow_mode: bool,

    /// Treat every descriptor as a quota descriptor
    #[arg(long, env = "QUOTA_MODE")]
    quota_mode: bool,

    /// Most descriptors one request may carry; more is answered INVALID_ARGUMENT
    #[arg(long, env = "MAX_REQUEST_DESCRIPTORS", default_value = "64", value_parser = parse_count::<NonZeroUsize>)]
    max_request_descriptors: NonZeroUsize,

    /// Most entries one descriptor may carry; more is answered INVALID_ARGUMENT
    #[arg(long, env = "MAX_DESCRIPTOR_ENTRIES", default_value = "16", value_parser = parse_count::<NonZeroUsize>)]
    max_descriptor_entries: NonZeroUsize,

    /// A shadow rule's counter counts every hit, past its limit too, so the whole demand is
    /// measured before the rule is enforced; false: it stops at the limit
    #[arg(long, env = "SHADOW_COUNTS_PAST_LIMIT", default_value = "true")]
    shadow_counts_past_limit: bool,

    /// Keep each rule's top refused keys (GET /top, sluice top); false: keep none
    #[arg(long, env = "TOP_REFUSED_KEYS", default_value = "true")]
    top_refused_keys: bool,

    /// How the top refused keys hold descriptor values: plain, or hashed (12 hex digits of
    /// their SHA-256: a key can be matched, the value is never kept)
    #[arg(
        long,
        env = "TOP_REFUSED_KEYS_VALUES",
        value_enum,
        ignore_case = true,
        default_value = "plain"
    )]
    top_refused_keys_values: KeyValues,

    /// Count each rule's distinct refused keys per window, and those not refused within
    /// REFUSED_KEYS_HISTORY before (sluice_rule_refused_keys); false: count none
    #[arg(long, env = "DISTINCT_REFUSED_KEYS", default_value = "true")]
    distinct_refused_keys: bool,

    /// How far back a refused key counts as refused before, not new
    #[arg(long, env = "REFUSED_KEYS_HISTORY", default_value = "24h", value_parser = parse_positive_duration)]
    refused_keys_history: std::time::Duration,
}

impl RequestArgs {
    /// The limiter's options; `failure_mode` is the failure policy's default, `consistency`
    /// the leasing one's.
    pub(super) fn limiter(
        &self,
        failure_mode: FailureMode,
        consistency: Consistency,
    ) -> LimiterOptions {
        LimiterOptions {
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            failure_mode,
            consistency,
            max_descriptors: self.max_request_descriptors.get(),
            max_entries: self.max_descriptor_entries.get(),
            reference_keys: false,
            shadow_counts_past_limit: self.shadow_counts_past_limit,
            top_refused_keys: self.top_refused_keys,
            top_refused_keys_hashed: self.top_refused_keys_values == KeyValues::Hashed,
            distinct_refused_keys: self.distinct_refused_keys,
            refused_keys_history: self.refused_keys_history,
        }
    }
}
