//! The store layer's metrics: call latency and failures, the circuit breaker, answers of the
//! failure policy, and the memory store's size. The gauges are read from
//! [`StoreStatus`](super::StoreStatus) when `/metrics` is scraped.

use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{FailureMode, FailureModeAnswers, StoreStatus};
use crate::metrics::{LATENCY_BUCKETS, counter, counter_vec, gauge, histogram};

/// Store calls, the breaker and the failure policy.
pub struct StoreMetrics {
    latency: Histogram,
    errors: IntCounter,
    healthy: IntGauge,
    failure_mode: IntCounterVec,
    /// The failure-mode answers already counted, by mode: the store counts totals.
    failure_mode_seen: Mutex<FailureModeAnswers>,
    memory: MemoryGauges,
    leases: LeaseMetrics,
    region: RegionMetrics,
    evicts: IntGauge,
}

/// Global rules in a region: the root and the units that moved through this instance.
struct RegionMetrics {
    reachable: IntGauge,
    regions: IntGauge,
    round_trip: prometheus::Gauge,
    calls: IntCounterVec,
    units: IntCounterVec,
    decisions: IntCounterVec,
    lost: IntCounterVec,
    held: IntGaugeVec,
    /// The totals already counted: calls ok, failed; units granted, returned, late;
    /// decisions by pool, by failure mode, by block; units lost by reason.
    seen: Mutex<[u64; 11]>,
}

/// Leased quota: the blocks in hand and the calls and units that moved.
struct LeaseMetrics {
    outstanding: IntGauge,
    blocks: IntGauge,
    instances: IntGauge,
    calls: IntCounter,
    leases: IntCounterVec,
    units: IntCounterVec,
    decisions: IntCounterVec,
    /// The totals already counted: calls, granted, refused, leased, returned, block, exact.
    seen: Mutex<[u64; 7]>,
}

/// The memory store's size.
struct MemoryGauges {
    keys: IntGauge,
    evicted: IntGauge,
    bytes: IntGauge,
    full: IntGauge,
}

impl StoreMetrics {
    /// Registers the store's metrics into `registry`.
    pub fn register(registry: &Registry) -> Self {
        Self {
            latency: histogram(
                registry,
                "sluice_store_request_duration_seconds",
                "Store call latency",
                LATENCY_BUCKETS,
            ),
            errors: counter(
                registry,
                "sluice_store_errors_total",
                "Requests the store did not answer (errors, timeouts, the open breaker)",
            ),
            healthy: gauge(
                registry,
                "sluice_store_healthy",
                "1 while the store answers, 0 while its circuit breaker is open",
            ),
            failure_mode: counter_vec(
                registry,
                "sluice_failure_mode_decisions_total",
                "Counters answered by the failure policy",
                &["mode"],
            ),
            failure_mode_seen: Mutex::default(),
            memory: MemoryGauges::register(registry),
            leases: LeaseMetrics::register(registry),
            region: RegionMetrics::register(registry),
            evicts: gauge(
                registry,
                "sluice_store_evicts_counters",
                "1 when the store can evict live counters of its own accord (Redis with maxmemory and a maxmemory-policy other than noeviction, read at start-up); an evicted counter starts again from zero",
            ),
        }
    }

    /// One store call that took `elapsed`; `ok` is false when the store did not answer.
    pub fn call(&self, elapsed: Duration, ok: bool) {
        self.latency.observe(elapsed.as_secs_f64());
        if !ok {
            self.errors.inc();
        }
    }

