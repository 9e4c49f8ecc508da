//! An xDS control plane for tests: an ADS server built on the real generated service
//! (envoy-types), serving one snapshot as go-control-plane does (the version as the nonce),
//! recording every request a client sends.

use std::pin::Pin;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use parking_lot::Mutex;
use prost::{Message, Name};
use tokio::sync::watch;
use tonic::codegen::tokio_stream::Stream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// What the control plane serves: a version and its resources (`None`: nothing yet).
type Snapshot = Option<(String, Vec<Any>)>;

#[derive(Clone)]
pub struct ControlPlane {
    snapshot: watch::Sender<Snapshot>,
    pub seen: std::sync::Arc<Mutex<Vec<DiscoveryRequest>>>,
    /// Ends every stream (a control plane going away).
    closed: watch::Sender<bool>,
    /// Serves only this node id, if set (go-control-plane's snapshot per node).
    node: std::sync::Arc<Mutex<Option<String>>>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        // The first request names the node: a node without a snapshot gets nothing.
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| Status::aborted("no request"))?;
        let node = first
            .node
            .as_ref()
            .map(|n| n.id.clone())
            .unwrap_or_default();
        let served = self.node.lock().as_ref().is_none_or(|only| *only == node);
        let seen = self.seen.clone();
        seen.lock().push(first);
        tokio::spawn(async move {
            while let Ok(Some(request)) = incoming.message().await {
                seen.lock().push(request);
            }
        });
        let mut snapshot = self.snapshot.subscribe();
        let mut closed = self.closed.subscribe();
        let (out, responses) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                if *closed.borrow() {
                    return;
                }
                let current = snapshot.borrow_and_update().clone();
                if let Some((version, resources)) = current.filter(|_| served) {
                    let response = DiscoveryResponse {
                        version_info: version.clone(),
                        resources,
                        type_url: RateLimitConfig::type_url(),
                        nonce: version,
                        ..Default::default()
                    };
                    if out.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    changed = snapshot.changed() => if changed.is_err() { return },
                    _ = closed.changed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A control plane listening on a free port until dropped.
pub struct Running {
    pub plane: ControlPlane,
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// A control plane as Envoy Gateway's: TLS with the certificates in `certs`
    /// (`common::certs`), client certificates from the same CA required.
    pub async fn start_mutual_tls(certs: &std::path::Path) -> Self {
        let read = |name: &str| std::fs::read(certs.join(name)).unwrap();
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                read("server.crt"),
                read("server.key"),
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(read("ca.crt")));
        Self::start_with("127.0.0.1:0".parse().unwrap(), Some(tls)).await
    }

    pub async fn start_on(addr: std::net::SocketAddr) -> Self {
        Self::start_with(addr, None).await
    }

    pub async fn start_with(
        addr: std::net::SocketAddr,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Self {
        let plane = ControlPlane {
            snapshot: watch::channel(None).0,
            seen: Default::default(),
            closed: watch::channel(false).0,
            node: Default::default(),
        };
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = AggregatedDiscoveryServiceServer::new(plane.clone());
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        tokio::spawn(builder.add_service(service).serve_with_incoming_shutdown(
            tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            plane,
            addr,
            stop: Some(stop),
        }
    }

    /// Client settings for this control plane: node `envoy-ratelimit`, reconnecting within
    /// a few hundred milliseconds.
    pub fn client(&self) -> sluice::source::xds::XdsSettings {
        sluice::source::xds::XdsSettings {
            server_url: self.addr.to_string(),
            node_id: "envoy-ratelimit".into(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            connect_timeout: std::time::Duration::from_secs(2),
            backoff_initial: std::time::Duration::from_millis(100),
            backoff_max: std::time::Duration::from_millis(400),
            backoff_random: 0.5,
            max_message_bytes: 4 * 1024 * 1024,
            force_start: false,
            tls: None,
            usage_budget_domains: Vec::new(),
        }
    }

    /// Serves only `node` from now on.
    pub fn only_for(&self, node: &str) {
        *self.plane.node.lock() = Some(node.to_owned());
    }

    pub fn serve(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|c| Any {
                type_url: RateLimitConfig::type_url(),
                value: c.encode_to_vec(),
            })
            .collect();
        self.plane
            .snapshot
            .send_replace(Some((version.into(), resources)));
    }

    pub fn serve_any(&self, version: &str, resources: Vec<Any>) {
        self.plane
            .snapshot
            .send_replace(Some((version.into(), resources)));
    }

    /// Waits for the reply to `version` (its nonce): the request Sluice sent.
    pub async fn reply_to(&self, version: &str) -> DiscoveryRequest {
        let mut found = None;
        let what = format!("a reply to version {version}");
        super::eventually(&what, || {
            found = self
                .plane
                .seen
                .lock()
                .iter()
                .find(|r| r.response_nonce == version)
                .cloned();
            std::future::ready(found.is_some())
        })
        .await;
        found.unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.plane.closed.send_replace(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
