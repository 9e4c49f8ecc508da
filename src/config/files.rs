//! Which files of a config directory are config: `*.yaml` and `*.yml`, recursively, never a
//! dotfile or anything under a dot-directory (Kubernetes ConfigMap mounts keep their real
//! files under `..data` and `..<timestamp>` and link them from the top level).

use std::path::{Path, PathBuf};

use super::ConfigError;

/// Deepest directory nesting followed; guards against symlink loops.
const MAX_DEPTH: usize = 16;

/// Every config file under `dir`, sorted by path.
pub fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let shown = dir.display().to_string();
    let meta = std::fs::metadata(dir)
        .map_err(|e| ConfigError::file(&shown, format!("cannot read config directory: {e}")))?;
    if !meta.is_dir() {
        return Err(ConfigError::file(&shown, "config path is not a directory"));
    }
    let mut found = Vec::new();
    walk(dir, 0, &mut found)
        .map_err(|e| ConfigError::file(&shown, format!("cannot read config directory: {e}")))?;
    found.sort();
    Ok(found)
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
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
            if depth < MAX_DEPTH {
                walk(&path, depth + 1, found)?;
            }
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            found.push(path);
        }
    }
    Ok(())
}
