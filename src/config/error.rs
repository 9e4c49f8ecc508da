//! Config errors that say where: file, line and column when the parser knows them, and the
//! path in the tree (`descriptors[0].rate_limit.unit`).

use std::fmt;

/// One problem in the config, with its location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// File name relative to the config directory (or the directory itself).
    pub file: String,
    /// 1-based line and column, where the YAML parser gives them.
    pub location: Option<(usize, usize)>,
    /// Path in the YAML tree, empty for the whole file.
    pub path: String,
    /// What is wrong, in the reference service's wording where it has one.
    pub message: String,
}

impl ConfigError {
    /// An error about a whole file.
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        Self::at_path(file, "", message)
    }

    /// An error at `path` in `file`.
    pub fn at_path(file: &str, path: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            location: None,
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// Adds the parser's 1-based line and column.
    pub fn with_location(mut self, line: usize, column: usize) -> Self {
        self.location = Some((line, column));
        self
    }

    /// Wraps a serde_yaml error, keeping its location apart from its message.
    pub(crate) fn parse(file: &str, prefix: &str, error: &serde_yaml::Error) -> Self {
        let mut message = error.to_string();
        let location = error.location().map(|l| (l.line(), l.column()));
        if let Some((line, column)) = location {
            let suffix = format!(" at line {line} column {column}");
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_owned();
            }
        }
        // serde_yaml prefixes type errors with the tree path: `descriptors[0].unit: invalid ...`.
        let mut path = String::new();
        while let Some((head, rest)) = message.split_once(": ")
            && !head.contains(' ')
            && (head.contains('.')
                || head.contains('[')
                || head.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            && !rest.is_empty()
        {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(head);
            message = rest.to_owned();
        }
        // Name the config's own notions, not our Rust types.
        for (internal, shown) in [
            (
                "struct RawFile",
                "a config file mapping (domain, descriptors)",
            ),
            (
                "struct RawDescriptor",
                "a descriptor mapping (key, value, rate_limit, ...)",
            ),
            (
                "struct RawRateLimit",
                "a rate_limit mapping (unit, requests_per_unit, ...)",
            ),
            ("struct RawReplaces", "a replaces entry mapping (name)"),
            (
                "expected u32",
                "expected a whole number from 0 to 4294967295",
            ),
            (
                "expected u64",
                "expected a whole number from 0 to 9007199254740991",
            ),
        ] {
            message = message.replace(internal, shown);
        }
        Self {
            file: file.to_owned(),
            location,
            path,
            message: format!("{prefix}{message}"),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        f.write_str(": ")?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}
