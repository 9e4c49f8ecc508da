//! What a client that never reads its answers costs: RLQS streams over a connection whose
//! HTTP/2 window for the server's data is never opened, reporting all the while; measured on
//! the real binary.

use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use prost::Message;
use tonic::codegen::Bytes;

use crate::common::rlqs::{RULES, usage};
use crate::common::{SluiceProcess, config_dir, http_get, metric};

/// The server's resident memory, in MB.
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// One report of `buckets` buckets as a gRPC message (prefix and protobuf).
fn report(tag: usize, buckets: usize) -> Bytes {
    let message = RateLimitQuotaUsageReports {
        domain: "rq".into(),
        bucket_quota_usages: (0..buckets)
            .map(|i| usage(&[("name", &format!("s{tag}-b{i}"))], 1, 0))
            .collect(),
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed.into()
}

/// The probe: a client whose window for the server's data never opened, reporting on its
/// streams all the while, took the server from 28 to 353 MB in 30 s (about 7 MB per MB
/// uploaded), and 363 MB stayed after the stream closed. Now a stream is read at its pace
/// and holds at most one answer per bucket waiting: memory stays flat while the client
/// uploads, and the state is freed when it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_costs_bounded_memory() {
    let dir = config_dir("rlqs-unread", &[("rq.yaml", RULES)]);
    let args = ["--rlqs-max-buckets-per-stream", "2000"];
    let process = SluiceProcess::spawn(&dir, &args);
    let pid = process.child.id();
    let tcp = tokio::net::TcpStream::connect(&process.grpc).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let mut streams = Vec::new();
    for s in 0..10 {
        let mut client = client.clone().ready().await.unwrap();
        let request = tonic::codegen::http::Request::post(format!(
            "http://{}/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
            process.grpc
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (answer, send) = client.send_request(request, false).unwrap();
        streams.push((answer, send, report(s, 2_000)));
    }
    let metrics = || async {
        http_get(process.http.parse().unwrap(), "/metrics")
            .await
            .unwrap()
            .1
    };
    // Every stream's buckets tracked: the state is all there.
    let mut uploaded = 0;
    let mut send_all = |streams: &mut Vec<(_, h2::SendStream<Bytes>, Bytes)>| {
        for (_, send, report) in streams.iter_mut() {
            uploaded += report.len();
            send.send_data(report.clone(), false).unwrap();
        }
    };
    send_all(&mut streams);
    crate::common::eventually("every bucket tracked", || async {
        metric::<i64>(&metrics().await, "sluice_rlqs_buckets") == Some(20_000)
    })
    .await;
    let settled = rss_mb(pid);
    let mut peak = settled;
    // Then ten times as much again, four times faster than the streams are read.
    for _ in 0..40 {
        send_all(&mut streams);
        let page = metrics().await;
        peak = peak.max(rss_mb(pid));
        if metric::<u64>(&page, "sluice_rlqs_reports_total").unwrap_or(0) >= 110 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let uploaded_mb = uploaded as f64 / 1e6;
    eprintln!("uploaded {uploaded_mb:.0} MB: rss {settled:.0} MB settled, {peak:.0} MB at most");
    assert!(
        peak - settled < 30.0,
        "memory grew with the upload: {settled:.0} -> {peak:.0} MB after {uploaded_mb:.0} MB"
    );
    drop(streams);
    drop(client);
    connection.abort();
    crate::common::eventually("the state freed", || async {
        let page = metrics().await;
        metric::<i64>(&page, "sluice_rlqs_streams") == Some(0)
            && metric::<i64>(&page, "sluice_rlqs_buckets") == Some(0)
    })
    .await;
}
