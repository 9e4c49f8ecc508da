//! Which files of a config directory are config: `*.yaml` and `*.yml`, recursively, never a
//! dotfile or anything under a dot-directory (Kubernetes ConfigMap mounts keep their real
//! files under `..data` and `..<timestamp>` and link them from the top level).
//!
//! The walk is bounded whatever the directory holds: each directory is entered once (by device
//! and inode, so a symlink loop is cut at its first return), at most [`MAX_DEPTH`] deep and
//! over at most [`MAX_ENTRIES`] entries; a config name on anything but a regular file (a FIFO,
//! whose read would wait for a writer forever; a socket; a device) is an error naming it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// Deepest directory nesting followed.
pub const MAX_DEPTH: usize = 16;

/// Most directory entries one walk looks at.
pub const MAX_ENTRIES: usize = 100_000;

/// What one walk has seen.
struct Walk {
    found: Vec<PathBuf>,
    /// Directories entered, by (device, inode).
    visited: HashSet<(u64, u64)>,
    entries: usize,
}

/// Every config file under `dir`, sorted by path.
pub fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let shown = dir.display().to_string();
    let meta = std::fs::metadata(dir)
        .map_err(|e| ConfigError::file(&shown, format!("cannot read config directory: {e}")))?;
    if !meta.is_dir() {
        return Err(ConfigError::file(&shown, "config path is not a directory"));
    }
    let mut walk = Walk {
        found: Vec::new(),
        visited: HashSet::from([identity(&meta)]),
        entries: 0,
    };
    walk.dir(dir, 0).map_err(|e| match e {
        Stop::Io(e) => ConfigError::file(&shown, format!("cannot read config directory: {e}")),
        Stop::Refused(e) => e,
    })?;
    walk.found.sort();
    Ok(walk.found)
}

/// Why a walk stopped.
enum Stop {
    Io(std::io::Error),
    Refused(ConfigError),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Io(e)
    }
}

#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn identity(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

impl Walk {
    fn dir(&mut self, dir: &Path, depth: usize) -> Result<(), Stop> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(Stop::Refused(ConfigError::file(
                    &dir.display().to_string(),
                    format!("the config directory holds more than {MAX_ENTRIES} entries"),
                )));
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: ConfigMap files are symlinks into `..data`.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue; // a dangling link, e.g. mid-swap of a ConfigMap
            };
            if meta.is_dir() {
                // A directory seen before (a symlink loop, or two links to one directory)
                // has given its files already.
                if depth < MAX_DEPTH && self.visited.insert(identity(&meta)) {
                    self.dir(&path, depth + 1)?;
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                if !meta.is_file() {
                    return Err(Stop::Refused(ConfigError::file(
                        &path.display().to_string(),
                        "not a regular file (a FIFO, socket or device named like a config file is refused unread)",
                    )));
                }
                self.found.push(path);
            }
        }
        Ok(())
    }
}
