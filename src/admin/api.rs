//! The admin API over gRPC, `sluice.admin.v1.Admin` (`proto/sluice/admin/v1/admin.proto`):
//! explain, read and reset counters, served on the gRPC port. The limiter answers; this
//! module converts, and checks who may reset ([`ResetAccess`]).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as envoy_descriptor;
use envoy_types::pb::envoy::service::ratelimit::v3 as envoy_rls;
use tonic::{Request, Response, Status};

use super::ResetAccess;
use crate::limiter::{
    self, CounterState, Explained, ExplainedLimit, Explanation, Limiter, Outcome,
};
use crate::policy::StepKind;

/// The generated messages, server and client of `sluice.admin.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
pub mod proto {
    tonic::include_proto!("sluice.admin.v1");
}

use proto::admin_server::{Admin, AdminServer};
use proto::descriptor_explanation::Outcome as ProtoOutcome;
use proto::step::Kind;

/// The `Admin` service.
#[derive(Clone)]
pub struct AdminService {
    limiter: Arc<Limiter>,
    access: Arc<ResetAccess>,
    quotas: Option<Arc<crate::quota::Quotas>>,
}

impl AdminService {
    /// The service over `limiter`, resetting only for callers `access` admits.
    pub fn new(limiter: Arc<Limiter>, access: Arc<ResetAccess>) -> Self {
        Self {
            limiter,
            access,
            quotas: None,
        }
    }

    /// Explains RLQS buckets from `quotas`.
    pub fn with_quotas(mut self, quotas: Arc<crate::quota::Quotas>) -> Self {
        self.quotas = Some(quotas);
        self
    }

    /// The tonic server of this service.
    pub fn into_server(self) -> AdminServer<Self> {
        AdminServer::new(self)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn explain(
        &self,
        request: Request<proto::RateLimitRequest>,
    ) -> Result<Response<proto::ExplainResponse>, Status> {
        let request = request.into_inner();
        let domain = request.domain.clone();
        let request = request_from_proto(request).map_err(Status::invalid_argument)?;
        let explained = self
            .limiter
            .explain(&request)
            .map_err(crate::rls::status_from_error)?;
        Ok(Response::new(explained_to_proto(domain, &explained)))
    }

    async fn get_counters(
        &self,
        request: Request<proto::CountersRequest>,
    ) -> Result<Response<proto::CountersResponse>, Status> {
        let (domain, descriptor) = counters_request(request.into_inner())?;
        let (explanation, states) = self
            .limiter
            .counters(&domain, &descriptor)
            .await
            .map_err(crate::rls::status_from_error)?;
        Ok(Response::new(counters_to_proto(
            &explanation,
            &states,
            self.limiter.store().status().kind,
        )))
    }

    async fn explain_bucket(
        &self,
        request: Request<proto::BucketRequest>,
    ) -> Result<Response<proto::BucketExplanation>, Status> {
        let request = request.into_inner();
        let quotas = self
            .quotas
            .as_ref()
            .ok_or_else(|| Status::unimplemented("this server has no RLQS face"))?;
        let key = crate::quota::BucketKey::new(&request.bucket)
            .map_err(|reason| Status::invalid_argument(format!("bucket id: {}", reason.label())))?;
        let view = quotas.explain(&request.domain, &key);
        Ok(Response::new(bucket_to_proto(request.domain, &view)))
    }

    async fn top_refused(
        &self,
        request: Request<proto::TopRequest>,
    ) -> Result<Response<proto::TopResponse>, Status> {
        let request = request.into_inner();
        let n = match request.n {
            0 => 20,
            n @ 1..=100 => n as usize,
            n => {
                return Err(Status::invalid_argument(format!(
                    "n must be from 1 to 100, not {n}"
                )));
            }
        };
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let (domain, rule) = (some(&request.domain), some(&request.rule));
        let view = self
            .limiter
            .refused()
            .view(domain.as_deref(), rule.as_deref(), n);
        Ok(Response::new(proto::TopResponse {
            rules: view.iter().map(rule_top_to_proto).collect(),
        }))
    }

    async fn reset_counters(
        &self,
        request: Request<proto::CountersRequest>,
    ) -> Result<Response<proto::ResetResponse>, Status> {
        let info = request
            .extensions()
            .get::<crate::net::grpc::PeerInfo>()
            .cloned();
        let peer = info.as_ref().and_then(|i| i.remote_addr);
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let certs = info.and_then(|i| i.certs);
        let who = self
            .access
            .authorize(
                authorization.as_deref(),
                certs.as_deref().map(Vec::as_slice),
            )
            .await
            .map_err(|refusal| {
                self.access.refused("grpc", &refusal);
                tracing::warn!(?peer, reason = %refusal.log_reason(), "counter reset refused");
                match refusal {
                    super::reset::Refusal::Disabled(_) => {
                        Status::permission_denied(refusal.message())
                    }
                    super::reset::Refusal::Unauthenticated(_) => {
                        Status::unauthenticated(refusal.message())
                    }
                    super::reset::Refusal::Unavailable(_) => Status::unavailable(refusal.message()),
                }
            })?;
        let (domain, descriptor) = counters_request(request.into_inner())?;
        let result = self.limiter.reset(&domain, &descriptor).await;
        self.access.done("grpc", result.is_ok());
        let (explanation, deleted) = result.map_err(crate::rls::status_from_error)?;
        let counters = counter_names(&explanation);
        tracing::warn!(?peer, %who, %domain, ?counters, deleted, "counters reset");
        Ok(Response::new(proto::ResetResponse { counters, deleted }))
    }
}

/// The counters an explanation names, for logs and answers.
pub fn counter_names(explanation: &Explanation) -> Vec<String> {
    explanation
        .limits
        .iter()
        .map(|l| l.op.key.to_string())
        .collect()
}

/// The admin request as Envoy's (the same fields), converted as `ShouldRateLimit` converts.
fn request_from_proto(request: proto::RateLimitRequest) -> Result<limiter::Request, String> {
    let envoy = envoy_rls::RateLimitRequest {
        domain: request.domain,
        descriptors: request
            .descriptors
            .into_iter()
            .map(descriptor_to_envoy)
            .collect(),
        hits_addend: 0,
    };
    crate::rls::convert::request_from_proto(envoy)
}

fn descriptor_to_envoy(d: proto::RateLimitDescriptor) -> envoy_descriptor::RateLimitDescriptor {
    envoy_descriptor::RateLimitDescriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| envoy_descriptor::rate_limit_descriptor::Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit: d.limit.map(
            |o| envoy_descriptor::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
            },
        ),
        ..Default::default()
    }
}

