//! Test certificates made with the openssl CLI (`scripts/test` installs it): a CA, a server
//! certificate for 127.0.0.1 and localhost, and a client certificate, all signed by the CA.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice::net::tls::TlsFiles;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl not found: run ./scripts/test, which installs it");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory (named after `name`) holding what [`make`] writes.
pub fn fresh(name: &str) -> std::path::PathBuf {
    let dir = super::temp_dir(name);
    make(&dir);
    dir
}

/// Writes `ca.crt`/`ca.key`, `server.crt`/`server.key` (for `localhost` and 127.0.0.1) and
/// `client.crt`/`client.key` (for `client.sluice.test`) into `dir`. Extensions make X.509 v3 certificates (rustls rejects v1).
pub fn make(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=sluice-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "subjectAltName=DNS:client.sluice.test\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for name in ["server", "client"] {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
    }
}

/// The server's TLS files in `dir` (as [`make`] writes them), verifying client certificates
/// against its CA when `mutual`.
pub fn server_tls(dir: &Path, mutual: bool) -> TlsFiles {
    TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client_ca: mutual.then(|| dir.join("ca.crt")),
        client_san: None,
    }
}

/// An endpoint for the gRPC port `port` over TLS to `localhost` (connecting within 5 s),
/// trusting the CA in `ca` and presenting the client certificate in `identity` (directories
/// [`make`] wrote into), each if given; an error as text.
pub fn tls_endpoint(
    port: u16,
    ca: Option<&Path>,
    identity: Option<&Path>,
) -> Result<Endpoint, String> {
    let mut tls = ClientTlsConfig::new().domain_name("localhost");
    if let Some(ca) = ca {
        tls = tls.ca_certificate(Certificate::from_pem(
            std::fs::read(ca.join("ca.crt")).unwrap(),
        ));
    }
    if let Some(dir) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(dir.join("client.crt")).unwrap(),
            std::fs::read(dir.join("client.key")).unwrap(),
        ));
    }
    Ok(Endpoint::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5)))
}
