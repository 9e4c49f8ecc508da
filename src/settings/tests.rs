// Why one long file: every setting's parsing and its errors, one test each, sharing the
// environment and flag builders.
use super::*;
use crate::store::redis::RedisKind;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// The settings these arguments give, or the error (clap's or the resolution's) as text.
fn settings(args: &[&str]) -> Result<Settings, String> {
    let mut argv = vec!["sluice"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    cli.serve.into_settings().map_err(|e| e.to_string())
}

#[test]
fn defaults_follow_the_reference_ports_and_layout() {
    let s = settings(&[]).unwrap();
    assert_eq!(s.backend, Backend::Memory);
    // The reference's defaults, unless the test process's environment overrides them.
    let overridden = [
        "HOST",
        "PORT",
        "GRPC_HOST",
        "GRPC_PORT",
        "BACKEND_TYPE",
        "REDIS_URL",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if !overridden {
        assert_eq!(s.grpc_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(s.http_addr.to_string(), "0.0.0.0:8080");
    }
}

#[test]
fn redis_url_selects_the_redis_backend() {
    let s = settings(&[
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-auth",
        "user:secret",
    ])
    .unwrap();
    assert_eq!(s.backend, Backend::Redis);
    let redis = s.redis.unwrap();
    assert_eq!(redis.kind, RedisKind::Single);
    assert_eq!(redis.auth.as_deref(), Some("user:secret"));
    let s = settings(&["--backend", "memory", "--redis-url", "127.0.0.1:6379"]).unwrap();
    assert_eq!(s.backend, Backend::Memory);
    let s = settings(&["--redis-url", "a:1,b:2,c:3", "--redis-type", "CLUSTER"]).unwrap();
    assert_eq!(s.redis.unwrap().kind, RedisKind::Cluster);
}

#[test]
fn flags_take_addresses_and_the_runtime_layout() {
    let s = settings(&[
        "--grpc-addr",
        "127.0.0.1:9001",
        "--http-addr",
        "127.0.0.1:9002",
        "--runtime-root",
        "/srv/rt",
        "--runtime-subdirectory",
        "ratelimit",
    ])
    .unwrap();
    assert_eq!(s.grpc_addr, "127.0.0.1:9001".parse().unwrap());
    assert_eq!(s.http_addr, "127.0.0.1:9002".parse().unwrap());
    assert_eq!(s.config_dir, PathBuf::from("/srv/rt/ratelimit/config"));
}

#[test]
fn bad_values_name_the_setting() {
    let err = settings(&["--near-limit-ratio", "1.5"]).unwrap_err();
    assert!(err.to_string().contains("NEAR_LIMIT_RATIO"), "{err}");
    let err = settings(&["--grpc-addr", "nonsense"]).unwrap_err();
    assert!(err.to_string().contains("--grpc-addr"), "{err}");
    let err = settings(&["--log-level", "loud"]).unwrap_err();
    assert!(err.to_string().contains("LOG_LEVEL"), "{err}");
    let err = settings(&["--backend", "redis", "--redis-url", ""]).unwrap_err();
    assert!(err.to_string().contains("REDIS_URL"), "{err}");
    let err = settings(&["--backend", "redis", "--redis-url", "redis://"]).unwrap_err();
    assert!(err.to_string().contains("REDIS_URL"), "{err}");
    let err =
        settings(&["--redis-type", "sentinel", "--redis-url", "127.0.0.1:26379"]).unwrap_err();
    assert!(err.to_string().contains("master-name"), "{err}");
    let err = settings(&["--limit-reset-header", "Rate Limit"]).unwrap_err();
    assert!(err.to_string().contains("LIMIT_RESET_HEADER"), "{err}");
    let err = settings(&["--redis-deadline", "0ms"]).unwrap_err();
    assert!(err.to_string().contains("REDIS_DEADLINE"), "{err}");
}

#[test]
fn booleans_and_durations_parse_like_the_reference() {
    assert_eq!(parse_bool("True"), Ok(true));
    assert_eq!(parse_bool("0"), Ok(false));
    assert!(parse_bool("maybe").is_err());
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn connection_bounds_default_like_the_tests_take_flags_and_refuse_zero() {
    use crate::net::connection::ConnectionLimits;
    let overridden = [
        "ADMIN_MAX_CONNECTIONS",
        "ADMIN_HEADER_TIMEOUT",
        "GRPC_MAX_CONNECTIONS",
        "GRPC_HANDSHAKE_TIMEOUT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if !overridden {
        let (s, t) = (settings(&[]).unwrap(), Settings::for_tests("."));
        assert_eq!(s.admin_connections, t.admin_connections);
        assert_eq!(s.grpc_connections, t.grpc_connections);
    }
    let s = settings(&[
        "--admin-max-connections",
        "32",
        "--admin-header-timeout",
        "2s",
        "--grpc-max-connections",
        "500",
        "--grpc-handshake-timeout",
        "3s",
    ])
    .unwrap();
    let limits = |max_connections, secs| ConnectionLimits {
        max_connections,
        handshake_timeout: Duration::from_secs(secs),
    };
    assert_eq!(s.admin_connections, limits(32, 2));
    assert_eq!(s.grpc_connections, limits(500, 3));
    let err = settings(&["--admin-max-connections", "0"]).unwrap_err();
    assert!(err.to_string().contains("ADMIN_MAX_CONNECTIONS"), "{err}");
    let err = settings(&["--grpc-handshake-timeout", "0s"]).unwrap_err();
    assert!(err.to_string().contains("GRPC_HANDSHAKE_TIMEOUT"), "{err}");
}

#[test]
fn a_tiny_local_cache_gets_the_reference_floor_and_zero_stays_off() {
    let keys = |bytes: &str| {
        settings(&["--local-cache-size-in-bytes", bytes])
            .unwrap()
            .local_cache_keys
    };
    // The reference's tests use 1000 bytes; its cache library allocates 512 KiB at least.
    assert_eq!(keys("1000"), 512 * 1024 / 128);
    assert_eq!(keys("0"), 0);
    assert_eq!(keys("16777216"), 16_777_216 / 128);
}

#[test]
fn redis_persecond_takes_its_own_redis_and_names_what_is_missing() {
    let s = settings(&[
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-pool-size",
        "3",
        "--redis-persecond=true",
        "--redis-persecond-url",
        "127.0.0.1:6380",
        "--redis-persecond-auth",
        "secret",
    ])
    .unwrap();
    let main = s.redis.unwrap();
    let fast = s.redis_per_second.unwrap();
    assert_eq!((main.url.as_str(), main.connections), ("127.0.0.1:6379", 3));
    assert_eq!(fast.url, "127.0.0.1:6380");
    assert_eq!(fast.auth.as_deref(), Some("secret"));
    assert_eq!(main.auth, None);
    assert_eq!(fast.connections, 2);

    let missing = settings(&["--redis-url", "127.0.0.1:6379", "--redis-persecond=true"]);
    assert!(
        missing.unwrap_err().contains("REDIS_PERSECOND_URL"),
        "the error names the missing setting"
    );
    let memory = settings(&["--backend", "memory", "--redis-persecond=true"]);
    assert!(memory.unwrap_err().contains("REDIS_PERSECOND"));
}

#[test]
fn a_region_names_its_root_and_the_root_its_region() {
    let s = settings(&[
        "--redis-url",
        "127.0.0.1:6379",
        "--region",
        "eu-west",
        "--root-redis-url",
        "rediss://root.example:6380",
        "--root-deadline",
        "300ms",
        "--root-wait-replicas",
        "1",
    ])
    .unwrap();
    assert_eq!(s.redis.as_ref().unwrap().wait_replicas, 0);
    let (root, region) = s.root.unwrap();
    assert_eq!(root.wait_replicas, 1);
    assert_eq!(root.url, "rediss://root.example:6380");
    assert_eq!(root.call_timeout, Duration::from_millis(300));
    assert_eq!(region.region, "eu-west");
    assert_eq!(region.period, Duration::from_secs(2));
    assert_eq!(region.lease_period, s.lease.period);

    let no_region = settings(&["--redis-url", "127.0.0.1:6379", "--root-redis-url", "r:1"]);
    let error = no_region.unwrap_err();
    assert!(
        error.contains("ROOT_REDIS_URL") && error.contains("REGION"),
        "{error}"
    );
    let no_root = settings(&["--redis-url", "127.0.0.1:6379", "--region", "eu-west"]);
    assert!(no_root.unwrap_err().contains("ROOT_REDIS_URL"));
    let no_region_store = settings(&["--region", "eu", "--root-redis-url", "r:1"]);
    assert!(no_region_store.unwrap_err().contains("REDIS_URL"));
    assert!(settings(&["--partition-share", "1.5"]).is_err());
}

#[test]
fn every_boolean_is_a_switch_of_one_shape() {
    let s = settings(&[]).unwrap();
    assert!(s.response.retry_after, "on by default");
    assert!(!s.limiter.shadow_mode && !s.merge_domains);
    let s = settings(&[
        "--shadow-mode",
        "--retry-after-header=false",
        "--merge-domain-config=1",
        "--quota-mode=t",
    ])
    .unwrap();
    assert!(s.limiter.shadow_mode && s.merge_domains && s.limiter.quota_mode);
    assert!(!s.response.retry_after);
    let s = settings(&["--redis-tls", "true", "--shadow-mode", "false"]).unwrap();
    assert!(!s.limiter.shadow_mode);
    let err = settings(&["--redis-tls=maybe"]).unwrap_err();
    assert!(err.contains("--redis-tls"), "{err}");
}

#[test]
fn counts_of_zero_are_refused_with_the_flag_named() {
    for flag in [
        "--redis-pool-size",
        "--grpc-max-in-flight",
        "--max-request-descriptors",
        "--redis-breaker-failures",
        "--memory-max-keys",
        "--failure-mode-local-instances",
    ] {
        let err = settings(&[flag, "0"]).unwrap_err();
        assert!(
            err.contains(flag) && err.contains("must be at least 1"),
            "{err}"
        );
    }
}

/// The reference's own list of variables (a fixture taken from its `settings.go`).
fn reference_variables() -> Vec<String> {
    include_str!("../../tests/fixtures/reference/settings.env")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split('=').next().unwrap().to_owned())
        .collect()
}

#[test]
fn every_reference_variable_is_read_or_named_and_in_the_readme() {
    use super::reference::{Support, VARIABLES};
    let ours: Vec<&str> = VARIABLES.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        ours,
        reference_variables(),
        "the table follows the reference's list"
    );
    let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    let envs: Vec<String> = command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    for (name, support) in VARIABLES {
        let read = envs.iter().any(|e| e == name);
        assert_eq!(
            read,
            *support == Support::Read,
            "{name}: a serve setting's variable exactly when the table says Read"
        );
    }
    let table = include_str!("../../docs/configuration/settings.md");
    for name in ours {
        assert!(
            table.contains(&format!("| `{name}` |")),
            "docs/configuration/settings.md's table of reference variables has no row for {name}"
        );
    }
}

#[test]
fn the_audit_names_what_is_set_and_not_acted_on() {
    use super::reference::audit;
    let env = |set: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            set.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    // Envoy Gateway's switches that are off, read variables and empty values: nothing to say.
    let quiet = audit(env(&[
        ("USE_STATSD", "false"),
        ("TRACING_ENABLED", "0"),
        ("GRPC_PORT", "8081"),
        ("MEMCACHE_HOST_PORT", ""),
    ]));
    assert!(
        quiet.unsupported.is_empty() && quiet.not_needed.is_empty(),
        "{quiet:?}"
    );
    let loud = audit(env(&[
        ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
        ("MEMCACHE_SRV", "_memcache._tcp.example"),
        ("MEMCACHE_HOST_PORT", "memcache:11211"),
        ("REDIS_SOCKET_TYPE", "tcp"),
    ]));
    assert_eq!(loud.unsupported, ["MEMCACHE_HOST_PORT", "MEMCACHE_SRV"]);
    assert_eq!(loud.not_needed.len(), 1);
    assert_eq!(loud.not_needed[0].0, "REDIS_SOCKET_TYPE");
}

#[test]
fn config_type_is_file_or_xds_and_nothing_else() {
    assert!(settings(&["--config-type", "file"]).unwrap().xds.is_none());
    let xds = settings(&["--config-type", "GRPC_XDS_SOTW"])
        .unwrap()
        .xds
        .unwrap();
    assert_eq!(
        (xds.server_url.as_str(), xds.node_id.as_str()),
        ("localhost:18000", "default"),
        "the reference's defaults"
    );
    assert_eq!(xds.backoff_initial, Duration::from_secs(10));
    let err = settings(&["--config-type", "ADS"]).unwrap_err();
    assert!(err.contains("CONFIG_TYPE") && err.contains("ADS"), "{err}");
    let err = settings(&[
        "--config-type",
        "GRPC_XDS_SOTW",
        "--config-grpc-xds-node-metadata",
        "zone",
    ])
    .unwrap_err();
    assert!(err.contains("CONFIG_GRPC_XDS_NODE_METADATA"), "{err}");
}

#[test]
fn counter_resets_are_off_unless_a_token_file_or_a_client_name_enables_them() {
    assert_eq!(settings(&[]).unwrap().admin_reset, Default::default());
    let dir = std::env::temp_dir().join(format!("sluice-settings-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "t\n").unwrap();
    let token = token.to_str().unwrap();
    let s = settings(&["--admin-reset-token-file", token]).unwrap();
    assert_eq!(
        s.admin_reset.token_file.as_deref(),
        Some(std::path::Path::new(token))
    );
    // A token file that cannot be used stops start-up, naming the setting.
    let missing = settings(&["--admin-reset-token-file", "/nonexistent/token"]).unwrap_err();
    assert!(missing.contains("ADMIN_RESET_TOKEN_FILE"), "{missing}");
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let empty = settings(&["--admin-reset-token-file", empty.to_str().unwrap()]).unwrap_err();
    assert!(empty.contains("empty"), "{empty}");
    // A client certificate name needs a mutual-TLS port to come from.
    let no_tls = settings(&["--admin-reset-client-san", "ops.example"]).unwrap_err();
    assert!(
        no_tls.contains("ADMIN_RESET_CLIENT_SAN") && no_tls.contains("GRPC_CLIENT_TLS_CACERT"),
        "{no_tls}"
    );
}

#[test]
fn the_reference_key_layout_needs_redis() {
    let redis = settings(&[
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--redis-key-format",
        "reference",
    ])
    .unwrap();
    assert!(redis.limiter.reference_keys);
    assert_eq!(
        redis.redis.unwrap().expiration_jitter,
        std::time::Duration::from_secs(300)
    );
    let memory = settings(&["--backend", "memory", "--redis-key-format", "reference"]).unwrap();
    assert!(!memory.limiter.reference_keys);
    let bad = settings(&["--redis-key-format", "go"]).unwrap_err();
    assert!(bad.contains("sluice") && bad.contains("reference"), "{bad}");
}

#[test]
fn rlqs_ttls_are_whole_seconds_of_at_least_two_and_every_process_claims_apart() {
    let s = settings(&["--rlqs-assignment-ttl", "30s", "--rlqs-max-streams", "5"]).unwrap();
    assert_eq!(s.rlqs.assignment_ttl, Duration::from_secs(30));
    assert_eq!(s.rlqs.max_streams, 5);
    let fraction = settings(&["--rlqs-assignment-ttl", "2500ms"]).unwrap_err();
    assert!(
        fraction.contains("--rlqs-assignment-ttl") && fraction.contains("whole seconds"),
        "{fraction}"
    );
    let short = settings(&["--rlqs-assignment-ttl", "1s"]).unwrap_err();
    assert!(short.contains("at least 2s"), "{short}");
    let zero = settings(&["--rlqs-max-buckets", "0"]).unwrap_err();
    assert!(zero.contains("--rlqs-max-buckets"), "{zero}");
    // Claims are per process: the instance's name and a nonce, so that a restarted process
    // with the same name (a pod's) never takes over the claims of the one before.
    let s = settings(&["--lease-instance-id", "pod-1"]).unwrap();
    let nonce = s
        .rlqs
        .instance
        .strip_prefix("pod-1-")
        .expect("the name first");
    assert_eq!(nonce.len(), 8, "{}", s.rlqs.instance);
}

#[test]
fn an_empty_environment_variable_is_read_as_unset() {
    use clap::CommandFactory;
    use std::ffi::{OsStr, OsString};
    let reads = |command: &clap::Command, name: &str| {
        command
            .get_arguments()
            .any(|a| a.get_env().is_some_and(|v| v == name))
    };
    // A templated manifest that leaves every value out: no argument reads its variable, so
    // each takes its default (DEBUG_PORT= leaves the debug listener off).
    let all_empty = |_: &OsStr| Some(OsString::new());
    let cli = super::empty_env_is_unset(crate::cli::Cli::command(), &all_empty);
    for sub in ["serve", "validate"] {
        let command = cli.find_subcommand(sub).unwrap();
        let still: Vec<_> = command
            .get_arguments()
            .filter_map(|a| a.get_env())
            .collect();
        assert!(still.is_empty(), "{sub} still reads {still:?}");
    }
    // A variable with a value is still read; one not set at all reads as before.
    let debug_port = |name: &OsStr| (name == "DEBUG_PORT").then(|| OsString::from("6071"));
    let command = super::empty_env_is_unset(
        <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve")),
        &debug_port,
    );
    assert!(reads(&command, "DEBUG_PORT") && reads(&command, "DEBUG_HOST"));
    // Where the value cannot be done without, the error names the variable.
    let err = settings(&["--backend", "redis", "--redis-url", ""]).unwrap_err();
    assert!(err.contains("REDIS_URL"), "{err}");
}