fn counters_request(
    request: proto::CountersRequest,
) -> Result<(String, limiter::Descriptor), Status> {
    let descriptor = request
        .descriptor
        .ok_or_else(|| Status::invalid_argument("a descriptor is required"))?;
    let mut converted = request_from_proto(proto::RateLimitRequest {
        domain: request.domain.clone(),
        descriptors: vec![descriptor],
    })
    .map_err(Status::invalid_argument)?;
    let descriptor = converted
        .descriptors
        .pop()
        .ok_or_else(|| Status::invalid_argument("a descriptor is required"))?;
    Ok((request.domain, descriptor))
}

/// An explanation of a whole request.
pub fn explained_to_proto(domain: String, explained: &Explained) -> proto::ExplainResponse {
    proto::ExplainResponse {
        domain,
        domain_found: explained.domain_found,
        descriptors: explained
            .descriptors
            .iter()
            .map(explanation_to_proto)
            .collect(),
    }
}

/// The state of a descriptor's counters.
pub fn counters_to_proto(
    explanation: &Explanation,
    states: &[CounterState],
    store: &str,
) -> proto::CountersResponse {
    proto::CountersResponse {
        explanation: Some(explanation_to_proto(explanation)),
        counters: states
            .iter()
            .map(|s| proto::CounterState {
                limit: Some(limit_to_proto(&s.limit)),
                used: s.used,
                remaining: s.remaining,
                reset_after_ms: s.reset_after.div_ceil(1000),
                over: s.over,
                degraded: s.degraded,
                overdraft: s.overdraft,
            })
            .collect(),
        store: store.to_owned(),
    }
}

