//! `sluice bench --rlqs-flood N`: RLQS streams that re-report many buckets as fast as the
//! server reads them, beside the `ShouldRateLimit` load, to measure what RLQS work costs the
//! decisions (docs/performance.md). Each stream has a connection of its own and reads its
//! answers, so nothing but the server's own pace holds it back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use super::{ClientTls, ToolError, channel};

/// A flood running on a thread of its own until stopped.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Result<(), ToolError>>,
}

impl Flood {
    /// Starts `streams` streams to `addr`, each reporting `buckets` buckets `(key, k<N>)` of
    /// `domain` again and again.
    pub fn start(
        addr: &str,
        tls: &ClientTls,
        (domain, key): (&str, &str),
        streams: usize,
        buckets: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let report = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: (0..buckets)
                .map(|i| BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: [(key.to_owned(), format!("k{i}"))].into(),
                    }),
                    time_elapsed: None,
                    num_requests_allowed: u64::MAX,
                    num_requests_denied: u64::MAX,
                })
                .collect(),
        };
        let (addr, tls) = (addr.to_owned(), tls.clone());
        let (stopping, counting) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ToolError::Rpc(format!("cannot start the flood thread: {e}")))?;
            runtime.block_on(async move {
                let mut tasks = Vec::new();
                for _ in 0..streams {
                    let channel = channel(&addr, &tls).await?;
                    tasks.push(tokio::spawn(stream(
                        channel,
                        report.clone(),
                        stopping.clone(),
                        counting.clone(),
                    )));
                }
                for task in tasks {
                    let _ = task.await;
                }
                Ok(())
            })
        });
        Self { stop, sent, thread }
    }

    /// Stops the flood, off the async threads (its thread is joined): the reports sent.
    pub async fn finish(self) -> Result<u64, ToolError> {
        tokio::task::spawn_blocking(move || self.stop())
            .await
            .map_err(|e| ToolError::Rpc(format!("the flood failed: {e}")))?
    }

    /// Stops the flood: the reports sent.
    fn stop(self) -> Result<u64, ToolError> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(ToolError::Rpc("the flood thread panicked".into())))?;
        Ok(self.sent.load(Ordering::Relaxed))
    }
}

/// One stream: sends `report` whenever the server takes it, reads every answer, until
/// `stop`.
async fn stream(
    channel: tonic::transport::Channel,
    report: RateLimitQuotaUsageReports,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) {
    let mut client =
        RateLimitQuotaServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let reports = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx);
    let Ok(answers) = client.stream_rate_limit_quotas(reports).await else {
        return;
    };
    let mut answers = answers.into_inner();
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
    while !stop.load(Ordering::Relaxed) {
        let send = tx.send(report.clone());
        match tokio::time::timeout(std::time::Duration::from_millis(100), send).await {
            Ok(Ok(())) => {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(_)) => break,
            Err(_) => {} // the server is not reading: look at `stop` again
        }
    }
    drop(tx);
    reader.abort();
}