    /// Sets the gauges (and counts new failure-mode answers) from the store's state now.
    pub fn observe(&self, store: &StoreStatus) {
        self.healthy.set(i64::from(store.healthy));
        self.evicts
            .set(i64::from(store.evicts_counters.unwrap_or(false)));
        self.memory.observe(store);
        if let Some(leases) = &store.leases {
            self.leases.observe(leases);
        }
        if let Some(region) = &store.region {
            let blocks = store
                .leases
                .as_ref()
                .map_or((0, 0), |l| (l.global_block_decisions, l.outstanding_global));
            self.region.observe(region, blocks);
        }
        let mut seen = self.failure_mode_seen.lock();
        for mode in FailureMode::ALL {
            let now = store.failure_mode_answers.of(mode);
            let seen = seen.of_mut(mode);
            self.failure_mode
                .with_label_values(&[mode.as_str()])
                .inc_by(now.saturating_sub(*seen));
            *seen = now.max(*seen);
        }
    }
}

impl MemoryGauges {
    fn register(registry: &Registry) -> Self {
        Self {
            keys: gauge(
                registry,
                "sluice_memory_store_keys",
                "Counters the memory store tracks",
            ),
            evicted: gauge(
                registry,
                "sluice_memory_store_evicted_keys",
                "Live counters the memory store evicted at its cap",
            ),
            bytes: gauge(
                registry,
                "sluice_memory_store_bytes",
                "Heap bytes the memory store's counters take",
            ),
            full: gauge(
                registry,
                "sluice_memory_store_full",
                "1 while the memory store evicts live counters (it did within the last minute)",
            ),
        }
    }

    fn observe(&self, store: &StoreStatus) {
        if let Some(keys) = store.tracked_keys {
            self.keys.set(keys as i64);
        }
        self.evicted.set(store.evicted_keys as i64);
        if let Some(bytes) = store.bytes {
            self.bytes.set(bytes as i64);
        }
        self.full.set(i64::from(store.full));
    }
}

impl LeaseMetrics {
    fn register(registry: &Registry) -> Self {
        Self {
            outstanding: gauge(
                registry,
                "sluice_lease_units_outstanding",
                "Units this instance holds in leased blocks, not admitted yet",
            ),
            blocks: gauge(
                registry,
                "sluice_lease_blocks",
                "Counters this instance holds a leased block for",
            ),
            instances: gauge(
                registry,
                "sluice_lease_instances",
                "Instances taking leases recently, this one included (blocks are shared among them)",
            ),
            calls: counter(
                registry,
                "sluice_lease_calls_total",
                "Lease calls to the shared store (leases and hand-backs)",
            ),
            leases: counter_vec(
                registry,
                "sluice_leases_total",
                "Leases asked of the shared store, by result (granted, refused: nothing left)",
                &["result"],
            ),
            units: counter_vec(
                registry,
                "sluice_lease_units_total",
                "Units taken from shared counters (leased) and handed back (returned)",
                &["direction"],
            ),
            decisions: counter_vec(
                registry,
                "sluice_lease_decisions_total",
                "Leased counters decided from a block (block) or by the shared store (exact: the lease failed, the table was full, or the wait was too long)",
                &["by"],
            ),
            seen: Mutex::default(),
        }
    }

    fn observe(&self, leases: &super::lease::LeaseStatus) {
        self.outstanding.set(leases.outstanding as i64);
        self.blocks.set(leases.blocks as i64);
        self.instances.set(leases.instances as i64);
        let now = [
            leases.calls,
            leases.leases,
            leases.refused,
            leases.units_leased,
            leases.units_returned,
            leases.local_decisions,
            leases.exact_decisions,
        ];
        let mut seen = self.seen.lock();
        let delta = |i: usize| now[i].saturating_sub(seen[i]);
        self.calls.inc_by(delta(0));
        self.leases.with_label_values(&["granted"]).inc_by(delta(1));
        self.leases.with_label_values(&["refused"]).inc_by(delta(2));
        self.units.with_label_values(&["leased"]).inc_by(delta(3));
        self.units.with_label_values(&["returned"]).inc_by(delta(4));
        self.decisions
            .with_label_values(&["block"])
            .inc_by(delta(5));
        self.decisions
            .with_label_values(&["exact"])
            .inc_by(delta(6));
        for (s, n) in seen.iter_mut().zip(now) {
            *s = n.max(*s);
        }
    }
}

