//! Config files → validated [`Policy`], in three stages: read the directory, parse each file
//! into [`raw`] serde structs, then `compile` them with every semantic check.
//!
//! A load either yields a whole policy or every error found (all files, all rules, not just
//! the first); nothing is ever half-applied. Before any text reaches the YAML parser, its size
//! and nesting depth are checked against the bounds in `limits`.

mod compile;
mod error;
mod files;
mod limits;
mod locate;
mod nesting;
pub mod proto;
pub mod raw;

use std::path::Path;

pub use error::ConfigError;
pub use files::config_files;
pub use limits::{MAX_DIR_BYTES, MAX_FILE_BYTES, MAX_NESTING};

use crate::policy::Policy;

/// How files are combined into a policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Merge files that declare the same domain instead of rejecting the duplicate
    /// (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

/// A successfully loaded config.
#[derive(Debug)]
pub struct Loaded {
    /// The compiled policy.
    pub policy: Policy,
    /// Files read, relative to the config directory, sorted.
    pub files: Vec<String>,
}

/// Loads every `*.yaml`/`*.yml` file under `dir` (skipping dotfiles and dot-directories).
///
/// Reads at most [`MAX_FILE_BYTES`] of a file and stops reading once the files add up to
/// more than [`MAX_DIR_BYTES`]. Blocking: parsing may take seconds, so a running service
/// calls it off its async runtime.
pub fn load_dir(dir: &Path, options: LoadOptions) -> Result<Loaded, Vec<ConfigError>> {
    let paths = config_files(dir).map_err(|e| vec![e])?;
    let mut sources = Vec::with_capacity(paths.len());
    let mut errors = Vec::new();
    let mut total = 0;
    for path in &paths {
        let name = path
            .strip_prefix(dir)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        match limits::read(path, &name) {
            Ok(text) => {
                total += text.len() as u64;
                if total > MAX_DIR_BYTES {
                    // Parsing the files read so far would only add errors about what is missing.
                    errors.push(limits::directory_too_big(dir));
                    return Err(errors);
                }
                sources.push((name, text));
            }
            Err(e) => errors.push(e),
        }
    }
    let files: Vec<String> = sources.iter().map(|(n, _)| n.clone()).collect();
    match load_sources(&sources, options) {
        Ok(policy) if errors.is_empty() => Ok(Loaded { policy, files }),
        Ok(_) => Err(errors),
        Err(more) => {
            errors.extend(more);
            Err(errors)
        }
    }
}

/// [`load_dir`] on a thread of its own, given up after `deadline` with an error naming the
/// directory (the thread finishes in the background if the file system ever answers): for
/// start-up, which must fail rather than hang on a mount that does not answer.
pub fn load_dir_within(
    dir: &Path,
    options: LoadOptions,
    deadline: std::time::Duration,
) -> Result<Loaded, Vec<ConfigError>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = dir.to_owned();
    let shown = dir.display().to_string();
    let spawned = std::thread::Builder::new()
        .name("sluice-config-load".into())
        .spawn(move || {
            let _ = tx.send(load_dir(&owned, options));
        });
    if let Err(e) = spawned {
        return Err(vec![ConfigError::file(
            &shown,
            format!("cannot start a thread to load it: {e}"),
        )]);
    }
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(vec![ConfigError::file(
            &shown,
            format!(
                "config load did not finish within {} s (a file or mount that does not answer?)",
                deadline.as_secs_f64()
            ),
        )])
    })
}

/// The policy of one config file holding `yaml`; panics on config errors. For unit tests.
#[cfg(test)]
pub(crate) fn policy_for_tests(yaml: &str) -> Policy {
    load_sources(&[("test.yaml".into(), yaml.into())], LoadOptions::default())
        .unwrap_or_else(|errors| panic!("{errors:?}"))
}

