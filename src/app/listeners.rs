//! The bound sockets of a server: gRPC over TCP or a unix socket, admin HTTP, and the
//! optional Prometheus and debug listeners.

use tokio::net::TcpListener;

use super::AppError;
use crate::settings::Settings;

/// Connections the kernel queues for each listener before Sluice accepts them.
const LISTEN_BACKLOG: u32 = 1024;

/// The gRPC listener: TCP, or a unix socket (`GRPC_UDS`).
pub enum GrpcListener {
    /// TCP, with the connection bounds and TLS if configured.
    Tcp(TcpListener),
    /// A unix socket at this path: local clients, plaintext, without the TCP bounds.
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

impl GrpcListener {
    pub(super) fn describe(&self) -> Result<String, AppError> {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .map_err(|e| AppError::Serve(e.to_string())),
            Self::Unix(_, path) => Ok(format!("unix:{}", path.display())),
        }
    }
}

/// The bound sockets of a server.
pub struct Listeners {
    /// gRPC.
    pub grpc: GrpcListener,
    /// Admin HTTP.
    pub http: TcpListener,
    /// A separate Prometheus listener (`USE_PROMETHEUS`), if configured.
    pub metrics: Option<TcpListener>,
    /// The reference's debug listener (`DEBUG_HOST`, `DEBUG_PORT`), if configured.
    pub debug: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses of `settings`.
    pub async fn bind(settings: &Settings) -> Result<Self, AppError> {
        let bind = |addr: std::net::SocketAddr| async move {
            // A backlog of 1,024 (the kernel caps it at somaxconn): past a connection cap the
            // listener stops accepting, and the connections waiting meanwhile queue here.
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            };
            socket
                .and_then(|socket| {
                    socket.set_reuseaddr(true)?;
                    socket.bind(addr)?;
                    socket.listen(LISTEN_BACKLOG)
                })
                .map_err(|source| AppError::Bind { addr, source })
        };
        let metrics = match &settings.prometheus {
            Some(p) => Some(bind(p.addr).await?),
            None => None,
        };
        let debug = match settings.debug_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Self {
            grpc: match &settings.grpc_uds {
                Some(path) => {
                    // A socket left by an earlier process would refuse the bind.
                    let _ = std::fs::remove_file(path);
                    let listener = tokio::net::UnixListener::bind(path).map_err(|source| {
                        AppError::Serve(format!("GRPC_UDS '{}': {source}", path.display()))
                    })?;
                    GrpcListener::Unix(listener, path.clone())
                }
                None => GrpcListener::Tcp(bind(settings.grpc_addr).await?),
            },
            http: bind(settings.http_addr).await?,
            metrics,
            debug,
        })
    }
}
