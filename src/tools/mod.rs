//! Client-side tools of the CLI: `sluice check` (one request, printed) and `sluice bench`
//! (a load generator), plus the always-OK server used as the transport's ceiling in
//! benchmarks.

pub mod bench;
pub mod check;
pub mod trivial;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

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

/// Connects a gRPC client to `addr` (`host:port` or an `http://` URL).
pub async fn connect(addr: &str) -> Result<RateLimitServiceClient<Channel>, ToolError> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| ToolError::Usage(format!("invalid --addr '{addr}': {e}")))?
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ToolError::Rpc(format!("cannot connect to {url}: {e}")))?;
    Ok(RateLimitServiceClient::new(channel))
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
