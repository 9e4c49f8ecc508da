//! Counter resets through the admin API, against a running server: off unless enabled, the
//! exact bearer token (re-read when it rotates), a client certificate for the named SAN on
//! the mutual-TLS port, every attempt counted; and the CLI that sends them.

use crate::common::admin::{admin, descriptor, settings, token_file, with_token};
use crate::common::certs::{server_tls, tls_endpoint};
use crate::common::{SluiceProcess, TestServer, config_dir, http, http_get, metric};
use sluice::admin::ResetSettings;
use sluice::admin::api::proto::{CountersRequest, admin_client::AdminClient};
use tonic::Code;

#[tokio::test]
async fn resets_are_refused_unless_enabled_and_need_the_token() {
    // Off by default: nobody can reset, on either port.
    let server = TestServer::start_with(settings(ResetSettings::default())).await;
    let m = server.domain("m");
    assert!(m.hit("k=exact").await.is_ok());
    let request = CountersRequest {
        domain: "m".into(),
        descriptor: Some(descriptor(&[("k", "exact")])),
    };
    let mut client = admin(&server).await;
    let mut attempt = tonic::Request::new(request.clone());
    attempt
        .metadata_mut()
        .insert("authorization", "Bearer anything".parse().unwrap());
    let refused = client.reset_counters(attempt).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("ADMIN_RESET_TOKEN_FILE"),
        "{refused:?}"
    );
    let (status, _) = http(
        server.http_addr,
        "DELETE",
        "/counters?domain=m&entry=k=exact",
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 403);
    assert!(m.hit("k=exact").await.is_over_limit(), "nothing was reset");
    drop(server);

    // With a token file: the exact token, re-read on each reset (a rotated Secret).
    let token = token_file("admin-token-rotation", "first");
    let server = TestServer::start_with(settings(with_token(&token))).await;
    let mut client = admin(&server).await;
    let send = |token: Option<&str>| {
        let mut attempt = tonic::Request::new(request.clone());
        if let Some(token) = token {
            attempt
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        attempt
    };
    for wrong in [None, Some("firs"), Some("first2"), Some("")] {
        let refused = client.reset_counters(send(wrong)).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{wrong:?}");
    }
    assert!(client.reset_counters(send(Some("first"))).await.is_ok());
    std::fs::write(&token, "second").unwrap();
    let refused = client
        .reset_counters(send(Some("first")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(client.reset_counters(send(Some("second"))).await.is_ok());
    let (status, _) = crate::common::http_with_headers(
        server.http_addr,
        "DELETE",
        "/counters?domain=m&entry=k=exact",
        &[("authorization", "Bearer first")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 401);

    // Every attempt is counted.
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    let count = |via: &str, outcome: &str| {
        metric::<u64>(
            &page,
            &format!("sluice_counter_resets_total{{outcome=\"{outcome}\",via=\"{via}\"}}"),
        )
    };
    assert_eq!(count("grpc", "unauthenticated"), Some(5));
    assert_eq!(count("grpc", "reset"), Some(2));
    assert_eq!(count("http", "unauthenticated"), Some(1));
}

#[tokio::test]
async fn a_client_certificate_for_the_named_san_may_reset_on_the_mutual_tls_port() {
    let certs = crate::common::certs::fresh("admin-certs");
    for (san, admitted) in [("client.sluice.test", true), ("ops.sluice.test", false)] {
        let mut settings = settings(ResetSettings {
            token_file: None,
            client_san: Some(san.into()),
        });
        settings.grpc_tls = Some(server_tls(&certs, true));
        let server = TestServer::start_with(settings).await;
        let port = server.grpc_addr.port();
        let channel = tls_endpoint(port, Some(&certs), Some(&certs))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let answer = AdminClient::new(channel)
            .reset_counters(CountersRequest {
                domain: "m".into(),
                descriptor: Some(descriptor(&[("k", "exact")])),
            })
            .await;
        match answer {
            Ok(answer) => {
                assert!(admitted, "{san}");
                assert_eq!(answer.into_inner().counters, ["m|k=exact|60s:fw"]);
            }
            Err(status) => {
                assert!(!admitted, "{san}: {status:?}");
                assert_eq!(status.code(), Code::Unauthenticated);
            }
        }
    }
}

// Two threads: the CLI runs as a process the test waits for, while the server answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_explains_reads_and_resets() {
    let token = token_file("admin-token-cli", "cli-token");
    let server = TestServer::start_with(settings(with_token(&token))).await;
    assert!(server.domain("m").hit("k=other").await.is_ok());
    let addr = server.grpc_addr.to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .args(["--addr", &addr, "--domain", "m"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[
        "explain",
        "--descriptor",
        "k=other",
        "--descriptor",
        "parent=p",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("MATCHED: rule `m.k` applies"), "{out}");
    assert!(out.contains("level 1 k=other: KEY_ONLY"), "{out}");
    assert!(out.contains("counter m|k=other|60s:fw"), "{out}");
    assert!(out.contains("DEPTH"), "{out}");
    let (code, out, err) = run(&["counters", "get", "--descriptor", "k=other"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("used 1, remaining 2"), "{out}");
    let (code, _, err) = run(&["counters", "reset", "--descriptor", "k=other"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("Unauthenticated"), "{err}");
    let token = token.to_str().unwrap();
    let (code, out, err) = run(&[
        "counters",
        "reset",
        "--descriptor",
        "k=other",
        "--token-file",
        token,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("reset 1 counters of k=other (1 held state)"),
        "{out}"
    );
    let (_, out, _) = run(&["counters", "get", "--descriptor", "k=other", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["counters"][0]["used"], "0", "{out}");
}

#[test]
fn every_reset_attempt_is_logged_with_who_asked() {
    let token = token_file("admin-token-log", "logged-token");
    let wrong = token_file("admin-token-log-wrong", "guess");
    let dir = config_dir("admin-log", &[("m.yaml", crate::common::admin::MATCHING)]);
    let sluice = SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[("ADMIN_RESET_TOKEN_FILE", token.to_str().unwrap())],
    );
    let reset = |token: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["counters", "reset", "--addr", &sluice.grpc, "--domain", "m"])
            .args(["--descriptor", "k=exact", "--token-file"])
            .arg(token)
            .output()
            .unwrap()
    };
    assert_eq!(reset(&wrong).status.code(), Some(1));
    assert!(reset(&token).status.success());
    crate::common::eventually_blocking("both attempts in the log", || {
        let log = sluice.log.lock();
        let refused = log
            .iter()
            .any(|l| l.contains("counter reset refused") && l.contains("wrong bearer token"));
        let done = log.iter().any(|l| {
            l.contains("counters reset")
                && l.contains("who=bearer token")
                && l.contains("domain=m")
                && l.contains("m|k=exact|60s:fw")
                && l.contains("peer=")
        });
        refused && done
    });
}

/// A token file that turns into a FIFO (or any file no read can finish) wedges nothing: the
/// reset answers 503 at once without naming the file or the system's error (the log does),
/// decisions and the health check go on, and a token file that is fixed works again. At
/// start-up such a file is an error naming the variable, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_that_cannot_be_read_blocks_nothing_and_names_nothing() {
    let token = token_file("admin-token-fifo", "fifo-token");
    let dir = config_dir("admin-fifo", &[("m.yaml", crate::common::admin::MATCHING)]);
    let sluice = SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[("ADMIN_RESET_TOKEN_FILE", token.to_str().unwrap())],
    );
    let http_addr = sluice.http.parse().unwrap();
    let delete = || async move {
        crate::common::http_with_headers(
            http_addr,
            "DELETE",
            "/counters?domain=m&entry=k=exact",
            &[("authorization", "Bearer anything")],
            "",
        )
        .await
        .unwrap()
    };
    crate::common::mkfifo(&token);
    for _ in 0..3 {
        let (status, body) = delete().await;
        assert_eq!(status, 503, "{body}");
        let path = token.to_str().unwrap();
        assert!(
            !body.contains(path) && !body.contains("admin-token-fifo") && !body.contains("regular"),
            "the unauthenticated caller learns nothing of the file: {body}"
        );
    }
    let (status, _) = http_get(http_addr, "/healthcheck").await.unwrap();
    assert_eq!(status, 200);
    let m = crate::common::DomainClient::connect(&sluice.grpc, "m");
    assert!(m.hit("k=exact").await.is_ok(), "decisions go on");
    crate::common::eventually_blocking("the log names the file and why", || {
        sluice.log.lock().iter().any(|l| {
            l.contains("counter reset refused")
                && l.contains("admin-token-fifo")
                && l.contains("not a regular file")
        })
    });
    // Fixed: a regular file again, and the right token resets.
    std::fs::remove_file(&token).unwrap();
    std::fs::write(&token, "fifo-token").unwrap();
    let (status, body) = crate::common::http_with_headers(
        http_addr,
        "DELETE",
        "/counters?domain=m&entry=k=exact",
        &[("authorization", "Bearer fifo-token")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    drop(sluice);

    // At start-up: exit 64 with the variable named, at once.
    crate::common::mkfifo(&token);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&dir)
        .env("ADMIN_RESET_TOKEN_FILE", &token)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    crate::common::eventually_blocking("start-up to give up on the FIFO", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.unwrap().code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("ADMIN_RESET_TOKEN_FILE") && stderr.contains("not a regular file"),
        "{stderr}"
    );
}
