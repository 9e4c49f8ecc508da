//! Zipkin's B3 propagation, single header (`b3: {trace}-{span}-{sampled}-{parent}`) and
//! multiple headers (`x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags`), as Envoy's
//! Zipkin tracer and the reference service (through OpenTelemetry's contrib propagator)
//! read them. The single header wins when both are there. A deferred decision (no sampling
//! state) is taken here, by the same trace-id ratio as the sampler, since a remote parent
//! can only say sampled or not.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, propagation::text_map_propagator::FieldIter};

const SINGLE: &str = "b3";
const TRACE_ID: &str = "x-b3-traceid";
const SPAN_ID: &str = "x-b3-spanid";
const SAMPLED: &str = "x-b3-sampled";
const FLAGS: &str = "x-b3-flags";

/// The B3 propagator; `sampling_rate` takes deferred decisions.
#[derive(Debug)]
pub struct B3 {
    sampling_rate: f64,
    fields: Vec<String>,
}

impl B3 {
    /// A propagator deciding deferred traces with `sampling_rate`.
    pub fn new(sampling_rate: f64) -> Self {
        Self {
            sampling_rate,
            fields: [SINGLE, TRACE_ID, SPAN_ID, SAMPLED, FLAGS]
                .map(str::to_owned)
                .to_vec(),
        }
    }

    fn single(&self, value: &str) -> Option<SpanContext> {
        let mut parts = value.trim().split('-');
        let trace = parts.next()?;
        let span = parts.next()?;
        let state = parts.next();
        // A fourth part is the parent span id; more is malformed.
        if let Some(parent) = parts.next()
            && (parse_span_id(parent).is_none() || parts.next().is_some())
        {
            return None;
        }
        let sampled = match state {
            None => None,
            Some("1" | "d") => Some(true),
            Some("0") => Some(false),
            Some(_) => return None,
        };
        self.context(trace, span, sampled)
    }

    fn multiple(&self, extractor: &dyn Extractor) -> Option<SpanContext> {
        let trace = extractor.get(TRACE_ID)?;
        let span = extractor.get(SPAN_ID)?;
        let debug = extractor.get(FLAGS).map(str::trim) == Some("1");
        let sampled = match extractor.get(SAMPLED).map(str::trim) {
            _ if debug => Some(true),
            None => None,
            Some("1" | "true") => Some(true),
            Some("0" | "false") => Some(false),
            Some(_) => return None,
        };
        self.context(trace, span, sampled)
    }

    fn context(&self, trace: &str, span: &str, sampled: Option<bool>) -> Option<SpanContext> {
        let trace_id = parse_trace_id(trace.trim())?;
        let span_id = parse_span_id(span.trim())?;
        let sampled = sampled.unwrap_or_else(|| ratio_samples(trace_id, self.sampling_rate));
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Some(SpanContext::new(
            trace_id,
            span_id,
            flags,
            true,
            TraceState::NONE,
        ))
    }
}

impl TextMapPropagator for B3 {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if context.is_valid() {
            let sampled = if context.is_sampled() { "1" } else { "0" };
            injector.set(
                SINGLE,
                format!("{}-{}-{sampled}", context.trace_id(), context.span_id()),
            );
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        let found = match extractor.get(SINGLE) {
            Some(value) => self.single(value),
            None => self.multiple(extractor),
        };
        match found {
            Some(context) => cx.with_remote_span_context(context),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        FieldIter::new(&self.fields)
    }
}

/// 32 or 16 hex digits (a 64-bit id is the low half), not all zero.
fn parse_trace_id(text: &str) -> Option<TraceId> {
    if !(text.len() == 32 || text.len() == 16) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = TraceId::from_hex(&format!("{text:0>32}")).ok()?;
    (id != TraceId::INVALID).then_some(id)
}

/// 16 hex digits, not all zero.
fn parse_span_id(text: &str) -> Option<SpanId> {
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = SpanId::from_hex(text).ok()?;
    (id != SpanId::INVALID).then_some(id)
}

/// The trace-id ratio test of OpenTelemetry's `TraceIdRatioBased` sampler.
fn ratio_samples(trace_id: TraceId, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    let bound = (rate.max(0.0) * (1u64 << 63) as f64) as u64;
    let bytes = trace_id.to_bytes();
    let low = u64::from_be_bytes(bytes[8..16].try_into().unwrap_or_default()) >> 1;
    low < bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn extract(headers: &[(&str, &str)]) -> SpanContext {
        let map: HashMap<String, String> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let cx = B3::new(1.0).extract(&map);
        cx.span().span_context().clone()
    }

    const TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
    const SPAN: &str = "e457b5a2e4d86bd1";

    #[test]
    fn single_header_with_and_without_parent() {
        let c = extract(&[("b3", &format!("{TRACE}-{SPAN}-1-05e3ac9a4f6e3b90"))]);
        assert!(c.is_valid() && c.is_remote() && c.is_sampled());
        assert_eq!(c.trace_id().to_string(), TRACE);
        assert_eq!(c.span_id().to_string(), SPAN);
        assert!(!extract(&[("b3", &format!("{TRACE}-{SPAN}-0"))]).is_sampled());
        assert!(extract(&[("b3", &format!("{TRACE}-{SPAN}-d"))]).is_sampled());
        // Deferred: decided by the ratio (1 here).
        assert!(extract(&[("b3", &format!("{TRACE}-{SPAN}"))]).is_sampled());
    }

    #[test]
    fn multiple_headers_and_64_bit_trace_ids() {
        let c = extract(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ]);
        assert!(c.is_valid() && c.is_sampled());
        assert_eq!(c.trace_id().to_string(), "000000000000000064fe8b2a57d3eff7");
        let debug = extract(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "0"),
            ("x-b3-flags", "1"),
        ]);
        assert!(debug.is_sampled());
    }

    #[test]
    fn malformed_headers_give_no_parent() {
        for bad in [
            "zz".to_owned(),
            format!("{TRACE}-{SPAN}-2"),
            format!("{TRACE}-short-1"),
            format!("{}-{SPAN}-1", "0".repeat(32)),
            format!("{TRACE}-{SPAN}-1-{SPAN}-extra"),
        ] {
            assert!(!extract(&[("b3", &bad)]).is_valid(), "{bad}");
        }
        assert!(!extract(&[("x-b3-traceid", TRACE)]).is_valid());
    }

    #[test]
    fn deferred_decisions_follow_the_ratio() {
        let id = TraceId::from_hex(TRACE).unwrap();
        assert!(ratio_samples(id, 1.0));
        assert!(!ratio_samples(id, 0.0));
    }
}