/// Compiles in-memory config files, given as `(file name, YAML text)`, into a policy. Every
/// error with a tree path is shown at the line of that path in its file's text.
pub fn load_sources(
    sources: &[(String, String)],
    options: LoadOptions,
) -> Result<Policy, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut parsed: Vec<(String, raw::RawFile)> = Vec::with_capacity(sources.len());
    // Where each parsed file's text is: its source's text and its document there.
    let mut origins: Vec<(&str, usize)> = Vec::with_capacity(sources.len());
    for (name, text) in sources {
        match parse_documents(name, text) {
            Ok(files) => {
                for (label, file, document) in files {
                    parsed.push((label, file));
                    origins.push((text, document));
                }
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    compile_after(&parsed, errors, options).map_err(|mut errors| {
        let mut budget = locate::MAX_LOCATED;
        for error in errors.iter_mut().filter(|e| e.location.is_none()) {
            // Compile errors name their file by its label; a label two documents share is
            // located in the first.
            let Some(at) = parsed.iter().position(|(label, _)| *label == error.file) else {
                continue;
            };
            let (text, document) = origins[at];
            if let Some((line, column)) = locate::within(&mut budget, text, document, &error.path) {
                error.location = Some((line, column));
            }
        }
        errors
    })
}

/// Compiles `files`, adding its errors to those found before (`errors`, from reading or
/// decoding them): the policy only when there are none at all.
fn compile_after(
    files: &[(String, raw::RawFile)],
    mut errors: Vec<ConfigError>,
    options: LoadOptions,
) -> Result<Policy, Vec<ConfigError>> {
    match compile::compile(files, options) {
        Ok(policy) if errors.is_empty() => Ok(policy),
        Ok(_) => Err(errors),
        Err(mut more) => {
            errors.append(&mut more);
            Err(errors)
        }
    }
}

/// Parses every YAML document of a file (Envoy Gateway writes several, one domain each; the
/// reference reads only the first), each named in messages by the file and, when it has one,
/// its `name` (`rules.yaml (gateway-a)`), or its place in the file (`rules.yaml (document 2)`).
fn parse_documents(
    name: &str,
    text: &str,
) -> Result<Vec<(String, raw::RawFile, usize)>, Vec<ConfigError>> {
    use serde::Deserialize;
    limits::check(name, text).map_err(|e| vec![e])?;
    let mut documents = serde_yaml::Deserializer::from_str(text)
        .map(serde_yaml::Value::deserialize)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| vec![ConfigError::parse(name, "error loading config file: ", &e)])?;
    let label = |file: &raw::RawFile, index: usize, several: bool| match &file.name {
        Some(config) if !config.is_empty() => format!("{name} ({config})"),
        _ if several => format!("{name} (document {})", index + 1),
        _ => name.to_owned(),
    };
    if documents.len() <= 1 {
        // One document: deserialized from the text, so that errors carry line and column.
        let value = documents.pop().unwrap_or(serde_yaml::Value::Null);
        let file = parse_file(name, text, &value)?;
        return Ok(vec![(label(&file, 0, false), file, 0)]);
    }
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue; // an empty document between two `---`
        }
        let place = format!("{name} (document {})", index + 1);
        let structural = raw::structure_errors(&document);
        if !structural.is_empty() {
            let mut budget = locate::MAX_LOCATED;
            errors.extend(structural.into_iter().map(|e| {
                let at = locate::within(&mut budget, text, index, &e.field_path());
                let error = ConfigError::at_path(&place, &e.path, e.message);
                match at {
                    Some((line, column)) => error.with_location(line, column),
                    None => error,
                }
            }));
            continue;
        }
        match serde_yaml::from_value::<raw::RawFile>(document) {
            Ok(file) => files.push((label(&file, index, true), file, index)),
            Err(e) => errors.push(ConfigError::file(&place, e.to_string())),
        }
    }
    if errors.is_empty() {
        Ok(files)
    } else {
        Err(errors)
    }
}

/// Parses one document's text (already read as `value`) into its raw form, reporting every
/// unknown key, or the parser's error.
fn parse_file(
    name: &str,
    text: &str,
    value: &serde_yaml::Value,
) -> Result<raw::RawFile, Vec<ConfigError>> {
    if value.is_null() {
        // An empty file: the reference reports its (missing) domain.
        return Ok(raw::RawFile::default());
    }
    let structural = raw::structure_errors(value);
    let parse_error = match serde_yaml::from_str::<raw::RawFile>(text) {
        Ok(file) if structural.is_empty() => return Ok(file),
        Ok(_) => None,
        Err(e) => Some(ConfigError::parse(name, "", &e)),
    };
    if structural.is_empty() {
        return Err(parse_error.into_iter().collect());
    }
    // The parser stops at the first problem and knows where it is; the walk found all of
    // them. Lend the parser's position to the walk's error at the same path, and find the
    // others' in the text.
    let location = parse_error
        .filter(|p| p.path == structural[0].path)
        .and_then(|p| p.location);
    let mut budget = locate::MAX_LOCATED;
    Err(structural
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let at = match (i, location) {
                (0, Some(at)) => Some(at),
                _ => locate::within(&mut budget, text, 0, &e.field_path()),
            };
            let error = ConfigError::at_path(name, &e.path, e.message);
            match at {
                Some((line, column)) => error.with_location(line, column),
                None => error,
            }
        })
        .collect())
}
