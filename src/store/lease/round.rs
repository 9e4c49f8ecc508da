//! One round of a request's leases: the asks that go in one call, the guard that clears
//! their flights if the call never lands, and the call itself, whose grants are installed
//! in the blocks and wake the requests waiting for them.

use std::sync::atomic::Ordering;

use super::block::Block;
use super::{Core, Local};
use crate::algorithm::Micros;
use crate::store::digest::Digest;
use crate::store::{Batch, CounterOp, LeaseAsk, Report, Take};

/// The leases one round of a request takes: one call.
#[derive(Default)]
pub(super) struct Round {
    pub(super) asks: Vec<LeaseAsk>,
    /// Per ask: the op it leads for (`None`: a hand-back) and its block.
    pub(super) leads: Vec<(Option<usize>, Digest)>,
    /// The generation of the last block taken from (for reservations).
    pub(super) generation: u64,
    /// How long a store wiped under blocks grants nothing (see [`Report`]).
    pub(super) hold: Micros,
}

impl Round {
    /// A round whose asks carry `hold` (see [`Report`]).
    pub(super) fn new(hold: Micros) -> Self {
        Self {
            hold,
            ..Self::default()
        }
    }

    pub(super) fn lead(
        &mut self,
        i: usize,
        digest: Digest,
        op: &CounterOp,
        (ask, report): (crate::algorithm::Ask, Report),
    ) {
        self.asks.push(LeaseAsk {
            key: op.key.clone(),
            limit: op.limit,
            take: Take::Lease(ask),
            report: Report {
                hold: self.hold,
                ..report
            },
            not_after: 0,
            id: Default::default(),
            start: 0,
        });
        self.leads.push((Some(i), digest));
    }

    /// Hands back `units` of `block` (none: only its report, see [`Report`]).
    pub(super) fn give_back(&mut self, block: &mut Block, digest: Digest, units: u64, now: Micros) {
        let report = block.take_report(now);
        self.asks.push(LeaseAsk {
            key: block.key.clone(),
            limit: block.limit,
            take: Take::GiveBack {
                units,
                guard: block.guard,
            },
            report: Report {
                hold: self.hold,
                ..report
            },
            not_after: 0,
            id: Default::default(),
            start: 0,
        });
        self.leads.push((None, digest));
    }
}

/// Clears the flights of a round's leases if their call never lands (it failed, or the
/// request was dropped mid-call): their waiters then ask again.
struct Flights<'a> {
    shared: &'a Core,
    digests: Vec<Digest>,
}

impl Drop for Flights<'_> {
    fn drop(&mut self) {
        for digest in &self.digests {
            if let Some(block) = self.shared.shards.of(digest).lock().get_mut(digest) {
                block.abort();
            }
        }
    }
}

impl Core {
    /// One lease call for a round; installs the grants and wakes the waiters. Leaders whose
    /// lease failed are decided exactly.
    pub(super) async fn lease_round(
        &self,
        batch: &Batch,
        round: Round,
        asked: Micros,
        local: &mut Local,
    ) {
        let mut flights = Flights {
            shared: self,
            digests: round
                .leads
                .iter()
                .filter(|(i, _)| i.is_some())
                .map(|(_, d)| *d)
                .collect(),
        };
        self.totals.calls.fetch_add(1, Ordering::Relaxed);
        let grants = match self.inner.lease(&round.asks).await {
            Ok(grants) if grants.len() == round.asks.len() => grants,
            _ => {
                drop(flights);
                // The hand-backs of the round go again with the next sweeps.
                self.retry_later(&round.asks);
                for (i, _) in &round.leads {
                    if let Some(i) = i {
                        local.exact.push(*i);
                        self.totals.exact.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return;
            }
        };
        let now = self.clock.now().max(asked);
        for ((lead, digest), grant) in round.leads.iter().zip(&grants) {
            let Some(i) = *lead else {
                self.totals
                    .units_returned
                    .fetch_add(grant.units, Ordering::Relaxed);
                continue;
            };
            let mut shard = self.shards.of(digest).lock();
            let Some(block) = shard.get_mut(digest) else {
                local.exact.push(i);
                continue;
            };
            let flight = block.flight.clone();
            let hits = batch.ops[i].hits as u64;
            let (decision, reserved) = block.install(grant, hits, (asked, now), self.period);
            if reserved > 0 {
                local
                    .reserved
                    .push((i, *digest, block.generation, reserved));
            }
            drop(shard);
            if let Some(flight) = flight {
                flight.notify_waiters();
            }
            local.decisions[i] = Some(decision);
            if grant.units > 0 {
                self.totals.leases.fetch_add(1, Ordering::Relaxed);
                self.totals
                    .units_leased
                    .fetch_add(grant.units, Ordering::Relaxed);
            } else {
                self.totals.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Every flight landed (a panic above would leave them to the guard).
        flights.digests.clear();
    }
}
