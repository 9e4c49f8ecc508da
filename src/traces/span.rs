//! The span of one decision, told what it needs as the request goes: what was asked (domain,
//! number of descriptors, their values only when asked for), how it was decided (the rule,
//! what answered, the store call as a child span with its own times), and the answer.
//!
//! | attribute | value |
//! |---|---|
//! | `rpc.system`, `rpc.service`, `rpc.method` | `grpc`, `envoy.service.ratelimit.v3.RateLimitService`, `ShouldRateLimit` (gRPC) |
//! | `http.request.method`, `url.path` | `POST`, `/json` (the JSON endpoint) |
//! | `ratelimit.domain` | the request's domain |
//! | `ratelimit.descriptors` | how many descriptors it carries |
//! | `ratelimit.code` | `OK`, `OVER_LIMIT`, or the gRPC error's code name |
//! | `ratelimit.rule` | the rule (stats key or limit name) that decided: the first refusing, else the one with the least left |
//! | `ratelimit.answered_by` | `store`, `over_limit_cache`, `failure_mode`, or `no_limit` (no counter) |
//! | `ratelimit.descriptor_values` | `k=v,k2=v2 \| ...`, with `TRACING_DESCRIPTOR_VALUES=true` only |
//!
//! An RLQS usage report (Envoy's `rate_limit_quota` filter) has a span of its own,
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`, a child of
//! the trace context the stream was opened with, with `ratelimit.domain`, `rlqs.buckets`
//! (buckets reported), `rlqs.new_buckets`, `rlqs.assignments` (actions the report caused
//! at once) and `ratelimit.code` (`OK`, or `DROPPED` past the stream's report rate).
//!
//! The store call's span (`store call`) has `ratelimit.answered_by` and, for Redis,
//! `ratelimit.store.script_calls` and `ratelimit.store.requests_per_call` (requests sharing
//! the largest script call).

use std::time::{Instant, SystemTime};

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use crate::limiter::Response;

/// Longest `ratelimit.descriptor_values` attribute, in bytes.
const MAX_VALUES: usize = 1024;

/// How a call arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// gRPC `ShouldRateLimit`.
    ShouldRateLimit,
    /// `POST /json`.
    Json,
    /// One usage report on an RLQS stream.
    RlqsReport,
}

/// The span of one call, ended by [`RequestSpan::end`]. Boxed: the request path's futures
/// carry an `Option` of it, which with tracing off should cost them one word.
pub struct RequestSpan(Box<Inner>);

struct Inner {
    cx: Context,
    tracer: SdkTracer,
    descriptor_values: bool,
}

impl RequestSpan {
    pub(super) fn start(
        tracer: &SdkTracer,
        method: Method,
        parent: &Context,
        descriptor_values: bool,
    ) -> Self {
        let (name, attributes) = match method {
            Method::ShouldRateLimit => (
                "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                vec![
                    KeyValue::new("rpc.system", "grpc"),
                    KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                    KeyValue::new("rpc.method", "ShouldRateLimit"),
                ],
            ),
            Method::Json => (
                "POST /json",
                vec![
                    KeyValue::new("http.request.method", "POST"),
                    KeyValue::new("url.path", "/json"),
                ],
            ),
            Method::RlqsReport => (
                "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
                vec![
                    KeyValue::new("rpc.system", "grpc"),
                    KeyValue::new(
                        "rpc.service",
                        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
                    ),
                    KeyValue::new("rpc.method", "StreamRateLimitQuotas"),
                ],
            ),
        };
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(tracer, parent);
        Self(Box::new(Inner {
            cx: parent.with_span(span),
            tracer: tracer.clone(),
            descriptor_values,
        }))
    }

    /// Whether the span is recorded (sampled); the other calls do nothing when it is not.
    pub fn is_recording(&self) -> bool {
        self.0.cx.span().is_recording()
    }

    /// What was asked. `values` renders the descriptors' entries, called only when spans
    /// carry them.
    pub fn request(&mut self, domain: &str, descriptors: usize, values: impl FnOnce() -> String) {
        if !self.is_recording() {
            return;
        }
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new("ratelimit.domain", domain.to_owned()));
        span.set_attribute(KeyValue::new("ratelimit.descriptors", descriptors as i64));
        if self.0.descriptor_values {
            let mut text = values();
            if text.len() > MAX_VALUES {
                let mut end = MAX_VALUES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push('~');
            }
            span.set_attribute(KeyValue::new("ratelimit.descriptor_values", text));
        }
    }

    /// An RLQS report: its domain, the buckets it listed, how many were new, and the actions
    /// it caused at once.
    pub fn rlqs_report(
        &mut self,
        domain: &str,
        buckets: usize,
        new_buckets: usize,
        actions: usize,
    ) {
        if !self.is_recording() {
            return;
        }
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new("ratelimit.domain", domain.to_owned()));
        span.set_attribute(KeyValue::new("rlqs.buckets", buckets as i64));
        span.set_attribute(KeyValue::new("rlqs.new_buckets", new_buckets as i64));
        span.set_attribute(KeyValue::new("rlqs.assignments", actions as i64));
    }

    /// How it was decided: the rule, what answered, and the store call's child span.
    pub fn decided(&mut self, response: &Response) {
        if !self.is_recording() {
            return;
        }
        let span = self.0.cx.span();
        let rule = response
            .limits
            .iter()
            .find(|l| l.over)
            .or_else(|| response.limits.iter().min_by_key(|l| l.remaining));
        if let Some(rule) = rule {
            span.set_attribute(KeyValue::new("ratelimit.rule", rule.policy.clone()));
        }
        let answered_by = response
            .store_call
            .map_or("no_limit", |c| c.answered_by.as_str());
        span.set_attribute(KeyValue::new("ratelimit.answered_by", answered_by));
        let Some(call) = response.store_call else {
            return;
        };
        let start = system_time(call.started);
        let mut attributes = vec![KeyValue::new("ratelimit.answered_by", answered_by)];
        // A shared store's script calls; the memory store (and a cache that answered alone)
        // makes none.
        if call.calls.script_calls > 0 {
            attributes.push(KeyValue::new(
                "ratelimit.store.script_calls",
                i64::from(call.calls.script_calls),
            ));
            attributes.push(KeyValue::new(
                "ratelimit.store.requests_per_call",
                i64::from(call.calls.requests_per_call),
            ));
        }
        let mut child = self
            .0
            .tracer
            .span_builder("store call")
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.0.tracer, &self.0.cx);
        if call.answered_by == crate::limiter::AnsweredBy::FailureMode {
            child.set_status(Status::error("the store failed; the failure mode answered"));
        }
        child.end_with_timestamp(start + call.elapsed);
    }

    /// The answer: `code` (`OK`, `OVER_LIMIT`, or an error's code name) and, for an error,
    /// its message.
    pub fn end(self, code: &str, error: Option<&str>) {
        let span = self.0.cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("ratelimit.code", code.to_owned()));
            if let Some(message) = error {
                span.set_status(Status::error(message.to_owned()));
            }
        }
        span.end();
    }

    /// The gRPC status code, on the gRPC span.
    pub fn grpc_status(&self, code: i64) {
        self.0
            .cx
            .span()
            .set_attribute(KeyValue::new("rpc.grpc.status_code", code));
    }
}

/// The wall-clock time of `instant`.
fn system_time(instant: Instant) -> SystemTime {
    let ago = Instant::now().saturating_duration_since(instant);
    SystemTime::now()
        .checked_sub(ago)
        .unwrap_or_else(SystemTime::now)
}
