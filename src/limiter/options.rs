//! The limiter's process-wide switches, set from the settings.

use crate::store::{Consistency, FailureMode};

/// Process-wide switches of the limiter.
#[derive(Debug, Clone, Copy)]
pub struct LimiterOptions {
    /// `SHADOW_MODE`: never answer OVER_LIMIT overall; statuses still tell the truth.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is a quota descriptor.
    pub quota_mode: bool,
    /// What rules without a `failure_mode` (theirs or their domain's) answer while the store
    /// fails.
    pub failure_mode: FailureMode,
    /// How rules without a `consistency` (theirs or their domain's) are counted with a
    /// shared store (`CONSISTENCY`).
    pub consistency: Consistency,
    /// Most descriptors one request may carry (`MAX_REQUEST_DESCRIPTORS`).
    pub max_descriptors: usize,
    /// Most entries one descriptor may carry (`MAX_DESCRIPTOR_ENTRIES`).
    pub max_entries: usize,
    /// `REDIS_KEY_FORMAT=reference`: exact fixed-window counters of single-limit rules and
    /// request overrides take the reference's keys ([`CounterKey::reference`](crate::store::CounterKey::reference)).
    pub reference_keys: bool,
    /// `SHADOW_COUNTS_PAST_LIMIT`: a shadow rule's counter counts every hit, past its limit
    /// too (else it stops at the limit, as an enforced rule's does).
    pub shadow_counts_past_limit: bool,
    /// `TOP_REFUSED_KEYS`: each rule's top refused keys are kept ([`RefusedKeys`](super::RefusedKeys)).
    pub top_refused_keys: bool,
    /// `TOP_REFUSED_KEYS_VALUES=hashed`: the top refused keys hold each value's hash, never
    /// the value.
    pub top_refused_keys_hashed: bool,
    /// `DISTINCT_REFUSED_KEYS`: each rule's refused keys are sampled and counted per window
    /// ([`DistinctRefused`](super::DistinctRefused)).
    pub distinct_refused_keys: bool,
    /// `REFUSED_KEYS_HISTORY`: how far back a refused key counts as refused before (not new).
    pub refused_keys_history: std::time::Duration,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            shadow_mode: false,
            quota_mode: false,
            failure_mode: FailureMode::default(),
            consistency: Consistency::default(),
            // Envoy sends a handful of descriptors of a few entries; these bound the work
            // of one request (every descriptor is matched and counted) far above that.
            max_descriptors: 64,
            max_entries: 16,
            shadow_counts_past_limit: true,
            top_refused_keys: true,
            top_refused_keys_hashed: false,
            distinct_refused_keys: true,
            refused_keys_history: std::time::Duration::from_secs(86_400),
            reference_keys: false,
        }
    }
}
