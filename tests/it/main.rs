//! Every integration test of Sluice, in one binary: one module per concern, sharing
//! `common/` (real redis-server, Envoy and openssl processes, and the tests' vocabulary),
//! compiled once. Run one file's tests with `cargo test --test it NAME::`.

mod common;

mod admin_api;
mod admin_reset;
mod algorithm_properties;
mod algorithms;
mod algorithms_server;
mod budget_fleet;
mod budget_numbers;
mod cli;
mod config_hostile;
mod config_validation;
mod connections;
mod docs_reference;
mod envoy;
mod envoy_budgets;
mod envoy_deploy;
mod envoy_fail_closed;
mod envoy_hidden_limits;
mod envoy_retry_after;
mod envoy_rlqs;
mod envoy_rlqs_fleet;
mod envoy_tracing;
mod fuzz_service;
mod grpc_tls;
mod hostile_requests;
mod lease_model;
mod matching;
mod metrics;
mod overlimit_cache;
mod redis_calls;
mod redis_failure;
mod redis_fleet;
mod redis_lease;
mod redis_migration;
mod redis_overload;
mod redis_per_second;
mod redis_tls;
mod reference_config;
mod reference_health;
mod reference_integration;
mod reference_limiter;
mod reference_service;
mod reload;
mod rlqs_admin;
mod rlqs_claims;
mod rlqs_hostile;
mod server;
mod statsd;
mod store_contract;
mod tracing;
mod usage_budgets;
mod valkey;
mod xds;
