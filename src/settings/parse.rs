//! Values as operators write them, as clap value parsers: booleans the Go way, durations like
//! `15s`, ratios, header names, log levels, addresses; and an empty environment variable as
//! an unset one. clap names the flag (and `main` the
//! environment variable) in front of each message here.

use std::ffi::{OsStr, OsString};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::{Arg, ArgAction, Command};

/// Gives every boolean argument of a command one shape: `--flag` (true), `--flag=false` or
/// `--flag false`, and in the flag or its variable the reference's `true/false/1/0` (see
/// [`parse_bool`]). Applied with `#[command(mut_args = switch)]`, so a `bool` field needs
/// only `long`, `env` and, when it is on by default, `default_value = "true"`; where a
/// positional argument follows, the field adds `require_equals = true`.
pub fn switch(arg: Arg) -> Arg {
    if !matches!(arg.get_action(), ArgAction::SetTrue) {
        return arg;
    }
    let on = arg
        .get_default_values()
        .first()
        .is_some_and(|v| v.to_str() == Some("true"));
    arg.action(ArgAction::Set)
        .value_name("BOOL")
        .num_args(0..=1)
        .default_value(if on { "true" } else { "false" })
        .default_missing_value("true")
        .value_parser(parse_bool)
}

/// `command` and its subcommands with every environment variable that is set to the empty
/// string read as if it were not set: the argument takes its default (or stays unset). A
/// templated manifest writes `DEBUG_PORT: ""` for a value it leaves out, and OpenTelemetry's
/// rule for its variables is the same. `get` looks a variable up (the process environment in
/// `main`). An empty value that a setting cannot do without is then reported as missing, under
/// the variable's name, by the check that needs it (`REDIS_URL` for the redis backend).
pub fn empty_env_is_unset(command: Command, get: &dyn Fn(&OsStr) -> Option<OsString>) -> Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    let mut command = command.mut_args(|arg| {
        let empty = arg
            .get_env()
            .and_then(get)
            .is_some_and(|value| value.is_empty());
        if empty { arg.env(None) } else { arg }
    });
    for name in names {
        command = command.mut_subcommand(name, |c| empty_env_is_unset(c, get));
    }
    command
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
        "d" => value * 86_400.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m, h or d)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("'{text}': {e}"))
}

/// A duration that must be more than 0.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("'{text}': must be more than 0")),
        d => Ok(d),
    }
}

/// A count that must be at least 1, as a `NonZero` integer.
pub fn parse_count<T>(text: &str) -> Result<T, String>
where
    T: std::str::FromStr<Err = std::num::ParseIntError>,
{
    text.trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| match e.kind() {
            std::num::IntErrorKind::Zero => "must be at least 1".to_owned(),
            _ => format!("'{text}': {e}"),
        })
}

/// A ratio in (0, 1].
pub fn parse_ratio(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("{value} is not in (0, 1]"))
    }
}

/// An HTTP header name (an RFC 9110 token).
pub fn parse_header_name(text: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !text.is_empty() && text.chars().all(token) {
        Ok(text.to_owned())
    } else {
        Err(format!("'{text}' is not an HTTP header name"))
    }
}

/// A log level: `trace`, `debug`, `info`, `warn`, `error`, and the reference's (logrus)
/// `warning`, `fatal` and `panic`; any case.
pub fn parse_log_level(text: &str) -> Result<String, String> {
    let level = text.to_ascii_lowercase();
    match level.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" => Ok(level),
        "warning" => Ok("warn".to_owned()),
        "fatal" | "panic" => Ok("error".to_owned()),
        _ => Err(format!(
            "'{text}' is not one of trace, debug, info, warn, error"
        )),
    }
}

/// `explicit`, else `host:port` (bracketed when `host` is IPv6), resolved to one address.
pub(super) fn resolve_addr(
    explicit: Option<String>,
    host: &str,
    port: u16,
) -> Result<SocketAddr, String> {
    let text = explicit.unwrap_or_else(|| {
        if host.contains(':') {
            format!("[{host}]:{port}") // an IPv6 host
        } else {
            format!("{host}:{port}")
        }
    });
    text.to_socket_addrs()
        .map_err(|e| format!("'{text}': {e}"))?
        .next()
        .ok_or_else(|| format!("'{text}' resolves to no address"))
}
