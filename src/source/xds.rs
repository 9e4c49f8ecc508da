//! The xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`): a state-of-the-world ADS client for
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, as Envoy Gateway serves it.
//!
//! Every response replaces the whole policy through the same compile and all-or-nothing swap
//! as files ([`PolicySwap`]). A valid one is ACKed with its version and nonce; an invalid one
//! is NACKed with the last accepted version, the nonce and every error, and the policy in
//! force keeps serving. When the control plane goes away the policy in force stays; the client
//! reconnects with a jittered exponential backoff and subscribes again. No request ever waits
//! on the control plane: it only swaps the policy.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::{Message, Name};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::PolicySwap;
use crate::config::{ConfigError, LoadOptions, Loaded, proto};
use crate::health::Health;

/// The xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`).
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// The control plane's ADS address.
    pub server_url: String,
    /// The node id Sluice subscribes as.
    pub node_id: String,
    /// Node metadata (string values).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the subscription.
    pub headers: Vec<(String, String)>,
    /// Time allowed to connect.
    pub connect_timeout: Duration,
    /// First wait before reconnecting.
    pub backoff_initial: Duration,
    /// Longest wait between reconnections.
    pub backoff_max: Duration,
    /// Each wait is moved at random by up to this share of itself (0: not at all).
    pub backoff_random: f64,
    /// Largest control-plane message accepted.
    pub max_message_bytes: usize,
    /// Serve before the first configuration arrives (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub force_start: bool,
    /// TLS to the control plane.
    pub tls: Option<XdsTls>,
    /// Domains whose rules are usage budgets (`overdraft: true`), which the proto cannot
    /// say; `*` for every domain (`XDS_USAGE_BUDGET_DOMAINS`).
    pub usage_budget_domains: Vec<String>,
}

/// TLS to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// CA bundle its certificate must chain to (`None`: the system roots).
    pub ca: Option<PathBuf>,
    /// Client certificate (mutual TLS).
    pub cert: Option<PathBuf>,
    /// Client key.
    pub key: Option<PathBuf>,
    /// Name its certificate must be valid for (`None`: the address's host).
    pub server_name: Option<String>,
}

/// The resource type Sluice subscribes to.
pub fn type_url() -> String {
    RateLimitConfig::type_url()
}

/// The client's handles on the running service.
pub struct XdsSource {
    settings: XdsSettings,
    load: LoadOptions,
    swap: PolicySwap,
    health: Arc<Health>,
}

/// What the client keeps across responses and reconnections.
#[derive(Default)]
struct Subscription {
    /// The version in force ("" before the first).
    version: String,
}

impl XdsSource {
    /// A client that swaps what the control plane sends into `swap`, and tells `health` when
    /// the first configuration is in force.
    pub fn new(
        settings: XdsSettings,
        load: LoadOptions,
        swap: PolicySwap,
        health: Arc<Health>,
    ) -> Self {
        Self {
            settings,
            load,
            swap,
            health,
        }
    }

