//! Who may reset counters: nobody, unless the operator enables it with a bearer token file
//! (`ADMIN_RESET_TOKEN_FILE`, for `DELETE /counters` and `ResetCounters`) or a client
//! certificate name (`ADMIN_RESET_CLIENT_SAN`, for `ResetCounters` on the mutual-TLS gRPC
//! port). Every attempt is logged with who asked and counted in
//! `sluice_counter_resets_total{via, outcome}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::{IntCounterVec, Registry};
use rustls::pki_types::CertificateDer;

use crate::metrics::counter_vec;

/// The longest token file read, in bytes: a token is a line, not a document.
pub const MAX_TOKEN_BYTES: u64 = 4096;

/// What enables counter resets (`ADMIN_RESET_*`); the default enables nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetSettings {
    /// The file holding the bearer token (`ADMIN_RESET_TOKEN_FILE`).
    pub token_file: Option<PathBuf>,
    /// The name a gRPC client certificate must be valid for (`ADMIN_RESET_CLIENT_SAN`).
    pub client_san: Option<String>,
}

/// How long a reset waits for the token file to be read (a file on a mount that hangs must
/// not hold the reset, let alone the server).
pub const TOKEN_READ_DEADLINE: Duration = Duration::from_secs(1);

/// How long start-up waits for the token file to be read.
pub const TOKEN_STARTUP_DEADLINE: Duration = Duration::from_secs(5);

/// Reads the token in `path`: its content without surrounding whitespace (a Kubernetes
/// Secret written with a trailing newline is the same token), at most [`MAX_TOKEN_BYTES`].
/// Anything but a regular file (a FIFO, whose read would wait for a writer; a directory; a
/// device) is refused before it is opened. This blocks on a mount that hangs: callers on the
/// runtime use [`read_token_within`].
pub fn read_token(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{}: not a regular file (a token file must be one; a FIFO, directory or device is refused)",
            path.display()
        ));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut raw = Vec::new();
    file.take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if raw.len() as u64 > MAX_TOKEN_BYTES {
        return Err(format!(
            "{}: longer than {MAX_TOKEN_BYTES} bytes (a token file holds one token)",
            path.display()
        ));
    }
    let text = String::from_utf8(raw).map_err(|_| format!("{}: not UTF-8", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!(
            "{}: empty (a reset token must not be empty)",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// [`read_token`] on a thread of its own, given up after `deadline` (the thread finishes in
/// the background if the file system ever answers).
pub fn read_token_within(path: &Path, deadline: Duration) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_owned();
    std::thread::Builder::new()
        .name("sluice-token-read".into())
        .spawn(move || {
            let _ = tx.send(read_token(&owned));
        })
        .map_err(|e| format!("{}: cannot start a thread to read it: {e}", path.display()))?;
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(format!(
            "{}: not read within {} ms (a mount that does not answer?)",
            path.display(),
            deadline.as_millis()
        ))
    })
}

/// Why a reset was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing enables resets (or nothing this caller can use).
    Disabled(&'static str),
    /// Resets are on, but the caller's credentials are missing or wrong.
    Unauthenticated(String),
    /// The token file cannot be read now; why, for the log only.
    Unavailable(String),
}

impl Refusal {
    /// The message the caller gets. It never names the token file or the system's error:
    /// the caller has not proven who it is ([`Refusal::log_reason`] has the detail).
    pub fn message(&self) -> String {
        match self {
            Refusal::Disabled(how) => format!("counter reset is off: {how}"),
            Refusal::Unauthenticated(why) => format!("counter reset refused: {why}"),
            Refusal::Unavailable(_) => {
                "counter reset unavailable: the reset token cannot be read now (the server's log says why)".into()
            }
        }
    }

    /// The reason as the server logs it (with the token file's problem).
    pub fn log_reason(&self) -> String {
        match self {
            Refusal::Unavailable(why) => format!("counter reset unavailable: {why}"),
            other => other.message(),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Refusal::Disabled(_) => "disabled",
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::Unavailable(_) => "unavailable",
        }
    }
}

/// The reset access check and its metric.
pub struct ResetAccess {
    settings: ResetSettings,
    name: Option<rustls::pki_types::ServerName<'static>>,
    resets: IntCounterVec,
    /// Whether a read of the token file is in flight (at most one: a file system that hangs
    /// holds one thread, not one per attempt).
    reading: Arc<AtomicBool>,
}

impl ResetAccess {
    /// The check for `settings`, counting into `registry`.
    pub fn new(settings: ResetSettings, registry: &Registry) -> Self {
        let resets = counter_vec(
            registry,
            "sluice_counter_resets_total",
            "Counter reset requests of the admin API, by interface (grpc, http) and outcome (reset, disabled, unauthenticated, unavailable, failed)",
            &["via", "outcome"],
        );
        let name = settings
            .client_san
            .as_deref()
            .and_then(|san| crate::net::tls::client_name(san).ok());
        Self {
            settings,
            name,
            resets,
            reading: Arc::default(),
        }
    }

