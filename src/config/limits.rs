//! Bounds on what a config load reads, checked before the YAML parser sees any text: the
//! size of each file and of all of them together, and how deeply a file nests.
//!
//! The parser's time grows with size times nesting depth (see [`super::nesting`]), and a
//! reload parses while the service serves; these bounds keep every load to seconds at worst.
//! Real files are far inside them: the YAML files this repository ships (configs and
//! Kubernetes manifests) are at most 7 KB and nest at most 9 levels.

use std::io::Read as _;
use std::path::Path;

use super::{ConfigError, nesting};

/// Largest config file, in bytes (4 MiB; a Kubernetes ConfigMap holds at most 1 MiB).
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Largest total of a config directory's files, in bytes (16 MiB).
pub const MAX_DIR_BYTES: u64 = 16 * 1024 * 1024;

/// Deepest nesting of collections (mappings and sequences, flow and block) in a config file.
/// A descriptor tree 16 entries deep takes about 33; serde_yaml itself gives up at 128, but
/// only after parsing.
pub const MAX_NESTING: usize = 64;

/// Reads the config file at `path` (shown as `name`), refusing one larger than
/// [`MAX_FILE_BYTES`] without reading more than that of it.
pub(super) fn read(path: &Path, name: &str) -> Result<String, ConfigError> {
    let cannot = |e: std::io::Error| ConfigError::file(name, format!("cannot read file: {e}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let len = file.metadata().map_err(cannot)?.len();
    if len > MAX_FILE_BYTES {
        return Err(too_big(name, len));
    }
    // One byte past the bound tells a file that grew since its length was read.
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::file(
            name,
            format!(
                "file grew past the {MAX_FILE_BYTES} bytes a config file may have while it was read"
            ),
        ));
    }
    String::from_utf8(bytes).map_err(|_| {
        ConfigError::file(name, "cannot read file: stream did not contain valid UTF-8")
    })
}

/// Refuses a text larger than [`MAX_FILE_BYTES`] or nested deeper than [`MAX_NESTING`].
pub(super) fn check(name: &str, text: &str) -> Result<(), ConfigError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(name, text.len() as u64));
    }
    match nesting::too_deep(text, MAX_NESTING) {
        Some((line, column)) => Err(ConfigError::file(
            name,
            format!("nesting deeper than {MAX_NESTING} levels"),
        )
        .with_location(line, column)),
        None => Ok(()),
    }
}

/// The error for a directory whose files add up to more than [`MAX_DIR_BYTES`].
pub(super) fn directory_too_big(dir: &Path) -> ConfigError {
    ConfigError::file(
        &dir.display().to_string(),
        format!(
            "config files add up to more than the {MAX_DIR_BYTES} bytes a config directory may have"
        ),
    )
}

fn too_big(name: &str, len: u64) -> ConfigError {
    ConfigError::file(
        name,
        format!("file is {len} bytes, more than the {MAX_FILE_BYTES} a config file may have"),
    )
}
