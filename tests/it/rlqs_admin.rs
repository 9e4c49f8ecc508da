//! An RLQS bucket explained: `GET /counters?domain=D&bucket=...` and `sluice explain
//! --bucket`, its pairs in any order: the rule they reach, the assignment, this instance's part
//! of the budget and each stream's share.

use crate::common::rlqs::{Stream, usage};
use crate::common::{TestServer, http_get};

const RULES: &str = "
domain: rq
descriptors:
  - key: plan
    value: free
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 60}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_is_explained_over_http_and_by_the_cli() {
    let sluice = TestServer::start(&[("rq.yaml", RULES)]).await;
    let mut stream = Stream::open(sluice.grpc_addr).await.unwrap();
    stream
        .report(
            "rq",
            vec![usage(&[("tenant", "acme"), ("plan", "free")], 1, 0)],
        )
        .await;
    stream.next().await;
    let (status, body) = http_get(
        sluice.http_addr,
        "/counters?domain=rq&bucket=tenant=acme,plan=free",
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["rule"], "rq.plan_free.tenant", "{answer}");
    assert_eq!(
        answer["descriptor"][0]["key"], "plan",
        "the tree's order: {answer}"
    );
    assert_eq!(answer["assignment"], "token_bucket");
    assert_eq!(
        (answer["rate"].as_str(), answer["windowSeconds"].as_str()),
        (Some("60"), Some("60"))
    );
    assert_eq!(answer["tracked"], true);
    assert_eq!(
        answer["claim"], "60",
        "one instance claims the whole budget: {answer}"
    );
    assert_eq!(answer["shares"][0]["rate"], "60", "{answer}");
    // A bucket no Envoy reports, and one no rule matches.
    let (_, body) = http_get(
        sluice.http_addr,
        "/counters?domain=rq&bucket=tenant=other,plan=free",
    )
    .await
    .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (answer["tracked"].as_bool(), answer["assignment"].as_str()),
        (Some(false), Some("token_bucket"))
    );
    let (_, body) = http_get(sluice.http_addr, "/counters?domain=rq&bucket=plan=pro")
        .await
        .unwrap();
    assert!(
        body.contains(r#""assignment":"allow_all""#) && body.contains(r#""rule":"""#),
        "{body}"
    );
    let (status, body) = http_get(sluice.http_addr, "/counters?domain=rq&bucket=nopair")
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    // Two `bucket` parameters are not one bucket of both pairs.
    let (status, body) = http_get(
        sluice.http_addr,
        "/counters?domain=rq&bucket=tenant=acme&bucket=plan=free",
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("query parameter `bucket` is repeated"),
        "{body}"
    );
    // The same through the admin gRPC API.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "explain",
            "--addr",
            &sluice.grpc_addr.to_string(),
            "--domain",
            "rq",
        ])
        .args(["--bucket", "tenant=acme,plan=free"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("rule rq.plan_free.tenant (as the descriptor plan=free,tenant=acme)"),
        "{text}"
    );
    assert!(
        text.contains("assignment TOKEN_BUCKET: budget 60 per 60 s, burst 60"),
        "{text}"
    );
    assert!(text.contains("this instance: claim 60, held 60"), "{text}");
}

#[tokio::test]
async fn a_shadow_rule_assigns_allow_all_and_counts_what_it_would_have_denied() {
    let rules = "domain: rq\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n    shadow_mode: true\n";
    let sluice = TestServer::start(&[("rq.yaml", rules)]).await;
    let mut stream = Stream::open(sluice.grpc_addr).await.unwrap();
    stream
        .report("rq", vec![usage(&[("tenant", "acme")], 1, 0)])
        .await;
    let answer = stream.next().await;
    let action = format!("{:?}", answer.bucket_action[0].bucket_action);
    assert!(
        action.contains("BlanketRule(AllowAll)"),
        "ALLOW_ALL: {action}"
    );
    // Envoy let 100 through under ALLOW_ALL: a budget of 10 (and 9 left) would have denied 90.
    stream
        .report("rq", vec![usage(&[("tenant", "acme")], 100, 0)])
        .await;
    crate::common::eventually("the would-be denials are counted", || async {
        let (_, page) = http_get(sluice.http_addr, "/metrics").await.unwrap();
        crate::common::metric::<u64>(
            &page,
            r#"sluice_rlqs_shadow_denied_total{domain="rq",rule="rq.tenant"}"#,
        )
        .is_some_and(|n| (89..=91).contains(&n))
    })
    .await;
}
