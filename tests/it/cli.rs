// Why one long file: the binary as operators run it, one behaviour per test, sharing the command
// helpers at the top.
//! The `sluice` binary as operators run it: exit codes, messages, signals.

use std::process::Command;

use crate::common::SluiceProcess;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

const CONFIG: &str = "domain: cli\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

fn sluice(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("BACKEND_TYPE")
        .output()
        .unwrap()
}

#[test]
fn a_bad_setting_exits_64_with_one_line_naming_it() {
    let dir = crate::common::config_dir("cli-bad-setting", &[("c.yaml", CONFIG)]);
    let cases: [(&[&str], &str); 4] = [
        (&["--grpc-addr", "not-an-address"], "--grpc-addr"),
        (&["--near-limit-ratio", "2"], "NEAR_LIMIT_RATIO"),
        (&["--shadow-mode=perhaps"], "--shadow-mode"),
        (
            &[
                "--redis-type",
                "cluster",
                "--redis-url",
                "127.0.0.1:1",
                "--redis-wait-replicas",
                "1",
            ],
            "REDIS_WAIT_REPLICAS is for a single Redis or Sentinel",
        ),
    ];
    for (args, named) in cases {
        let mut argv = vec!["serve", "--config", dir.to_str().unwrap()];
        argv.extend_from_slice(args);
        let out = sluice(&argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

#[test]
fn a_bad_environment_variable_is_named_too() {
    let dir = crate::common::config_dir("cli-bad-env", &[("c.yaml", CONFIG)]);
    let serve_with = |var: &str, value: &str| {
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&dir)
            .env(var, value)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = serve_with("GRPC_PORT", "eighty");
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("'eighty'")
            && stderr.contains("--grpc-port")
            && stderr.contains("environment variable GRPC_PORT"),
        "{stderr}"
    );
    let (code, stderr) = serve_with("SHADOW_MODE", "perhaps");
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("environment variable SHADOW_MODE"),
        "{stderr}"
    );
}

#[test]
fn an_invalid_config_stops_startup_with_every_error() {
    let dir = crate::common::config_dir(
        "cli-bad-config",
        &[
            (
                "a.yaml",
                "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            ),
            (
                "b.yaml",
                "domain: b\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n",
            ),
        ],
    );
    let out = sluice(&[
        "serve",
        "--config",
        dir.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(
            "a.yaml:4:18: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("config error, unknown key 'ratelimit'"),
        "{stderr}"
    );
}

#[test]
fn a_missing_config_directory_is_a_startup_error() {
    let out = sluice(&["serve", "--config", "/nonexistent/sluice-config"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("/nonexistent/sluice-config"), "{stderr}");
}

#[test]
fn check_prints_the_answer_and_exits_by_code_then_sigterm_exits_zero() {
    let dir = crate::common::config_dir("cli-serve", &[("c.yaml", CONFIG)]);
    let mut served = SluiceProcess::spawn(&dir, &[]);
    let check = |value: &str| {
        sluice(&[
            "check",
            "--addr",
            &served.grpc,
            "--domain",
            "cli",
            "--descriptor",
            &format!("user={value}"),
        ])
    };
    let first = check("ann");
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("OK\n"), "{stdout}");
    assert!(stdout.contains("limit=1/HOUR remaining=0"), "{stdout}");
    let second = check("ann");
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert_eq!(second.status.code(), Some(2), "{stdout}");
    assert!(stdout.starts_with("OVER_LIMIT\n"), "{stdout}");
    assert!(stdout.contains("header retry-after:"), "{stdout}");

    let bad = sluice(&[
        "check",
        "--addr",
        &served.grpc,
        "--domain",
        "cli",
        "--descriptor",
        "nokeyvalue",
    ]);
    assert_eq!(bad.status.code(), Some(64));

    served.terminate();
    let status = served.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn bench_reports_throughput_and_latency() {
    let dir = crate::common::config_dir(
        "cli-bench",
        &[(
            "b.yaml",
            "domain: bench\ndescriptors:\n  - key: bench_key\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n",
        )],
    );
    let mut served = SluiceProcess::spawn(&dir, &[]);
    let out = sluice(&[
        "bench",
        "--addr",
        &served.grpc,
        "--duration",
        "300ms",
        "--warmup",
        "0s",
        "--keys",
        "100",
        "--descriptors",
        "2",
        "--concurrency",
        "4",
    ]);
    let stdout = succeeded(&out, "bench");
    assert!(
        stdout.contains("req/s (0 over limit, 0 errors)"),
        "{stdout}"
    );
    assert!(stdout.contains("p99 "), "{stdout}");
    // --json: one object scripts read instead of the text.
    let out = sluice(&[
        "bench",
        "--addr",
        &served.grpc,
        "--duration",
        "300ms",
        "--warmup",
        "0s",
        "--json",
    ]);
    let stdout = succeeded(&out, "bench --json");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert!(report["requests"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(report["per_second"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["p99"].as_u64().unwrap() >= report["p50"].as_u64().unwrap());
    served.terminate();
    served.child.wait().unwrap();
}

#[tokio::test]
async fn a_second_signal_skips_the_shutdown_delay() {
    use crate::common::health::{Health, Status};
    let dir = crate::common::config_dir("cli-second-signal", &[("c.yaml", CONFIG)]);
    let mut served = SluiceProcess::spawn(&dir, &["--shutdown-delay", "600s"]);
    let health = Health::connect(&served.grpc).await;
    served.terminate();
    // The first signal starts the ten-minute delay: health checks fail, the process stays.
    crate::common::eventually("health reports NOT_SERVING", || async {
        health.status("").await == Status::NotServing
    })
    .await;
    assert!(served.child.try_wait().unwrap().is_none());
    drop(health);

    served.terminate();
    let mut status = None;
    crate::common::eventually("the second signal cuts the delay short", || {
        status = served.child.try_wait().unwrap();
        std::future::ready(status.is_some())
    })
    .await;
    assert_eq!(status.unwrap().code(), Some(0));
}

#[test]
fn check_and_bench_reach_a_server_that_requires_mutual_tls() {
    let certs = crate::common::certs::fresh("cli-tls-certs");
    let file = |name: &str| certs.join(name).to_str().unwrap().to_owned();
    let dir = crate::common::config_dir("cli-tls", &[("c.yaml", CONFIG)]);
    let mut served = SluiceProcess::spawn(
        &dir,
        &[
            "--grpc-server-use-tls",
            "--grpc-server-tls-cert",
            &file("server.crt"),
            "--grpc-server-tls-key",
            &file("server.key"),
            "--grpc-client-tls-cacert",
            &file("ca.crt"),
        ],
    );
    let with = |extra: &[&str]| {
        let mut args = vec![
            "check",
            "--addr",
            &served.grpc,
            "--domain",
            "cli",
            "--descriptor",
            "user=tls",
        ];
        args.extend(extra);
        sluice(&args)
    };
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let trusted = [
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-server-name",
        "localhost",
    ];

    let stdout = succeeded(&with(&trusted), "check");
    assert!(stdout.starts_with("OK\n"), "{stdout}");
    // Without a client certificate, or without TLS at all, the server lets nobody in.
    assert_eq!(with(&trusted[..2]).status.code(), Some(1));
    assert_eq!(with(&[]).status.code(), Some(1));
    // A key without its certificate is a usage error.
    assert_eq!(with(&["--tls-key", &key]).status.code(), Some(64));

    let mut args = vec![
        "bench",
        "--addr",
        &served.grpc,
        "--domain",
        "cli",
        "--key",
        "user",
    ];
    args.extend([
        "--duration",
        "200ms",
        "--warmup",
        "0s",
        "--concurrency",
        "4",
    ]);
    args.extend(trusted);
    let stdout = succeeded(&sluice(&args), "bench");
    assert!(stdout.contains("req/s"), "{stdout}");
    served.terminate();
    assert_eq!(served.child.wait().unwrap().code(), Some(0));
}

/// Envoy Gateway's environment for the reference (its TLS variables, `GRPC_SERVER_TLS_CA_CERT`
/// for the client CA, switches it turns off): mutual TLS is required, and what Sluice does not
/// support is named in one warning line.
#[test]
fn envoy_gateways_tls_variables_require_client_certificates() {
    let certs = crate::common::certs::fresh("cli-eg-certs");
    let file = |name: &str| certs.join(name).to_str().unwrap().to_owned();
    let dir = crate::common::config_dir("cli-eg", &[("c.yaml", CONFIG)]);
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let served = SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_SERVER_TLS_CA_CERT", &ca),
            ("USE_STATSD", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "ratelimit"),
        ],
    );
    // Every variable of Envoy Gateway's Deployment is read (tracing included: its collector
    // is absent here, which must cost the decisions below nothing).
    served.assert_no_unsupported_variable();
    let check = |extra: &[&str]| {
        let mut args = vec!["check", "--addr", &served.grpc, "--domain", "cli"];
        args.extend(["--descriptor", "user=eg", "--tls-ca", &ca]);
        args.extend(["--tls-server-name", "localhost"]);
        args.extend(extra);
        sluice(&args).status.code()
    };
    let (client_cert, client_key) = (file("client.crt"), file("client.key"));
    assert_eq!(
        check(&["--tls-cert", &client_cert, "--tls-key", &client_key]),
        Some(0)
    );
    assert_eq!(check(&[]), Some(1), "no client certificate, no answer");
}

#[test]
fn the_shipped_configs_validate() {
    // config/ is what the README's first command serves; deploy/ ships two more sets.
    for dir in ["config", "deploy/envoy/sluice-config"] {
        let path = crate::common::repo_path(dir);
        succeeded(&sluice(&["validate", path.to_str().unwrap()]), dir);
    }
}

#[test]
fn validate_warns_of_a_global_rule_that_fails_open_in_a_cut_off_region() {
    let yaml = "domain: g\ndescriptors:\n  - key: tenant\n    scope: global\n    rate_limit: {unit: minute, requests_per_unit: 600000}\n  - key: team\n    scope: global\n    failure_mode: deny\n    rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: bucket\n    scope: global\n    failure_mode: deny\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 500}\n";
    let dir = crate::common::config_dir("cli-validate-global", &[("g.yaml", yaml)]);
    let output = sluice(&["validate", dir.to_str().unwrap()]);
    succeeded(&output, "validate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning: g.tenant: scope: global without a failure_mode"),
        "{stderr}"
    );
    // The rule that denies is not warned about.
    assert!(!stderr.contains("g.team"), "{stderr}");
    // Each global limit's bounds: over by failure mode, and what a region holds at most at
    // the limit's own rate (600,000 a minute is 10,000 a second: a low-water mark of 2.5 s
    // with a round trip of a second, an ask of 2 s and blocks of 1 s: 55,000).
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("g.team: scope: global, 60 per minute: never over;"),
        "{stdout}"
    );
    assert!(
        stdout.contains("g.tenant: scope: global, 600000 per minute: never over while the regions reach the root; a cut region fails open")
            && stdout.contains("holds at most about 55000 units"),
        "{stdout}"
    );
    // A token bucket's: the burst bounds what the levels hold together (100 a second: 250
    // low water, 200 asked, 100 in blocks); under contention the root keeps a second's refill
    // (half a region lease period of 2 s).
    assert!(
        stdout.contains("g.bucket: scope: global, token bucket of 100 per second, burst 500: never over (at most the burst plus the rate over any time); a region holds up to about 500 tokens")
            && stdout.contains("the root keeping about 100 tokens"),
        "{stdout}"
    );
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    use std::io::{BufRead, BufReader};
    let dir = crate::common::config_dir("cli-json-logs", &[("c.yaml", CONFIG)]);
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&dir)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("LOG_FORMAT", "json")
        .env("LOG_LEVEL", "info")
        .env_remove("REDIS_URL")
        .env_remove("BACKEND_TYPE")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let event: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(event["level"], "INFO", "{line}");
        let message = event["fields"]["message"].as_str().unwrap().to_owned();
        let serving = message == "serving";
        if serving {
            assert!(
                event["fields"]["grpc"]
                    .as_str()
                    .unwrap()
                    .starts_with("127.0.0.1:")
            );
        }
        seen.push(message);
        if serving {
            break;
        }
    }
    assert_eq!(seen, ["rate limit config loaded", "serving"]);
    let _ = child.kill();
    let _ = child.wait();
}

/// The standard output of a run that must exit 0; its output and errors otherwise.
fn succeeded(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Envoy Gateway starts the reference as `/bin/ratelimit` with no arguments: the same binary
/// under that name serves (its settings from the environment), and its subcommands still work.
#[test]
fn run_as_ratelimit_without_a_subcommand_it_serves() {
    let dir = crate::common::config_dir("cli-ratelimit", &[("c.yaml", CONFIG)]);
    let bin = crate::common::temp_dir("cli-ratelimit-bin").join("ratelimit");
    std::os::unix::fs::symlink(BIN, &bin).unwrap();
    let mut child = Command::new(&bin)
        .env("RUNTIME_ROOT", dir.parent().unwrap())
        .env("RUNTIME_SUBDIRECTORY", dir.file_name().unwrap())
        .env("RUNTIME_APPDIRECTORY", ".")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("LOG_LEVEL", "info")
        .env_remove("REDIS_URL")
        .env_remove("BACKEND_TYPE")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead as _;
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let serving = stderr
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("serving"));
    let _ = child.kill();
    let _ = child.wait();
    assert!(serving, "ratelimit without arguments did not serve");
    let out = Command::new(&bin)
        .arg("validate")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

/// `DEBUG_HOST`/`DEBUG_PORT`: the reference's debug listener, where operators curl
/// `:6070/rlconfig`, serves the admin endpoints too.
#[tokio::test]
async fn the_debug_listener_serves_rlconfig() {
    let dir = crate::common::config_dir("cli-debug", &[("c.yaml", CONFIG)]);
    let port = crate::common::redis::free_port();
    let served = SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", &port.to_string()),
        ],
    );
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let (status, body) = crate::common::http_get(addr, "/rlconfig").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("cli.user"), "{body}");
    drop(served);
}

