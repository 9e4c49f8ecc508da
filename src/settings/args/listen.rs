//! Listeners: the gRPC and admin HTTP addresses, gRPC TLS, connection and request bounds.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::super::parse::{parse_count, parse_duration, parse_positive_duration, resolve_addr};
use super::named;
use crate::net::connection::ConnectionLimits;
use crate::net::tls::{ReloadingTls, TlsFiles};
use crate::settings::SettingsError;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Listeners")]
pub struct ListenArgs {
    /// gRPC listen address [default: $GRPC_HOST:$GRPC_PORT, i.e. 0.0.0.0:8081]
    #[arg(long, value_name = "HOST:PORT")]
    grpc_addr: Option<String>,
    #[arg(long, env = "GRPC_HOST", hide = true, default_value = "0.0.0.0")]
    grpc_host: String,
    #[arg(long, env = "GRPC_PORT", hide = true, default_value = "8081")]
    grpc_port: u16,

    /// Serve gRPC on this unix socket instead of TCP (local clients; plaintext, without the
    /// TCP connection bounds)
    #[arg(long, env = "GRPC_UDS", value_name = "PATH")]
    grpc_uds: Option<PathBuf>,

    /// Serve gRPC over TLS
    #[arg(long, env = "GRPC_SERVER_USE_TLS")]
    grpc_server_use_tls: bool,

    /// PEM certificate chain of the gRPC listener (re-read when it changes)
    #[arg(long, env = "GRPC_SERVER_TLS_CERT")]
    grpc_server_tls_cert: Option<PathBuf>,

    /// PEM private key of the gRPC listener (re-read when it changes)
    #[arg(long, env = "GRPC_SERVER_TLS_KEY")]
    grpc_server_tls_key: Option<PathBuf>,

    /// PEM CA bundle client certificates must chain to: turns on mutual TLS
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT")]
    grpc_client_tls_cacert: Option<PathBuf>,
    /// Name (DNS name or IP address) client certificates must be valid for, with mutual TLS
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN")]
    grpc_client_tls_san: Option<String>,
    /// Envoy Gateway's name for the same CA bundle.
    #[arg(long, env = "GRPC_SERVER_TLS_CA_CERT", hide = true)]
    grpc_server_tls_ca_cert: Option<PathBuf>,

    /// Age at which a gRPC connection is asked to close (HTTP/2 GOAWAY), ±10 % per process,
    /// so that long-lived clients such as Envoy spread over pods added later
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", default_value = "24h", value_parser = parse_positive_duration)]
    grpc_max_connection_age: Duration,

    /// Time a connection past its age gets to finish its requests before it is closed
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = parse_duration)]
    grpc_max_connection_age_grace: Duration,

    /// Admin HTTP listen address [default: $HOST:$PORT, i.e. 0.0.0.0:8080]
    #[arg(long, value_name = "HOST:PORT")]
    http_addr: Option<String>,
    #[arg(long = "host", env = "HOST", hide = true, default_value = "0.0.0.0")]
    http_host: String,
    #[arg(long = "port", env = "PORT", hide = true, default_value = "8080")]
    http_port: u16,

    /// Also serve every admin endpoint (/rlconfig, /healthcheck, /metrics, /json, and the
    /// admin API's /explain and /counters) on the reference's debug listener, where operators
    /// curl :6070/rlconfig [default: off; on when DEBUG_HOST or DEBUG_PORT is set, at
    /// 0.0.0.0:6070 unless they say otherwise]
    #[arg(long, value_name = "HOST:PORT")]
    debug_addr: Option<String>,
    #[arg(long, env = "DEBUG_HOST", hide = true)]
    debug_host: Option<String>,
    #[arg(long, env = "DEBUG_PORT", hide = true)]
    debug_port: Option<u16>,

    /// Open admin HTTP connections at most (each of the admin and Prometheus listeners);
    /// more wait to be accepted
    #[arg(long, env = "ADMIN_MAX_CONNECTIONS", default_value = "256", value_parser = parse_count::<NonZeroUsize>)]
    admin_max_connections: NonZeroUsize,

    /// Time an admin HTTP client has to send a request's headers; also how long an idle
    /// keep-alive connection is kept, and how long an answer may wait for the client to read
    #[arg(long, env = "ADMIN_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    admin_header_timeout: Duration,

    /// Open gRPC connections at most; more wait to be accepted
    #[arg(long, env = "GRPC_MAX_CONNECTIONS", default_value = "10000", value_parser = parse_count::<NonZeroUsize>)]
    grpc_max_connections: NonZeroUsize,

    /// Time a gRPC client has from connecting to the end of its TLS handshake and HTTP/2
    /// preface; also for a unary call's message to arrive whole after its headers, and how
    /// long an answer may wait for the client to read
    #[arg(long, env = "GRPC_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    grpc_handshake_timeout: Duration,

    /// gRPC requests answered at once, over all connections, each taking its turn once its
    /// message is in; more wait, and a freed turn goes to the waiting connection holding
    /// the fewest
    #[arg(long, env = "GRPC_MAX_IN_FLIGHT", default_value = "1024", value_parser = parse_count::<NonZeroUsize>)]
    grpc_max_in_flight: NonZeroUsize,
}

