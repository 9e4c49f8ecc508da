//! Sluice: a global rate limit service for Envoy.
//!
//! # Layout
//!
//! A request flows in one direction:
//! `rls` (gRPC, proto ⇄ domain) → [`limiter`] → [`policy`] (descriptor → rule) →
//! [`algorithm`] (pure math) applied atomically by a [`store`].
//!
//! - [`algorithm`]: rate limit algorithms as pure functions of `(state, limit, now, hits)`.
//! - [`clock`]: injected wall-clock time.
//! - [`config`]: YAML files → validated [`policy::Policy`], with precise errors.
//! - [`policy`]: the compiled, immutable rules per domain and descriptor matching.
//! - [`limiter`]: one request: match, evaluate every descriptor, combine, build statuses.
//! - [`store`]: the `Store` trait and the in-memory store.
//! - [`rls`]: the Envoy `RateLimitService` over gRPC; the only module that knows the proto
//!   (besides [`admin`], which speaks its JSON form).
//! - [`admin`]: HTTP endpoints `/json`, `/healthcheck`, `/ready`, `/rlconfig`, and the
//!   bounded HTTP server that serves them.
//! - [`connection`]: connection caps and handshake deadlines of the listeners.
//! - [`settings`]: every process setting, from flags and environment.
//! - [`app`]: bootstrap and ordered shutdown.
//! - [`tools`]: the `check` and `bench` clients.

pub mod admin;
pub mod algorithm;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connection;
pub mod health;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod policy;
pub mod reload;
pub mod rls;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod tls;
pub mod tools;