    /// Whether any way to reset is enabled.
    pub fn enabled(&self) -> bool {
        self.settings.token_file.is_some() || self.name.is_some()
    }

    /// Who is asking, from an `authorization` header value and the client's certificate
    /// chain (leaf first; mutual-TLS gRPC only): `Ok` names them for the log. The token file
    /// is read off the runtime, within [`TOKEN_READ_DEADLINE`].
    pub async fn authorize(
        &self,
        authorization: Option<&str>,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<String, Refusal> {
        if !self.enabled() {
            return Err(Refusal::Disabled(
                "set ADMIN_RESET_TOKEN_FILE (bearer token) or ADMIN_RESET_CLIENT_SAN (client certificate) to enable it",
            ));
        }
        if let (Some(name), Some(leaf)) = (&self.name, peer_certs.and_then(|c| c.first()))
            && webpki::EndEntityCert::try_from(leaf)
                .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(name).is_ok())
        {
            return Ok(format!("client certificate for {}", name.to_str()));
        }
        let Some(path) = &self.settings.token_file else {
            return Err(Refusal::Unauthenticated(
                "no client certificate valid for ADMIN_RESET_CLIENT_SAN".into(),
            ));
        };
        // The scheme's name is case-insensitive (RFC 9110).
        let sent = authorization
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token);
        let Some(sent) = sent else {
            return Err(Refusal::Unauthenticated(
                "send `authorization: Bearer <token>` (the token in ADMIN_RESET_TOKEN_FILE)".into(),
            ));
        };
        let token = self.read(path).await.map_err(Refusal::Unavailable)?;
        if constant_time_eq(sent.trim().as_bytes(), token.as_bytes()) {
            Ok("bearer token".into())
        } else {
            Err(Refusal::Unauthenticated("wrong bearer token".into()))
        }
    }

    /// The token, read on a blocking thread, one read at a time, within the deadline.
    async fn read(&self, path: &Path) -> Result<String, String> {
        if self
            .reading
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(format!(
                "{}: an earlier read has not returned (a mount that does not answer?)",
                path.display()
            ));
        }
        struct Done(Arc<AtomicBool>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let done = Done(self.reading.clone());
        let owned = path.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            let _done = done;
            read_token(&owned)
        });
        match tokio::time::timeout(TOKEN_READ_DEADLINE, read).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(format!("{}: the read failed: {e}", path.display())),
            Err(_) => Err(format!(
                "{}: not read within {} ms (a mount that does not answer?)",
                path.display(),
                TOKEN_READ_DEADLINE.as_millis()
            )),
        }
    }

    /// Counts a refused attempt.
    pub fn refused(&self, via: &str, refusal: &Refusal) {
        self.resets.with_label_values(&[via, refusal.label()]).inc();
    }

    /// Counts an attempt that reached the store: `reset` or `failed`.
    pub fn done(&self, via: &str, ok: bool) {
        let outcome = if ok { "reset" } else { "failed" };
        self.resets.with_label_values(&[via, outcome]).inc();
    }
}

/// Compares without an early exit, so that the time taken says nothing about how much of a
/// guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_file(content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("t{}", content.len()));
        std::fs::write(&path, content).unwrap();
        path
    }

    #[tokio::test]
    async fn resets_are_off_until_enabled_and_need_the_exact_token() {
        let off = ResetAccess::new(ResetSettings::default(), &Registry::new());
        assert!(matches!(
            off.authorize(Some("Bearer x"), None).await,
            Err(Refusal::Disabled(_))
        ));
        let settings = ResetSettings {
            token_file: Some(token_file("s3cret-token\n")),
            client_san: None,
        };
        let on = ResetAccess::new(settings, &Registry::new());
        for right in [
            "Bearer s3cret-token",
            "bearer s3cret-token",
            "BEARER  s3cret-token",
        ] {
            assert_eq!(
                on.authorize(Some(right), None).await,
                Ok("bearer token".into())
            );
        }
        for wrong in [
            None,
            Some("s3cret-token"),
            Some("Bearer s3cret-toke"),
            Some("Bearer s3cret-token2"),
            Some("Bearer "),
            Some("Basic s3cret-token"),
        ] {
            assert!(
                matches!(
                    on.authorize(wrong, None).await,
                    Err(Refusal::Unauthenticated(_))
                ),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn a_token_file_must_hold_one_short_token() {
        assert!(
            read_token(&token_file("  \n"))
                .unwrap_err()
                .contains("empty")
        );
        let long = "x".repeat(MAX_TOKEN_BYTES as usize + 1);
        assert!(
            read_token(&token_file(&long))
                .unwrap_err()
                .contains("longer")
        );
        assert!(read_token(Path::new("/nonexistent/token")).is_err());
        assert_eq!(read_token(&token_file("abc\r\n")).unwrap(), "abc");
    }

    #[test]
    fn comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(!constant_time_eq(b"a", b""));
    }
}