/// A templated manifest writes `NAME: ""` for each value it leaves out: under the reference's
/// name, with every variable the reference reads set empty, Sluice serves on its defaults
/// (`DEBUG_HOST=`/`DEBUG_PORT=` leave the debug listener off); where a value cannot be done
/// without, the error names its variable.
#[test]
fn empty_environment_variables_are_unset() {
    let dir = crate::common::config_dir("cli-empty-env", &[("c.yaml", CONFIG)]);
    let empty: Vec<(&str, &str)> = sluice::settings::reference::VARIABLES
        .iter()
        // The test reads the "serving" line, logged at info.
        .filter(|(name, _)| *name != "LOG_LEVEL")
        .map(|(name, _)| (*name, ""))
        .collect();
    assert!(empty.iter().any(|(name, _)| *name == "DEBUG_PORT"));
    let served = SluiceProcess::spawn_as_reference(&dir, &[], &empty);
    assert!(
        !served.logged_at_startup("on the debug listener too"),
        "{:?}",
        served.startup_log
    );
    drop(served);
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&dir)
        .env("BACKEND_TYPE", "redis")
        .env("REDIS_URL", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("(REDIS_URL)"), "{stderr}");
}

/// `deploy/envoy-gateway/`: the Helm values put Sluice's image in the rate limit Deployment
/// with a Redis backend, and the policy example is a global limit.
#[test]
fn the_envoy_gateway_example_uses_the_sluice_image_and_a_global_limit() {
    let read = |name: &str| -> serde_yaml::Value {
        let text = std::fs::read_to_string(format!("deploy/envoy-gateway/{name}")).unwrap();
        serde_yaml::from_str(&text).unwrap()
    };
    let values = read("envoy-gateway-values.yaml");
    let eg = &values["config"]["envoyGateway"];
    let image = eg["provider"]["kubernetes"]["rateLimitDeployment"]["container"]["image"]
        .as_str()
        .unwrap();
    assert!(image.contains("sluice"), "{image}");
    assert_eq!(eg["rateLimit"]["backend"]["type"].as_str(), Some("Redis"));
    let policy = read("backend-traffic-policy.yaml");
    assert_eq!(policy["kind"].as_str(), Some("BackendTrafficPolicy"));
    assert_eq!(policy["spec"]["rateLimit"]["type"].as_str(), Some("Global"));
}