fn explanation_to_proto(e: &Explanation) -> proto::DescriptorExplanation {
    let outcome = match e.outcome {
        Outcome::Matched => ProtoOutcome::Matched,
        Outcome::UnknownDomain => ProtoOutcome::UnknownDomain,
        Outcome::NoMatch => ProtoOutcome::NoMatch,
        Outcome::Depth => ProtoOutcome::Depth,
        Outcome::Whitelisted => ProtoOutcome::Whitelisted,
        Outcome::Unlimited => ProtoOutcome::Unlimited,
        Outcome::Replaced => ProtoOutcome::Replaced,
        Outcome::Override => ProtoOutcome::Override,
    };
    proto::DescriptorExplanation {
        outcome: outcome as i32,
        reason: e.reason.clone(),
        path: e
            .path
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let (kind, pattern) = match &step.kind {
                    StepKind::Exact => (Kind::Exact, step.value.clone()),
                    StepKind::Wildcard(p) => (Kind::Wildcard, p.clone()),
                    StepKind::KeyOnly => (Kind::KeyOnly, String::new()),
                    StepKind::None => (Kind::None, String::new()),
                };
                proto::Step {
                    level: (i + 1) as u32,
                    key: step.key.clone(),
                    value: step.value.clone(),
                    kind: kind as i32,
                    pattern,
                }
            })
            .collect(),
        rule: e.rule.clone().unwrap_or_default(),
        limits: e.limits.iter().map(limit_to_proto).collect(),
        replaced_by: e.replaced_by.clone().unwrap_or_default(),
        shadow_mode: e.shadow_mode,
        quota_mode: e.quota_mode,
    }
}

fn limit_to_proto(l: &ExplainedLimit) -> proto::Limit {
    proto::Limit {
        requests_per_unit: l.limit.requests_per_unit,
        unit: l.limit.window_name(),
        algorithm: l.limit.algorithm.as_str().to_owned(),
        burst: l.limit.burst.unwrap_or(0),
        name: l.limit.name.clone().unwrap_or_default(),
        consistency: l.consistency().as_str().to_owned(),
        failure_mode: l.failure_mode().as_str().to_owned(),
        counter: l.op.key.to_string(),
        store_key: l.store_key.clone(),
        overdraft: l.limit.overdraft,
    }
}

/// An RLQS bucket's explanation in the admin API's terms.
pub fn bucket_to_proto(
    domain: String,
    view: &crate::quota::BucketView,
) -> proto::BucketExplanation {
    use crate::quota::Quota;
    let (assignment, budget, shadow) = match &view.quota {
        Quota::AllowAll { .. } => ("allow_all", None, false),
        Quota::DenyAll { .. } => ("deny_all", None, false),
        Quota::Divided {
            shadow: true,
            budget,
            ..
        } => ("allow_all", Some(*budget), true),
        Quota::Divided { budget, .. } => ("token_bucket", Some(*budget), false),
    };
    let mut answer = proto::BucketExplanation {
        domain,
        descriptor: view
            .order
            .iter()
            .map(|(key, value)| proto::rate_limit_descriptor::Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        rule: view.quota.rule().unwrap_or_default().to_owned(),
        assignment: assignment.to_owned(),
        shadow_mode: shadow,
        tracked: view.tracked,
        ..Default::default()
    };
    if let Some(b) = budget {
        answer.rate = b.rate;
        answer.window_seconds = b.window;
        answer.burst = b.burst;
    }
    if let Some(b) = &view.budget {
        answer.claim = b.claim.rate;
        answer.held = b.held.rate;
        answer.demand = b.demand;
        answer.shares = b
            .shares
            .iter()
            .map(|(stream, share, demand)| {
                let share = share.unwrap_or_default();
                proto::StreamShare {
                    stream: *stream,
                    rate: share.rate,
                    burst: share.burst,
                    demand: *demand,
                }
            })
            .collect();
    }
    answer
}

/// One rule's top refused keys as the admin API says them.
pub fn rule_top_to_proto(top: &crate::limiter::refused::RuleTop) -> proto::RuleTop {
    proto::RuleTop {
        domain: top.domain.clone(),
        rule: top.rule.clone(),
        shadow: top.shadow,
        window_seconds: top.window as f64 / crate::algorithm::SECOND as f64,
        windows: top
            .windows
            .iter()
            .map(|w| proto::WindowTop {
                start: w.start / crate::algorithm::SECOND,
                refused_hits: w.total,
                floor: w.floor,
                keys: w
                    .keys
                    .iter()
                    .map(|k| proto::RefusedKey {
                        key: k.key.clone(),
                        refused: k.count,
                        error: k.error,
                    })
                    .collect(),
            })
            .collect(),
    }
}
