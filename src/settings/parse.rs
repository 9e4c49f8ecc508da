//! Values as operators write them: booleans the Go way, durations like `15s`, addresses.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::SettingsError;

pub(super) fn resolve_addr(
    name: &str,
    explicit: Option<String>,
    host: &str,
    port: u16,
) -> Result<SocketAddr, SettingsError> {
    let text = explicit.unwrap_or_else(|| {
        if host.contains(':') {
            format!("[{host}]:{port}") // an IPv6 host
        } else {
            format!("{host}:{port}")
        }
    });
    let error = |message: String| SettingsError {
        name: name.to_owned(),
        message,
    };
    text.to_socket_addrs()
        .map_err(|e| error(format!("'{text}': {e}")))?
        .next()
        .ok_or_else(|| error(format!("'{text}' resolves to no address")))
}

/// Parses a boolean the way the reference service (Go's `strconv.ParseBool`) does, plus
/// `yes`/`no`/`on`/`off`.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "y" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "n" | "off" | "" => Ok(false),
        _ => Err(format!("'{text}' is not a boolean (true or false)")),
    }
}

/// Parses a duration such as `15s`, `500ms`, `2m` or `1h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration such as 15s or 500ms"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1_000.0,
        "us" | "µs" => value / 1_000_000.0,
        "m" => value * 60.0,
        "h" => value * 3_600.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("'{text}': {e}"))
}
