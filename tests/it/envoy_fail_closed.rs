//! Envoy's fail-closed survives the swap: run under the reference's name (`/bin/ratelimit`, as
//! Envoy Gateway starts it), Sluice answers a store failure as the reference does, with a
//! prompt gRPC error that Envoy's `failure_mode_deny` decides: a real Envoy 1.40 set to fail
//! closed refuses, one set to fail open admits. `sluice serve` keeps its own `allow`.

use crate::common::envoy::{self, Bootstrap};
use crate::common::redis::free_port;
use crate::common::{SluiceProcess, config_dir};

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// Sluice on a Redis that is not there, under the reference's name or its own.
fn sluice(as_reference: bool) -> SluiceProcess {
    let dir = config_dir("fail-closed", &[("edge.yaml", CONFIG)]);
    let url = format!("redis://127.0.0.1:{}", free_port());
    let args = ["--backend", "redis", "--redis-url", url.as_str()];
    if as_reference {
        SluiceProcess::spawn_as_reference(&dir, &args, &[])
    } else {
        SluiceProcess::spawn(&dir, &args)
    }
}

/// The status Envoy answers for one request, with `failure_mode_deny: !fail_open`.
async fn through_envoy(sluice: &SluiceProcess, fail_open: bool) -> u16 {
    let port: u16 = sluice.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let (_envoy, front) = Bootstrap::new(port).fail_open(fail_open).start().await;
    envoy::get(front, "/", &[("x-api-key", "k")]).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_reference_name_envoys_failure_mode_deny_decides() {
    let reference = sluice(true);
    let said = reference.startup_log.join("\n");
    assert!(
        said.contains("running as envoyproxy/ratelimit") && said.contains("failure_mode envoy"),
        "{said}"
    );
    assert_eq!(
        through_envoy(&reference, false).await,
        500,
        "fail closed stays closed"
    );
    assert_eq!(
        through_envoy(&reference, true).await,
        200,
        "fail open stays open"
    );
    // FAILURE_MODE set explicitly wins under the reference's name too.
    let dir = config_dir("fail-closed-set", &[("edge.yaml", CONFIG)]);
    let url = format!("redis://127.0.0.1:{}", free_port());
    let allow = SluiceProcess::spawn_as_reference(
        &dir,
        &["--backend", "redis", "--redis-url", url.as_str()],
        &[("FAILURE_MODE", "allow")],
    );
    assert_eq!(through_envoy(&allow, false).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_serve_keeps_failing_open_by_its_own_default() {
    let own = sluice(false);
    assert_eq!(
        through_envoy(&own, false).await,
        200,
        "FAILURE_MODE allow answers OK"
    );
}
