//! Sluice: a global rate limit service for Envoy.
//!
//! # Layout
//!
//! A request flows in one direction:
//! `rls` (gRPC, proto ⇄ domain) → [`limiter`] → [`policy`] (descriptor → rule) →
//! [`algorithm`] (pure math) applied atomically by a [`store`].
//!
//! **The rule: a module owns the types it reads and imports only the layers below it; only
//! `settings` reads flags, and only `app` builds.** The modules by layer, from the ground up
//! (a module may import its own layer and those below; `../shared/DESIGN.md` §1 has the same
//! table):
//!
//! 1. Ground: the toolkit
//!    - [`algorithm`]: rate limit algorithms as pure functions of `(state, limit, now, hits)`.
//!    - [`clock`]: injected wall-clock and monotonic time.
//!    - [`health`]: the serving state health checks report.
//!    - [`logging`]: the log subscriber and its options, and rate-limited log lines.
//!    - [`metrics`]: the metrics kit (registration helpers, the exposition trait) and the
//!      statsd exporter.
//!    - [`net`]: listener plumbing: connection caps, TLS, the bounded HTTP server, the turns
//!      of gRPC work shared fairly between connections.
//!    - [`shutdown`]: signals, and the drain they start.
//! 2. Counters
//!    - [`store`]: the `Store` trait, the memory and Redis stores and what wraps them.
//! 3. Rules
//!    - [`config`]: YAML files → validated [`policy::Policy`], with precise errors.
//!    - [`policy`]: the compiled, immutable rules per domain and descriptor matching.
//! 4. The decision
//!    - [`limiter`]: one request: match, evaluate every descriptor, combine, build statuses;
//!      the per-rule metric series that observe it.
//!    - [`quota`]: RLQS's decision: each Envoy's share of a rule's budget, divided by
//!      demand across the fleet (buckets, the division, the budget step, the outbox).
//!    - [`traces`]: OpenTelemetry spans of every decision, exported over OTLP.
//! 5. Faces
//!    - [`admin`]: HTTP endpoints `/json`, `/healthcheck`, `/ready`, `/rlconfig`,
//!      `/metrics`, `/explain`, `/counters`, and the admin gRPC API.
//!    - [`rlqs`]: Envoy's `RateLimitQuotaService` (the `rate_limit_quota` filter): the
//!      stream face of [`quota`], and with [`rls`] the faces that know the protos.
//!    - [`rls`]: the Envoy `RateLimitService` over gRPC, proto ⇄ domain (besides
//!      [`admin`], which speaks its JSON form).
//!    - [`source`]: config sources side by side (the directory watcher, xDS) and the
//!      all-or-nothing policy swap they go through.
//! 6. The process
//!    - [`app`]: the only place that builds: registry and metrics, store stack, limiter,
//!      faces, tasks; and the ordered shutdown.
//!    - [`settings`]: every process setting, from flags and environment, translated into the
//!      options each module owns.
//! 7. The binary (with `main.rs`; nothing imports them)
//!    - [`cli`]: the subcommands and their flags.
//!    - [`tools`]: the `check`, `explain`, `counters` and `bench` clients and the always-OK
//!      server.

// Declared in the order of the list above: by layer, and by name within a layer (rustfmt's order).
pub mod algorithm;
pub mod clock;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod shutdown;

pub mod store;

pub mod config;
pub mod policy;

pub mod limiter;
pub mod quota;
pub mod traces;

pub mod admin;
pub mod rlqs;
pub mod rls;
pub mod source;

pub mod app;
pub mod settings;

pub mod cli;
pub mod tools;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The checkout under test, read when the test runs (cargo sets `CARGO_MANIFEST_DIR`
    /// for it), not baked in when it was built: cargo reuses a test binary built in another
    /// checkout of the same commit that shares the target directory, and it must still read
    /// this checkout's files.
    pub(crate) fn manifest_dir() -> PathBuf {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
    }

    /// Every `.rs` file under `dir`, as a path relative to `src/` with `/` separators.
    fn sources(dir: &Path, src: &Path, out: &mut Vec<(String, PathBuf)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap().to_string_lossy();
                out.push((rel.replace(std::path::MAIN_SEPARATOR, "/"), path));
            }
        }
    }

    /// The dependency rule's guard: settings flow down as the options each module owns, so
    /// only the process and the binary name `crate::settings`, and only `app` builds, so
    /// nothing but `main` names `crate::app`.
    #[test]
    fn settings_and_app_are_named_only_from_above() {
        let src = manifest_dir().join("src");
        let mut files = Vec::new();
        sources(&src, &src, &mut files);
        assert!(files.len() > 50, "src/ not found: {files:?}");
        // lib.rs declares them (and holds this test).
        let above_settings = ["settings/", "app/", "cli.rs", "main.rs", "tools/", "lib.rs"];
        let mut wrong = Vec::new();
        for (rel, path) in &files {
            let text = std::fs::read_to_string(path).unwrap();
            let from = |allowed: &[&str]| allowed.iter().any(|a| rel.starts_with(a));
            if text.contains("crate::settings") && !from(&above_settings) {
                wrong.push(format!("{rel} names crate::settings"));
            }
            let names_app = text.contains("crate::app::") || text.contains("crate::app;");
            if names_app && !from(&["app/", "main.rs", "lib.rs"]) {
                wrong.push(format!("{rel} names crate::app"));
            }
        }
        assert!(wrong.is_empty(), "imports against the layers: {wrong:?}");
    }

    /// The layout list names every module, in the order they are declared.
    #[test]
    fn the_layout_names_every_module_in_order() {
        let source = include_str!("lib.rs");
        let declared: Vec<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
            .collect();
        let listed: Vec<&str> = source
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("//!    - [`"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert_eq!(listed, declared);
        let mut files: Vec<String> = std::fs::read_dir(manifest_dir().join("src"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .map(|f| f.strip_suffix(".rs").map_or(f.clone(), str::to_owned))
            .filter(|m| m != "lib" && m != "main")
            .collect();
        files.sort();
        files.dedup();
        let mut declared: Vec<String> = declared.iter().map(|m| (*m).to_owned()).collect();
        declared.sort();
        assert_eq!(
            files, declared,
            "a module in src/ is not declared in lib.rs"
        );
    }
}