/// `GRPC_UDS`: gRPC on a unix socket instead of TCP.
#[tokio::test]
async fn grpc_can_listen_on_a_unix_socket() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let dir = crate::common::config_dir("cli-uds", &[("c.yaml", CONFIG)]);
    let socket = crate::common::temp_dir("cli-uds-socket").join("sluice.sock");
    let served =
        SluiceProcess::spawn_with_env(&dir, &[], &[("GRPC_UDS", socket.to_str().unwrap())]);
    assert_eq!(served.grpc, format!("unix:{}", socket.display()));
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let request =
        crate::common::request("cli", vec![crate::common::descriptor(&[("user", "uds")])]);
    let answer = client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.statuses[0].limit_remaining, 0,
        "one an hour, now used"
    );
}

/// Stats settings that would corrupt every flush stop start-up, naming the variable.
#[test]
fn stats_tags_that_would_break_a_line_stop_startup() {
    let dir = crate::common::config_dir("cli-bad-tags", &[("c.yaml", CONFIG)]);
    let huge = format!("zone:{}", "x".repeat(100_000));
    let cases: [(&[(&str, &str)], &str); 3] = [
        (
            &[("USE_STATSD", "true"), ("EXTRA_TAGS", "zone:eu|#evil:1")],
            "EXTRA_TAGS",
        ),
        (
            &[("USE_STATSD", "true"), ("EXTRA_TAGS", &huge)],
            "EXTRA_TAGS",
        ),
        (
            &[
                ("USE_DOG_STATSD", "true"),
                ("USE_DOG_STATSD_MOGRIFIERS", "M"),
                ("DOG_STATSD_MOGRIFIER_M_PATTERN", "^a\\.(.*)$"),
                ("DOG_STATSD_MOGRIFIER_M_NAME", "x.$9"),
            ],
            "DOG_STATSD_MOGRIFIER_M_NAME",
        ),
    ];
    for (env, named) in cases {
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&dir)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{named}: {stderr}");
        assert!(stderr.contains(named), "{stderr}");
    }
}

