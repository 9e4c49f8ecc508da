//! Sets of refused keys in Redis ([`crate::store::refused`]): per rule, a set per window and a
//! sorted set of the history, all under one hash tag (one slot in a Cluster), each written by
//! a script so that the cap and the sampling level move together.

use std::sync::LazyLock;

use futures_util::future::join_all;
use redis::{Cmd, Script};

use super::RedisStore;
use crate::store::refused::{HISTORY_CAP, WINDOW_CAP};
use crate::store::{RefusedAdd, RefusedClose, RefusedCounts, StoreError};

/// `lua/refused_add.lua`: adds a window's hashes, samples past the cap, answers the level.
static ADD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/refused_add.lua")));

/// `lua/refused_close.lua`: counts a completed window once, records it in the history.
static CLOSE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/refused_close.lua")));

fn millis(micros: crate::algorithm::Micros) -> u64 {
    micros / 1000
}

fn ttl_ms(d: std::time::Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX as u128) as u64
}

impl RedisStore {
    /// `{prefix}sluice_refused_{set}` with the set as the hash tag, and a suffix.
    fn refused_key(&self, set: &str, suffix: &str) -> String {
        format!("{}sluice_refused_{{{set}}}{suffix}", self.shared.prefix)
    }

    /// One script call per add, all at once.
    pub(super) async fn add_refused_sets(
        &self,
        adds: &[RefusedAdd],
    ) -> Result<Vec<u32>, StoreError> {
        let calls = adds.iter().map(|add| async move {
            let start = millis(add.start);
            let mut cmd = Cmd::new();
            cmd.arg("EVALSHA")
                .arg(ADD.get_hash())
                .arg(2)
                .arg(self.refused_key(&add.set, &format!(":w:{start}")))
                .arg(self.refused_key(&add.set, &format!(":wl:{start}")))
                .arg(ttl_ms(add.ttl))
                .arg(WINDOW_CAP)
                .arg(add.level);
            for h in &add.hashes {
                cmd.arg(*h);
            }
            let level: i64 = self.shared.run_script(&ADD, &cmd).await?;
            Ok(level.clamp(0, 64) as u32)
        });
        join_all(calls).await.into_iter().collect()
    }

    /// One script call per close, all at once.
    pub(super) async fn close_refused_sets(
        &self,
        closes: &[RefusedClose],
    ) -> Result<Vec<RefusedCounts>, StoreError> {
        let calls = closes.iter().map(|close| async move {
            let start = millis(close.start);
            let history = ttl_ms(close.history);
            let mut cmd = Cmd::new();
            cmd.arg("EVALSHA")
                .arg(CLOSE.get_hash())
                .arg(5)
                .arg(self.refused_key(&close.set, &format!(":w:{start}")))
                .arg(self.refused_key(&close.set, &format!(":wl:{start}")))
                .arg(self.refused_key(&close.set, ":h"))
                .arg(self.refused_key(&close.set, ":hl"))
                .arg(self.refused_key(&close.set, &format!(":c:{start}")))
                .arg(start)
                .arg(start.saturating_sub(history))
                .arg(history)
                .arg(HISTORY_CAP)
                .arg(ttl_ms(close.counts_ttl));
            let counts: Vec<i64> = self.shared.run_script(&CLOSE, &cmd).await?;
            match counts.as_slice() {
                [distinct, new] => Ok(RefusedCounts {
                    distinct: (*distinct).max(0) as u64,
                    new: (*new).max(0) as u64,
                }),
                other => Err(StoreError::Internal(format!(
                    "the refused-keys script answered {other:?}, not two counts"
                ))),
            }
        });
        join_all(calls).await.into_iter().collect()
    }
}
