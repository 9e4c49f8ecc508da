//! A plain HTTP/1.1 GET for the tools that read JSON over HTTP (`sluice top` from the admin
//! port, `sluice advise` from Prometheus's API): one request per connection, bounded in time
//! and size, chunked bodies undone.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: its status code and body.
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, dechunked.
    pub body: String,
}

/// `GET path` from `host` (`host:port`, a name resolved as the OS does), within `limit`,
/// reading at most `max_bytes`; the error says what failed.
pub async fn get(
    host: &str,
    path: &str,
    limit: Duration,
    max_bytes: u64,
) -> Result<Answer, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.take(max_bytes).read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("no answer within {limit:?}"))?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "not an HTTP status line: {}",
                head.lines().next().unwrap_or("")
            )
        })?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(Answer { status, body })
}

/// A chunked body's data.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// `value` percent-encoded for a query string or a path segment.
pub fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
