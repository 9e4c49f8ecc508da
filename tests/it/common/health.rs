//! gRPC health checks (`grpc.health.v1`) as a probe asks them, over one connection.

use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

pub use tonic_health::pb::health_check_response::ServingStatus as Status;

/// A health client on one connection to a gRPC port.
#[derive(Clone)]
pub struct Health(HealthClient<Channel>);

impl Health {
    /// Connects to the gRPC port at `addr` (`127.0.0.1:PORT`).
    pub async fn connect(addr: impl std::fmt::Display) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self(HealthClient::new(channel))
    }

    /// The status reported for `service` (`""`: the server as a whole); `Unknown` for a
    /// value outside the enum.
    pub async fn status(&self, service: &str) -> ServingStatus {
        let status = self
            .0
            .clone()
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        ServingStatus::try_from(status).unwrap_or(ServingStatus::Unknown)
    }
}
