//! TLS and mutual TLS for the gRPC listener, with certificates re-read when their files
//! change (cert-manager and Kubernetes rotate them in place; a restart must not be needed).
//!
//! Handshakes run in their own tasks, so a slow or broken client never holds up the accept
//! loop; a failed handshake is logged and dropped, never fatal to the server. Connections
//! count toward the gRPC connection cap from accept on, and the TLS handshake and then the
//! HTTP/2 preface must be over within the handshake timeout (see [`super::connection`]).

use parking_lot::{Mutex, RwLock};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::ServerConfig;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

use super::connection::{ConnectionLimits, Guarded, accept_into};

/// How often the certificate files are checked for changes, at most.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The PEM files of the gRPC listener (`GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY`, and
/// for mutual TLS `GRPC_CLIENT_TLS_CACERT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA bundle that client certificates must chain to; `None`: no client certificates.
    pub client_ca: Option<PathBuf>,
    /// A name (DNS name or IP address) client certificates must also be valid for
    /// (`GRPC_CLIENT_TLS_SAN`), with `client_ca`.
    pub client_san: Option<String>,
}

/// A server TLS configuration that follows its files.
pub struct ReloadingTls {
    files: TlsFiles,
    current: RwLock<(Vec<Option<SystemTime>>, Arc<ServerConfig>)>,
    last_check: Mutex<Instant>,
}

impl ReloadingTls {
    /// Loads the files; the error names the file that is missing or wrong.
    pub fn new(files: TlsFiles) -> Result<Self, String> {
        let config = build(&files)?;
        Ok(Self {
            current: RwLock::new((stamps(&files), config)),
            files,
            last_check: Mutex::new(Instant::now()),
        })
    }

    /// The configuration for a new connection, rebuilt first if the files changed. A change
    /// that does not load (e.g. a key written before its certificate) keeps the previous one.
    pub fn config(&self) -> Arc<ServerConfig> {
        let due = {
            let mut last = self.last_check.lock();
            let due = last.elapsed() >= CHECK_INTERVAL;
            if due {
                *last = Instant::now();
            }
            due
        };
        if due {
            let now = stamps(&self.files);
            let changed = self.current.read().0 != now;
            if changed {
                match build(&self.files) {
                    Ok(config) => {
                        tracing::info!("TLS certificates reloaded");
                        *self.current.write() = (now, config);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "TLS certificates changed but do not load; keeping the previous ones")
                    }
                }
            }
        }
        self.current.read().1.clone()
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    .collect()
}

fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|iter| iter.collect())
        .map_err(|e| format!("GRPC_SERVER_TLS_CERT '{}': {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "GRPC_SERVER_TLS_CERT '{}': no certificate",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("GRPC_SERVER_TLS_KEY '{}': {e}", files.key.display()))?;
    let builder = ServerConfig::builder();
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT '{}': {e}", ca.display()))?
            {
                let cert =
                    cert.map_err(|e| format!("GRPC_CLIENT_TLS_CACERT '{}': {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT '{}': {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT '{}': {e}", ca.display()))?;
            match &files.client_san {
                None => builder.with_client_cert_verifier(verifier),
                Some(san) => builder.with_client_cert_verifier(Arc::new(SanVerifier {
                    inner: verifier,
                    name: client_name(san).map_err(|e| format!("GRPC_CLIENT_TLS_SAN {e}"))?,
                })),
            }
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The URL a gRPC client dials for `addr`: as given when it has a scheme, else `https://`
/// with TLS and `http://` without.
pub fn client_url(addr: &str, tls: bool) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

/// A name client certificates must be valid for (`GRPC_CLIENT_TLS_SAN`,
/// `ADMIN_RESET_CLIENT_SAN`); the error says what is wrong, the caller which setting.
pub fn client_name(san: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    rustls::pki_types::ServerName::try_from(san.to_owned())
        .map_err(|e| format!("'{san}': {e} (a DNS name or an IP address)"))
}

/// Client certificates that chain to the CA (the inner verifier) and are valid for one name,
/// as the reference checks `GRPC_CLIENT_TLS_SAN`.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    name: rustls::pki_types::ServerName<'static>,
}

impl ClientCertVerifier for SanVerifier {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// TLS connections accepted on `listener` within `limits`, for `serve_with_incoming`; each
/// closed `lifetime` after it was accepted, if given.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    limits: ConnectionLimits,
    lifetime: Option<Duration>,
    turns: Arc<super::turns::Turns>,
) -> ReceiverStream<Result<Guarded<TlsStream<TcpStream>>, std::io::Error>> {
    // Handshakes run on their own tasks: a slow one must not hold up the next accept.
    accept_into(listener, limits, 128, move |accepted, tx| {
        let acceptor = TlsAcceptor::from(tls.config());
        let born = tokio::time::Instant::now();
        let turns = turns.clone();
        tokio::spawn(async move {
            let peer = accepted.stream.peer_addr().ok();
            let handshake = acceptor.accept(accepted.stream);
            let evicted = accepted.ticket.evicted();
            let outcome = tokio::select! {
                outcome = tokio::time::timeout_at(accepted.deadline, handshake) => outcome,
                _ = evicted => {
                    tracing::debug!(?peer, "TLS handshake closed to make room");
                    return;
                }
            };
            match outcome {
                Ok(Ok(tls_stream)) => {
                    // The rest of the deadline is for the HTTP/2 preface.
                    let rest = lifetime.map(|l| l.saturating_sub(born.elapsed()));
                    let guarded = Guarded::new(
                        tls_stream,
                        accepted.permit,
                        accepted.deadline,
                        accepted.ticket,
                    )
                    .living(rest)
                    .stalling_after(limits.handshake_timeout)
                    .of_peer(turns.peer());
                    let _ = tx.send(Ok(guarded)).await;
                }
                Ok(Err(e)) => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
            }
        });
        std::future::ready(true)
    })
}