/// The reference's mogrifier templates expand `$1`, `$2`, ... only: a template naming a group
/// (`${domain}`) would send its `$` and braces as written, so it stops start-up, naming the
/// variable, the template and the `$n` to write.
#[test]
fn a_mogrifier_naming_a_group_by_name_stops_startup() {
    let dir = crate::common::config_dir("cli-named-group", &[("c.yaml", CONFIG)]);
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&dir)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("USE_DOG_STATSD", "true")
        .env("USE_DOG_STATSD_MOGRIFIERS", "HITS")
        .env(
            "DOG_STATSD_MOGRIFIER_HITS_PATTERN",
            r"^ratelimit\.service\.rate_limit\.(?P<domain>[^.]+)\.(.*)$",
        )
        .env("DOG_STATSD_MOGRIFIER_HITS_NAME", "ratelimit.$2")
        .env("DOG_STATSD_MOGRIFIER_HITS_TAGS", "domain:${domain}")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A server that accepts the template runs on: stop it rather than wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice serve started with a template naming a group");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("DOG_STATSD_MOGRIFIER_HITS_TAGS")
            && stderr.contains("'${domain}'")
            && stderr.contains("write $1"),
        "{stderr}"
    );
}

/// `sluice top` over two instances: one list of each rule's refused keys, a key's counts
/// added up over the instances (each instance's floor standing in where it does not list the
/// key, 0 here); the text form names the rule; an instance that cannot be reached is an error
/// naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_merges_the_refused_keys_of_several_instances() {
    const RULES: &str = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let one = crate::common::TestServer::start(&[("t.yaml", RULES)]).await;
    let two = crate::common::TestServer::start(&[("t.yaml", RULES)]).await;
    for (server, key, times) in [
        (&one, "user=a", 4),
        (&one, "user=b", 2),
        (&two, "user=a", 3),
        (&two, "user=c", 2),
    ] {
        for _ in 0..times {
            server.domain("t").hit(key).await;
        }
    }
    let (a, b) = (one.http_addr.to_string(), two.http_addr.to_string());
    let out = tokio::task::spawn_blocking(move || {
        sluice(&["top", "--addr", &a, "--addr", &b, "--domain", "t", "--json"])
    })
    .await
    .unwrap();
    let stdout = succeeded(&out, "top --json");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert_eq!(json["instances"], 2, "{json}");
    let window = &json["rules"][0]["windows"][0];
    let keys: Vec<(&str, u64)> = window["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].as_str().unwrap(), k["refused"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        keys,
        [("user=a", 5), ("user=b", 1), ("user=c", 1)],
        "{json}"
    );
    assert_eq!(window["refused_hits"], 7, "{json}");
    let a = one.http_addr.to_string();
    let out = tokio::task::spawn_blocking(move || sluice(&["top", "--addr", &a]))
        .await
        .unwrap();
    let text = succeeded(&out, "top");
    assert!(text.contains("t.user (window 3600.0 s)"), "{text}");
    assert!(text.contains("user=a"), "{text}");
    let out = tokio::task::spawn_blocking(|| sluice(&["top", "--addr", "127.0.0.1:1"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"),
        "{out:?}"
    );
}
