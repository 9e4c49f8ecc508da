//! Sluice: a global rate limit service for Envoy.
//!
//! # Layout
//!
//! A request flows in one direction:
//! `rls` (gRPC, proto ⇄ domain) → [`limiter`] → [`policy`] (descriptor → rule) →
//! [`algorithm`] (pure math) applied atomically by a [`store`].
//!
//! Every module, in the order a process meets them:
//!
//! 1. Start-up
//!    - [`cli`]: the subcommands and their flags.
//!    - [`settings`]: every process setting, from flags and environment.
//!    - [`logging`]: the log subscriber the settings ask for.
//!    - [`config`]: YAML files → validated [`policy::Policy`], with precise errors.
//!    - [`app`]: bootstrap (config → store → limiter → servers) and ordered shutdown.
//! 2. A connection
//!    - [`connection`]: connection caps and handshake deadlines of the listeners.
//!    - [`tls`]: gRPC TLS and mutual TLS with certificates that follow their files.
//! 3. A request
//!    - [`rls`]: the Envoy `RateLimitService` over gRPC; the only module that knows the
//!      proto (besides [`admin`], which speaks its JSON form).
//!    - [`admin`]: HTTP endpoints `/json`, `/healthcheck`, `/ready`, `/rlconfig`,
//!      `/metrics`, and the bounded HTTP server that serves them.
//!    - [`limiter`]: one request: match, evaluate every descriptor, combine, build statuses.
//!    - [`policy`]: the compiled, immutable rules per domain and descriptor matching.
//!    - [`algorithm`]: rate limit algorithms as pure functions of `(state, limit, now, hits)`.
//!    - [`store`]: the `Store` trait, the memory and Redis stores and what wraps them.
//!    - [`clock`]: injected wall-clock time.
//! 4. While serving
//!    - [`metrics`]: the Prometheus registry every layer registers into, and its statsd
//!      exporter.
//!    - [`traces`]: OpenTelemetry spans of every decision, exported over OTLP.
//!    - [`health`]: the serving state health checks report.
//!    - [`reload`]: the config watcher and the all-or-nothing swap.
//!    - [`xds`]: the xDS config source, swapping what a control plane sends.
//!    - [`shutdown`]: signals, and the drain they start.
//! 5. Beside the service
//!    - [`tools`]: the `check` and `bench` clients and the always-OK server.

// Declared in the order of the list above (each group on its own, so rustfmt keeps it).
pub mod cli;
pub mod settings;

pub mod logging;

pub mod config;

pub mod app;

pub mod connection;
pub mod tls;

pub mod rls;

pub mod admin;

pub mod limiter;

pub mod policy;

pub mod algorithm;

pub mod store;

pub mod clock;

pub mod metrics;

pub mod traces;

pub mod health;

pub mod reload;

pub mod xds;

pub mod shutdown;

pub mod tools;

#[cfg(test)]
mod tests {
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
        let mut files: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
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
