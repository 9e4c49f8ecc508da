//! Leased quota: how rules are counted with a shared store by default, and how long a
//! leased block lives.

use std::time::Duration;

use clap::Args;

use std::num::NonZeroUsize;

use super::super::parse::{parse_count, parse_positive_duration};
use crate::store::Consistency;
use crate::store::lease::LeaseOptions;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Leased quota")]
pub struct LeaseArgs {
    /// How rules without a `consistency` (theirs or their domain's) count with a shared
    /// store: exact (every hit decided by the store) or leased (blocks of units taken from
    /// the shared counter, admitted in memory; never over the limit)
    #[arg(
        long,
        env = "CONSISTENCY",
        value_enum,
        ignore_case = true,
        default_value = "exact"
    )]
    pub consistency: Consistency,

    /// How long a leased block lives: unused units go back to the shared counter after it
    /// (and at shutdown); a block is sized for what the instance uses in this time
    #[arg(long, env = "LEASE_PERIOD", default_value = "1s", value_parser = parse_positive_duration)]
    lease_period: Duration,

    /// Most counters this instance holds leased blocks for; beyond it, new counters are
    /// decided exactly (a flood of keys costs no more memory than this)
    #[arg(long, env = "LEASE_MAX_KEYS", default_value = "100000", value_parser = parse_count::<NonZeroUsize>)]
    lease_max_keys: NonZeroUsize,

    /// This instance's name in the shared count of instances taking leases (blocks are
    /// shared among them); default: the host name and process id
    #[arg(long, env = "LEASE_INSTANCE_ID")]
    lease_instance_id: Option<String>,
}

impl LeaseArgs {
    pub(super) fn options(&self) -> LeaseOptions {
        LeaseOptions {
            period: self.lease_period,
            max_keys: self.lease_max_keys.get(),
            instance: self.lease_instance_id.clone().unwrap_or_else(|| {
                let host = std::env::var("HOSTNAME")
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "sluice".to_owned());
                format!("{host}-{}", std::process::id())
            }),
        }
    }
}