impl RegionMetrics {
    fn register(registry: &Registry) -> Self {
        Self {
            reachable: gauge(
                registry,
                "sluice_root_reachable",
                "1 while the root of global rules answered this instance's last call, 0 after a failed one (with ROOT_REDIS_URL)",
            ),
            regions: gauge(
                registry,
                "sluice_regions",
                "Regions the root counted at this instance's last ask (global rules share the root among them)",
            ),
            round_trip: crate::metrics::gauge_f64(
                registry,
                "sluice_root_round_trip_seconds",
                "How long this instance's last answered ask to the root took",
            ),
            calls: counter_vec(
                registry,
                "sluice_root_calls_total",
                "Calls to the root of global rules (asks, hand-backs, counts of regions), by result",
                &["result"],
            ),
            units: counter_vec(
                registry,
                "sluice_region_units_total",
                "Units of global rules the root granted to this instance's asks (granted), handed back to it (returned), and granted after their pool would have ended (late: handed back)",
                &["direction"],
            ),
            decisions: counter_vec(
                registry,
                "sluice_global_decisions_total",
                "Global counters this instance decided from its block (block; these count in sluice_lease_decisions_total too), from the region's pool (pool), or by their failure_mode with the root away and the pool ended (failure_mode)",
                &["by"],
            ),
            lost: counter_vec(
                registry,
                "sluice_region_units_lost_total",
                "Units of global rules lost to the planet until their window ends (a token bucket's: until the root refills them), by reason: withdrawn from a pool and not taken back by the root (hand_back: its window moved on, a token bucket charged since, or the call failed), taken by a refused request and not taken back by its pool (put_back), granted and not installed in the region's store (region_store); under, never over",
                &["reason"],
            ),
            held: crate::metrics::gauge_vec(
                registry,
                "sluice_region_units_held",
                "Units of global rules held and not admitted yet: free in the region's pools of the counters this instance knows, as it last saw them (pool), and in this instance's blocks, as of its last sweep (blocks)",
                &["in"],
            ),
            seen: Mutex::default(),
        }
    }

    fn observe(&self, region: &super::region::RegionStatus, blocks: (u64, u64)) {
        let (block_decisions, in_blocks) = blocks;
        self.reachable.set(i64::from(region.root_reachable));
        self.held
            .with_label_values(&["pool"])
            .set(region.pool_free as i64);
        self.held
            .with_label_values(&["blocks"])
            .set(in_blocks as i64);
        self.regions.set(region.regions as i64);
        self.round_trip.set(region.round_trip as f64 / 1e6);
        let now = [
            region.root_calls_ok,
            region.root_calls_failed,
            region.units_granted,
            region.units_returned,
            region.units_late,
            region.pool_decisions,
            region.failure_mode_decisions,
            block_decisions,
            region.units_lost[0],
            region.units_lost[1],
            region.units_lost[2],
        ];
        let mut seen = self.seen.lock();
        let delta = |i: usize| now[i].saturating_sub(seen[i]);
        self.calls.with_label_values(&["ok"]).inc_by(delta(0));
        self.calls.with_label_values(&["failed"]).inc_by(delta(1));
        for (i, direction) in [(2, "granted"), (3, "returned"), (4, "late")] {
            self.units.with_label_values(&[direction]).inc_by(delta(i));
        }
        self.decisions.with_label_values(&["pool"]).inc_by(delta(5));
        self.decisions
            .with_label_values(&["failure_mode"])
            .inc_by(delta(6));
        self.decisions
            .with_label_values(&["block"])
            .inc_by(delta(7));
        for (i, reason) in [(8, "hand_back"), (9, "put_back"), (10, "region_store")] {
            self.lost.with_label_values(&[reason]).inc_by(delta(i));
        }
        for (s, n) in seen.iter_mut().zip(now) {
            *s = n.max(*s);
        }
    }
}
