//! Client-side tools of the CLI: `sluice check` (one request, printed), `sluice explain` and
//! `sluice counters` (the admin API), `sluice bench` (a load generator), plus the always-OK
//! server used as the transport's ceiling in benchmarks; `sluice top` and `sluice advise`
//! (refused keys, and limits from what Prometheus measured).

pub mod admin;
pub mod advise;
pub mod bench;
pub mod check;
pub mod flood;
pub mod http;
pub mod top;
pub mod trivial;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use std::path::PathBuf;

use clap::Args;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Why a tool failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The server could not be reached or answered with an error.
    #[error("{0}")]
    Rpc(String),
}

/// How the client tools reach a server that serves gRPC over TLS (`GRPC_SERVER_USE_TLS`).
#[derive(Debug, Clone, Default, Args)]
pub struct ClientTls {
    /// PEM CA bundle to trust; turns TLS on (as does an https:// --addr)
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that require one (mutual TLS)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name to verify the server's certificate against (default: the host of --addr)
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl ClientTls {
    fn enabled(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_server_name.is_some()
    }

    fn config(&self) -> Result<ClientTlsConfig, ToolError> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                ToolError::Usage(format!("cannot read {flag} '{}': {e}", path.display()))
            })
        };
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &self.tls_ca {
            config = config.ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            config = config.identity(Identity::from_pem(
                read("--tls-cert", cert)?,
                read("--tls-key", key)?,
            ));
        }
        if let Some(name) = &self.tls_server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// Connects a gRPC client to `addr` (`host:port`, or an `http://` or `https://` URL), over
/// TLS when `tls` asks for it or the URL is `https://`.
pub async fn connect(
    addr: &str,
    tls: &ClientTls,
) -> Result<RateLimitServiceClient<Channel>, ToolError> {
    Ok(RateLimitServiceClient::new(channel(addr, tls).await?))
}

/// A gRPC channel to `addr`, as [`connect`] makes it.
pub async fn channel(addr: &str, tls: &ClientTls) -> Result<Channel, ToolError> {
    let url = crate::net::tls::client_url(addr, tls.enabled());
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| ToolError::Usage(format!("invalid --addr '{addr}': {e}")))?
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        endpoint = endpoint
            .tls_config(tls.config()?)
            .map_err(|e| ToolError::Usage(format!("invalid TLS settings: {e}")))?;
    } else if tls.enabled() {
        return Err(ToolError::Usage(format!(
            "--addr '{addr}' is plain http:// but TLS options were given"
        )));
    }
    endpoint
        .connect()
        .await
        .map_err(|e| ToolError::Rpc(format!("cannot connect to {url}: {e}")))
}

/// Parses `k=v,k2=v2` into a descriptor.
pub fn parse_descriptor(text: &str) -> Result<RateLimitDescriptor, ToolError> {
    let entries = text
        .split(',')
        .map(|pair| {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                ToolError::Usage(format!(
                    "invalid --descriptor '{text}': '{pair}' is not key=value"
                ))
            })?;
            if key.is_empty() {
                return Err(ToolError::Usage(format!(
                    "invalid --descriptor '{text}': empty key"
                )));
            }
            Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}