/// The resolved listener settings.
pub(super) struct Listeners {
    pub grpc_addr: SocketAddr,
    pub grpc_tls: Option<TlsFiles>,
    pub http_addr: SocketAddr,
    pub admin_connections: ConnectionLimits,
    pub grpc_connections: ConnectionLimits,
    pub grpc_max_in_flight: usize,
    pub grpc_max_connection_age: (Duration, Duration),
    pub debug_addr: Option<SocketAddr>,
    pub grpc_uds: Option<PathBuf>,
}

impl ListenArgs {
    pub(super) fn resolve(self) -> Result<Listeners, SettingsError> {
        let grpc_addr = resolve_addr(self.grpc_addr.clone(), &self.grpc_host, self.grpc_port)
            .map_err(|m| named(&["grpc_addr", "grpc_host", "grpc_port"], m))?;
        let http_addr = resolve_addr(self.http_addr.clone(), &self.http_host, self.http_port)
            .map_err(|m| named(&["http_addr", "http_host", "http_port"], m))?;
        let debug_on =
            self.debug_addr.is_some() || self.debug_host.is_some() || self.debug_port.is_some();
        let debug_addr = if debug_on {
            let host = self.debug_host.as_deref().unwrap_or("0.0.0.0");
            let addr = resolve_addr(
                self.debug_addr.clone(),
                host,
                self.debug_port.unwrap_or(6070),
            )
            .map_err(|m| named(&["debug_addr", "debug_host", "debug_port"], m))?;
            Some(addr)
        } else {
            None
        };
        Ok(Listeners {
            grpc_addr,
            grpc_tls: self.grpc_tls()?,
            http_addr,
            admin_connections: ConnectionLimits {
                max_connections: self.admin_max_connections.get(),
                handshake_timeout: self.admin_header_timeout,
            },
            grpc_connections: ConnectionLimits {
                max_connections: self.grpc_max_connections.get(),
                handshake_timeout: self.grpc_handshake_timeout,
            },
            grpc_max_in_flight: self.grpc_max_in_flight.get(),
            grpc_max_connection_age: (
                self.grpc_max_connection_age,
                self.grpc_max_connection_age_grace,
            ),
            debug_addr,
            grpc_uds: self.grpc_uds.clone().filter(|p| !p.as_os_str().is_empty()),
        })
    }

    /// The gRPC listener's certificate files, loaded once now so that a bad file stops
    /// startup with its name.
    fn grpc_tls(&self) -> Result<Option<TlsFiles>, SettingsError> {
        if !self.grpc_server_use_tls {
            return Ok(None);
        }
        if self
            .grpc_uds
            .as_ref()
            .is_some_and(|p| !p.as_os_str().is_empty())
        {
            return Err(named(
                &["grpc_uds"],
                format!(
                    "serves plaintext to local clients; it cannot be used with {}",
                    super::env_name("grpc_server_use_tls")
                ),
            ));
        }
        let (Some(cert), Some(key)) = (&self.grpc_server_tls_cert, &self.grpc_server_tls_key)
        else {
            return Err(named(
                &["grpc_server_use_tls"],
                format!(
                    "needs {} and {}",
                    super::env_name("grpc_server_tls_cert"),
                    super::env_name("grpc_server_tls_key")
                ),
            ));
        };
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self
                .grpc_client_tls_cacert
                .clone()
                .or_else(|| self.grpc_server_tls_ca_cert.clone()),
            client_san: self.grpc_client_tls_san.clone().filter(|s| !s.is_empty()),
        };
        if files.client_san.is_some() && files.client_ca.is_none() {
            let message = format!("needs {}", super::env_name("grpc_client_tls_cacert"));
            return Err(named(&["grpc_client_tls_san"], message));
        }
        ReloadingTls::new(files.clone()).map_err(|m| {
            named(
                &[
                    "grpc_server_tls_cert",
                    "grpc_server_tls_key",
                    "grpc_client_tls_cacert",
                ],
                m,
            )
        })?;
        Ok(Some(files))
    }
}
