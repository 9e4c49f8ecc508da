//! Per-rule header visibility through a real Envoy 1.40: a rule with `response_headers:
//! false` (a limit that protects the service) is kept out of every header and body Sluice
//! writes, while a quota on the same request still shows; refused by the hidden rule alone,
//! the 429 says nothing of it.

use crate::common::envoy::{self, Bootstrap};
use crate::common::{TestServer, config_dir};
use sluice::rls::ReferenceHeaders;
use sluice::settings::Settings;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100, name: partner_quota}
  - key: generic_key
    value: backend
    response_headers: false
    rate_limit: {unit: hour, requests_per_unit: 2, name: backend_protection}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_rule_stays_out_of_the_answer_while_the_quota_shows() {
    let mut settings = Settings::for_tests(config_dir("hidden-limits", &[("edge.yaml", CONFIG)]));
    settings.response.draft_headers = true;
    settings.response.problem_json = true;
    settings.response.reference_headers = Some(ReferenceHeaders {
        limit: "RateLimit-Limit".into(),
        remaining: "RateLimit-Remaining".into(),
        reset: "RateLimit-Reset".into(),
    });
    let sluice = TestServer::start_with(settings).await;
    let (_envoy, front) = Bootstrap::new(sluice.grpc_addr.port())
        .routes(
            r#"              - match: {prefix: "/"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-api-key, descriptor_key: api_key}
                  - actions:
                    - generic_key: {descriptor_value: backend}"#,
        )
        .start()
        .await;
    let call = || envoy::get(front, "/", &[("x-api-key", "p")]);
    for _ in 0..2 {
        let (status, head, _) = call().await;
        assert_eq!(status, 200, "{head}");
        let policy = envoy::header(&head, "ratelimit-policy").unwrap_or_default();
        assert!(policy.contains("partner_quota"), "the quota shows: {head}");
        assert!(
            !head.contains("backend_protection"),
            "the protection does not: {head}"
        );
        // The trio describes the quota (100), not the tighter hidden limit (2).
        assert_eq!(
            envoy::header(&head, "ratelimit-limit"),
            Some("100"),
            "{head}"
        );
    }
    // The hidden rule refuses: a 429 that names no policy and says no wait of its own.
    let (status, head, body) = call().await;
    assert_eq!(status, 429, "{head}");
    assert!(
        !head.contains("backend_protection") && !body.contains("backend_protection"),
        "{head}{body}"
    );
    assert!(envoy::header(&head, "retry-after").is_none(), "{head}");
    let policy = envoy::header(&head, "ratelimit-policy").unwrap_or_default();
    assert!(
        policy.contains("partner_quota") && !policy.contains(";q=2"),
        "{head}"
    );
}