    /// Subscribes, and subscribes again whenever the stream ends, until `stop` resolves.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut subscription = Subscription::default();
        let mut wait = self.settings.backoff_initial;
        loop {
            let session = self.session(&mut subscription);
            let outcome = tokio::select! {
                _ = &mut stop => return,
                outcome = session => outcome,
            };
            match outcome {
                // A session that got a response starts the backoff over.
                Ok(true) => wait = self.settings.backoff_initial,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(
                        server = %self.settings.server_url,
                        %error,
                        retry_in = ?wait,
                        "xDS control plane unreachable or stream failed; the config in force stays"
                    );
                    self.swap
                        .connection(format!("unreachable ({error}); retrying"));
                }
            }
            let pause = crate::clock::jittered(wait, self.settings.backoff_random);
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(pause) => {}
            }
            wait = wait.saturating_mul(2).min(self.settings.backoff_max);
        }
    }

    /// One stream: subscribe, then answer every response with an ACK or a NACK. `Ok(got)`
    /// when the server ended it, `got` telling whether any response came.
    async fn session(&self, subscription: &mut Subscription) -> Result<bool, String> {
        let channel = self.channel().await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.settings.max_message_bytes);
        let (requests, outgoing) = tokio::sync::mpsc::channel(2);
        let first = self.request(&subscription.version, "", None);
        requests.send(first).await.map_err(|e| e.to_string())?;
        let mut call = tonic::Request::new(
            tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(outgoing),
        );
        for (key, value) in &self.settings.headers {
            let key: tonic::metadata::MetadataKey<tonic::metadata::Ascii> =
                key.parse().map_err(|_| format!("header name '{key}'"))?;
            let value = value
                .parse()
                .map_err(|_| format!("header value for '{key}'"))?;
            call.metadata_mut().insert(key, value);
        }
        let mut responses = client
            .stream_aggregated_resources(call)
            .await
            .map_err(|status| status.to_string())?
            .into_inner();
        tracing::info!(server = %self.settings.server_url, node = %self.settings.node_id, "xDS subscribed");
        self.swap.connection(format!(
            "subscribed to {} as node {}",
            self.settings.server_url, self.settings.node_id
        ));
        let mut got = false;
        while let Some(response) = responses.message().await.map_err(|s| s.to_string())? {
            got = true;
            let reply = self.answer(subscription, response).await;
            if requests.send(reply).await.is_err() {
                break;
            }
        }
        tracing::info!(server = %self.settings.server_url, "xDS stream ended by the control plane");
        self.swap
            .connection("stream ended by the control plane; resubscribing".into());
        Ok(got)
    }

    /// Applies one response; the ACK or NACK to send back.
    async fn answer(
        &self,
        subscription: &mut Subscription,
        response: DiscoveryResponse,
    ) -> DiscoveryRequest {
        let version = response.version_info.clone();
        let nonce = response.nonce.clone();
        let load = self.load;
        let budgets = self.settings.usage_budget_domains.clone();
        let compiled = tokio::task::spawn_blocking(move || compile(&response, load, &budgets))
            .await
            .unwrap_or_else(|e| {
                Err(vec![ConfigError::file(
                    "xds",
                    format!("compile failed: {e}"),
                )])
            });
        let reason = format!("xds version {version}");
        let ok = compiled.is_ok();
        let errors = compiled.as_ref().err().map(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        });
        if self.swap.apply(compiled, &reason) {
            subscription.version = version;
            self.health.set_first_config_in(true);
        }
        if ok {
            self.request(&subscription.version, &nonce, None)
        } else {
            let detail = RpcStatus {
                code: tonic::Code::InvalidArgument as i32,
                message: errors.unwrap_or_default(),
                details: Vec::new(),
            };
            self.request(&subscription.version, &nonce, Some(detail))
        }
    }

    fn request(&self, version: &str, nonce: &str, error: Option<RpcStatus>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.node()),
            resource_names: Vec::new(),
            type_url: type_url(),
            response_nonce: nonce.to_owned(),
            error_detail: error,
            ..Default::default()
        }
    }

    fn node(&self) -> Node {
        let fields = self
            .settings
            .node_metadata
            .iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue(v.clone())),
                };
                (k.clone(), value)
            })
            .collect();
        Node {
            id: self.settings.node_id.clone(),
            metadata: Some(Struct { fields }).filter(|s| !s.fields.is_empty()),
            ..Default::default()
        }
    }

    /// A channel to the control plane, over TLS when asked for.
    async fn channel(&self) -> Result<Channel, String> {
        let url = &self.settings.server_url;
        let tls = self.settings.tls.as_ref();
        let url = crate::net::tls::client_url(url, tls.is_some());
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL '{url}': {e}"))?
            .connect_timeout(self.settings.connect_timeout);
        if let Some(tls) = tls {
            let mut config = ClientTlsConfig::new().with_enabled_roots();
            if let Some(ca) = &tls.ca {
                let pem = std::fs::read(ca).map_err(|e| {
                    format!("CONFIG_GRPC_XDS_SERVER_TLS_CACERT '{}': {e}", ca.display())
                })?;
                config = config.ca_certificate(Certificate::from_pem(pem));
            }
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                let cert = std::fs::read(cert).map_err(|e| {
                    format!("CONFIG_GRPC_XDS_CLIENT_TLS_CERT '{}': {e}", cert.display())
                })?;
                let key = std::fs::read(key).map_err(|e| {
                    format!("CONFIG_GRPC_XDS_CLIENT_TLS_KEY '{}': {e}", key.display())
                })?;
                config = config.identity(Identity::from_pem(cert, key));
            }
            if let Some(name) = &tls.server_name {
                config = config.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| format!("xDS TLS: {e}"))?;
        }
        endpoint
            .connect()
            .await
            .map_err(|e| format!("connect to {url}: {e}"))
    }
}

/// The policy of one response, or every reason it cannot be.
fn compile(
    response: &DiscoveryResponse,
    load: LoadOptions,
    budgets: &[String],
) -> Result<Loaded, Vec<ConfigError>> {
    let expected = type_url();
    if response.type_url != expected {
        return Err(vec![ConfigError::file(
            "xds",
            format!(
                "unexpected type_url '{}' (expected {expected})",
                response.type_url
            ),
        )]);
    }
    let mut configs = Vec::with_capacity(response.resources.len());
    let mut errors = Vec::new();
    for (i, any) in response.resources.iter().enumerate() {
        if any.type_url != expected {
            errors.push(ConfigError::file(
                &format!("resource[{i}]"),
                format!("unexpected type_url '{}'", any.type_url),
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => configs.push(config),
            Err(e) => errors.push(ConfigError::file(
                &format!("resource[{i}]"),
                format!("does not decode as RateLimitConfig: {e}"),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let policy = proto::compile_resources(&configs, load, budgets)?;
    let mut files: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
    files.sort();
    Ok(Loaded { policy, files })
}
