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
//!
//! Nothing the directory holds can stall the reloader: a load (and each fingerprint) runs on a
//! blocking thread under [`ReloadOptions::deadline`], one at a time, and one that does not
//! finish is reported like any other error while the policy in force keeps serving; a reload
//! that finds no domain at all where the policy in force has some (the only file replaced by
//! a directory, a mount gone wrong) keeps the policy and says why, unless health is to follow
//! whether a domain is loaded ([`ReloadOptions::keep_when_empty`]).

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
    /// How long a load (reading, parsing, compiling) may take before it is given up.
    pub deadline: Duration,
    /// Whether a reload that finds no domain where some are in force is refused (the policy
    /// stays). Off where health follows whether a domain is loaded
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`): there the empty policy is applied and
    /// health turns unready, as the operator asked.
    pub keep_when_empty: bool,
}

/// The default [`ReloadOptions::deadline`]: far above what the size bounds let a load take
/// (seconds), far below "never".
pub const LOAD_DEADLINE: Duration = Duration::from_secs(30);

/// The reloader's handles on the running service.
pub struct Reloader {
    options: ReloadOptions,
    swap: PolicySwap,
    /// Whether a blocking thread of ours is still reading the directory (at most one: a file
    /// system that hangs holds one thread, not one per attempt).
    busy: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What identifies the state of the config files.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, u64)>;

impl Reloader {
    /// A reloader that loads as `options` say and swaps through `swap`.
    pub fn new(options: ReloadOptions, swap: PolicySwap) -> Self {
        Self {
            options,
            swap,
            busy: Default::default(),
        }
    }

    /// Loads the directory now (on a blocking thread, within the deadline) and swaps the
    /// policy in if it is valid; returns whether it was.
    pub async fn reload(&self, reason: &str) -> bool {
        let (dir, load) = (self.options.dir.clone(), self.options.load);
        let shown = self.options.dir.display().to_string();
        let loaded = match self.off_runtime(move || config::load_dir(&dir, load)).await {
            Ok(loaded) => loaded,
            Err(why) => Err(vec![ConfigError::file(&shown, why)]),
        };
        let loaded = loaded.and_then(|loaded| {
            let before = self.swap.domain_count();
            if self.options.keep_when_empty && loaded.policy.domain_count() == 0 && before > 0 {
                return Err(vec![ConfigError::file(
                    &shown,
                    format!(
                        "no domain found ({} config files read) where {before} are in force: an empty config directory is taken for a mistake (a file replaced by a directory, a mount gone wrong); restart to run without rules",
                        loaded.files.len()
                    ),
                )]);
            }
            Ok(loaded)
        });
        self.swap.apply(loaded, reason)
    }

    /// Runs `work` on a blocking thread and waits at most the deadline; refuses while an
    /// earlier call's thread has not returned.
    async fn off_runtime<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        use std::sync::atomic::Ordering;
        if self
            .busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err("an earlier read of the config directory has not returned (a file or mount that does not answer?)".into());
        }
        struct Done(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let done = Done(self.busy.clone());
        let task = tokio::task::spawn_blocking(move || {
            let _done = done;
            work()
        });
        match tokio::time::timeout(self.options.deadline, task).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(format!("config load failed: {e}")),
            Err(_) => Err(format!(
                "config load did not finish within {} s (a file or mount that does not answer?)",
                self.options.deadline.as_secs_f64()
            )),
        }
    }

    /// The directory's fingerprint, off the runtime; `None` when it cannot be taken now.
    async fn fingerprint(&self) -> Option<Fingerprint> {
        let dir = self.options.dir.clone();
        self.off_runtime(move || fingerprint(&dir)).await.ok()
    }

    /// Watches until `shutdown` resolves; a reload under way is then abandoned (its thread
    /// finishes within the load bounds, and its result is dropped). SIGHUP is listened for
    /// from this call on, not from the future's first poll: a SIGHUP right after the server
    /// says it is serving must reload, not kill the process (the signal's default action).
    /// The directory's state is taken here too, not when the future first runs: a change made
    /// after start-up but before a busy runtime polls the watcher must be seen as a change.
    pub fn run(self, shutdown: impl Future<Output = ()> + Send) -> impl Future<Output = ()> + Send {
        let hangup = hangup_signal();
        let first = fingerprint(&self.options.dir);
        self.watch(hangup, first, shutdown)
    }

    async fn watch(
        self,
        mut hangup: Hangup,
        first: Fingerprint,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut last = first;
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
                    last = self.fingerprint().await.unwrap_or(last);
                }
                _ = tick.tick(), if polling => {
                    // A fingerprint that cannot be taken now changes nothing.
                    let Some(now) = self.fingerprint().await else {
                        continue;
                    };
                    if now == last {
                        continue;
                    }
                    // Let the change settle: a ConfigMap update or a copy of several files
                    // must be seen whole.
                    let settle_and_load = async {
                        let mut settled = now;
                        loop {
                            tokio::time::sleep(self.options.settle).await;
                            let again = self.fingerprint().await.unwrap_or_else(|| settled.clone());
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
