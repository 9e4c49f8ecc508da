//! The config directory as a source: watch it, debounce, validate everything, then swap the whole
//! policy or keep the old one, and say which (a log line, a metric, `/rlconfig`).
//!
//! The directory is polled rather than watched with inotify: a fingerprint of every config
//! file (path, size, modification time, inode, following symlinks) catches Kubernetes
//! ConfigMap `..data` symlink swaps, atomic renames and in-place edits alike, works on every
//! filesystem, and costs a few `stat` calls per interval. Editors' temporary files are not
//! config files (dotfiles, `~` backups, anything not `*.yaml`/`*.yml`). A change is loaded
//! only once the fingerprint has been stable for a short while, so a half-copied set of files
//! is never read. SIGHUP reloads at once.
//!
//! Files are read and parsed on a blocking thread, never on the runtime's: a config near the
//! size and depth bounds of [`config::MAX_FILE_BYTES`] and [`config::MAX_NESTING`] takes
//! seconds to parse, during which requests and health checks must go on being answered.
//!
//! Counters live in the store under keys derived from the rules, so the counters of rules a
//! reload leaves unchanged carry on.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::PolicySwap;
use crate::config::{self, ConfigError, LoadOptions};

/// How and where to watch.
#[derive(Debug, Clone)]
pub struct ReloadOptions {
    /// The config directory.
    pub dir: PathBuf,
    /// How files are combined.
    pub load: LoadOptions,
    /// How often the directory is checked (0: only on SIGHUP).
    pub interval: Duration,
    /// How long a change must stay still before it is loaded.
    pub settle: Duration,
}

/// The reloader's handles on the running service.
pub struct Reloader {
    options: ReloadOptions,
    swap: PolicySwap,
}

/// What identifies the state of the config files.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64)>;

impl Reloader {
    /// A reloader that loads as `options` say and swaps through `swap`.
    pub fn new(options: ReloadOptions, swap: PolicySwap) -> Self {
        Self { options, swap }
    }

    /// Loads the directory now (on a blocking thread) and swaps the policy in if it is
    /// valid; returns whether it was.
    pub async fn reload(&self, reason: &str) -> bool {
        let (dir, load) = (self.options.dir.clone(), self.options.load);
        let loaded = tokio::task::spawn_blocking(move || config::load_dir(&dir, load))
            .await
            .unwrap_or_else(|e| {
                let dir = self.options.dir.display().to_string();
                Err(vec![ConfigError::file(
                    &dir,
                    format!("config load failed: {e}"),
                )])
            });
        self.swap.apply(loaded, reason)
    }

    /// Watches until `shutdown` resolves; a reload under way is then abandoned (its thread
    /// finishes within the load bounds, and its result is dropped). SIGHUP is listened for
    /// from this call on, not from the future's first poll: a SIGHUP right after the server
    /// says it is serving must reload, not kill the process (the signal's default action).
    pub fn run(self, shutdown: impl Future<Output = ()> + Send) -> impl Future<Output = ()> + Send {
        let hangup = hangup_signal();
        self.watch(hangup, shutdown)
    }

    async fn watch(self, mut hangup: Hangup, shutdown: impl Future<Output = ()>) {
        let mut last = fingerprint(&self.options.dir);
        let polling = !self.options.interval.is_zero();
        let mut tick = tokio::time::interval(if polling {
            self.options.interval
        } else {
            Duration::from_secs(3600)
        });
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = hangup.recv() => {
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = self.reload("SIGHUP") => {}
                    }
                    last = fingerprint(&self.options.dir);
                }
                _ = tick.tick(), if polling => {
                    let now = fingerprint(&self.options.dir);
                    if now == last {
                        continue;
                    }
                    // Let the change settle: a ConfigMap update or a copy of several files
                    // must be seen whole.
                    let settle_and_load = async {
                        let mut settled = now;
                        loop {
                            tokio::time::sleep(self.options.settle).await;
                            let again = fingerprint(&self.options.dir);
                            if again == settled {
                                break;
                            }
                            settled = again;
                        }
                        self.reload("files changed").await;
                        settled
                    };
                    tokio::select! {
                        _ = &mut shutdown => return,
                        settled = settle_and_load => last = settled,
                    }
                }
            }
        }
    }
}

/// The state of every config file under `dir` (empty if the directory cannot be read).
fn fingerprint(dir: &Path) -> Fingerprint {
    let files = config::config_files(dir).unwrap_or_default();
    files
        .into_iter()
        .map(|path| {
            let meta = std::fs::metadata(&path).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            #[cfg(unix)]
            let inode = meta.as_ref().map_or(0, std::os::unix::fs::MetadataExt::ino);
            #[cfg(not(unix))]
            let inode = 0;
            (path, len, modified, inode)
        })
        .collect()
}

/// SIGHUP as a stream of events; never fires where signals are unavailable.
fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(signal) => Hangup(Some(signal)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP");
                Hangup(None)
            }
        }
    }
    #[cfg(not(unix))]
    Hangup(None)
}

struct Hangup(
    #[cfg(unix)] Option<tokio::signal::unix::Signal>,
    #[cfg(not(unix))] Option<()>,
);

impl Hangup {
    async fn recv(&mut self) {
        match &mut self.0 {
            #[cfg(unix)]
            Some(signal) => {
                if signal.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            _ => std::future::pending::<()>().await,
        }
    }
}
