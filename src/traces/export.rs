//! The span processor: finished spans go into a bounded queue (never waiting: a full queue
//! drops the span and counts it), and one task exports them in batches, one export at a
//! time, each within the export timeout. After a failed export the task waits (1 s, doubling
//! to 30 s) before the next, so the queue stays full while the collector is away, and the
//! [`Gate`] then tells requests not to build spans at all. A slow, failing or absent collector
//! therefore costs a decision nothing but, at worst, its span.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus::{IntCounter, Registry};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::logging::Every;

/// How the queue and its exports are bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Spans waiting at most.
    pub max_queue: usize,
    /// Spans in one export at most.
    pub max_batch: usize,
    /// Longest wait of a span for its batch.
    pub schedule_delay: Duration,
    /// Longest wait for one export.
    pub timeout: Duration,
}

/// What the queue counts.
#[derive(Debug, Clone)]
struct Counters {
    dropped_queue_full: IntCounter,
    dropped_export_failed: IntCounter,
    exported: IntCounter,
}

impl Counters {
    fn register(registry: &Registry) -> Self {
        let dropped = crate::metrics::counter_vec(
            registry,
            "sluice_trace_spans_dropped_total",
            "Spans not exported: queue_full (the export queue was full), export_failed (the collector did not take them)",
            &["reason"],
        );
        Self {
            dropped_queue_full: dropped.with_label_values(&["queue_full"]),
            dropped_export_failed: dropped.with_label_values(&["export_failed"]),
            exported: crate::metrics::counter(
                registry,
                "sluice_trace_spans_exported_total",
                "Spans the collector took",
            ),
        }
    }
}

/// Hands finished spans to the export task.
#[derive(Debug)]
pub struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    counters: Counters,
}

/// Whether a new span has room in the queue: a span that would be dropped is not worth
/// building (a full queue means the collector is slow or away).
#[derive(Debug, Clone)]
pub struct Gate {
    queue: mpsc::Sender<SpanData>,
    dropped: IntCounter,
}

impl Gate {
    /// True when the queue has room; otherwise counts the span not made as dropped.
    pub fn admits(&self) -> bool {
        if self.queue.capacity() > 0 {
            return true;
        }
        self.dropped.inc();
        false
    }
}

/// First and longest wait after a failed export.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));

/// Logs about dropped spans, at most once a minute.
static DROPS_LOGGED: Every = Every::new(Duration::from_secs(60));

impl QueueProcessor {
    /// A processor and the task that exports for it (spawned on the current runtime), which
    /// sends what is left and ends when `stop` is cancelled.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        limits: Limits,
        registry: &Registry,
        stop: CancellationToken,
    ) -> (Self, Gate, tokio::task::JoinHandle<()>) {
        let (queue, spans) = mpsc::channel(limits.max_queue);
        let counters = Counters::register(registry);
        let task = tokio::spawn(export_loop(exporter, spans, limits, counters.clone(), stop));
        let gate = Gate {
            queue: queue.clone(),
            dropped: counters.dropped_queue_full.clone(),
        };
        (Self { queue, counters }, gate, task)
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.queue.try_send(span) {
            self.counters.dropped_queue_full.inc();
            if DROPS_LOGGED.ready() {
                tracing::warn!(
                    "trace spans dropped: the export queue is full (OTEL_BSP_MAX_QUEUE_SIZE); the collector is slow or unreachable"
                );
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Batches spans as they come (a batch goes when full or when its first span has waited
/// `schedule_delay`) and exports them one batch at a time.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    limits: Limits,
    counters: Counters,
    stop: CancellationToken,
) {
    let mut backoff = BACKOFF.0;
    loop {
        let first = tokio::select! {
            span = spans.recv() => span,
            _ = stop.cancelled() => None,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + limits.schedule_delay;
        while batch.len() < limits.max_batch {
            tokio::select! {
                span = tokio::time::timeout_at(deadline, spans.recv()) => match span {
                    Ok(Some(span)) => batch.push(span),
                    _ => break,
                },
                _ = stop.cancelled() => break,
            }
        }
        if export(&exporter, batch, limits.timeout, &counters).await {
            backoff = BACKOFF.0;
        } else {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.cancelled() => {}
            }
            backoff = (backoff * 2).min(BACKOFF.1);
        }
    }
    // Stopping: what is queued goes out, in batches, each within the timeout.
    let mut rest = Vec::new();
    while let Ok(span) = spans.try_recv() {
        rest.push(span);
        if rest.len() == limits.max_batch {
            export(
                &exporter,
                std::mem::take(&mut rest),
                limits.timeout,
                &counters,
            )
            .await;
        }
    }
    if !rest.is_empty() {
        export(&exporter, rest, limits.timeout, &counters).await;
    }
}

/// Exports `batch` within `timeout`; whether the collector took it.
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: Vec<SpanData>,
    timeout: Duration,
    counters: &Counters,
) -> bool {
    let n = batch.len() as u64;
    let error = match tokio::time::timeout(timeout, exporter.export(batch)).await {
        Ok(Ok(())) => {
            counters.exported.inc_by(n);
            return true;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {timeout:?}"),
    };
    counters.dropped_export_failed.inc_by(n);
    if DROPS_LOGGED.ready() {
        tracing::warn!(%error, spans = n, "trace spans dropped: the collector did not take them");
    }
    false
}
