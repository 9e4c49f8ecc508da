//! Traces: the reference's `TRACING_*` variables with the standard `OTEL_EXPORTER_OTLP_*`
//! and `OTEL_BSP_*` ones. Every value is checked here, so that the exporter gets no surprise.

use std::num::NonZeroUsize;
use std::time::Duration;

use clap::Args;

use super::super::parse::parse_count;
use super::named;
use crate::settings::SettingsError;
use crate::traces::{OtlpProtocol, TracingSettings};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Traces (OpenTelemetry)")]
pub struct TracingArgs {
    /// Export OpenTelemetry spans of every decision over OTLP
    #[arg(long, env = "TRACING_ENABLED")]
    tracing_enabled: bool,

    /// OTLP transport: http (protobuf over HTTP) or grpc [default: http, or OTEL_EXPORTER_OTLP_PROTOCOL's]
    #[arg(long, env = "TRACING_EXPORTER_PROTOCOL")]
    tracing_exporter_protocol: Option<String>,

    /// The resource's service.name
    #[arg(long, env = "TRACING_SERVICE_NAME", default_value = "RateLimit")]
    tracing_service_name: String,

    /// The resource's service.namespace
    #[arg(long, env = "TRACING_SERVICE_NAMESPACE", default_value = "")]
    tracing_service_namespace: String,

    /// The resource's service.instance.id (the pod name, say) [default: a random UUID]
    #[arg(long, env = "TRACING_SERVICE_INSTANCE_ID", default_value = "")]
    tracing_service_instance_id: String,

    /// Share of traces started here that are sampled, in [0, 1]; a caller's decision wins
    #[arg(long, env = "TRACING_SAMPLING_RATE", default_value = "1", value_parser = parse_sampling_rate)]
    tracing_sampling_rate: f64,

    /// Add descriptor values (often user ids) to spans; off, spans carry keys only
    #[arg(long, env = "TRACING_DESCRIPTOR_VALUES")]
    tracing_descriptor_values: bool,

    /// The collector's base URL (/v1/traces is added for http) [default: http://localhost:4318, grpc: :4317]
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otel_exporter_otlp_endpoint: Option<String>,

    /// The collector's URL for traces, used as is (wins over OTEL_EXPORTER_OTLP_ENDPOINT)
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    otel_exporter_otlp_traces_endpoint: Option<String>,

    /// Headers sent with every export: k=v pairs separated by commas, values URL-encoded
    #[arg(long, env = "OTEL_EXPORTER_OTLP_HEADERS")]
    otel_exporter_otlp_headers: Option<String>,

    /// Headers for traces (added to OTEL_EXPORTER_OTLP_HEADERS, winning on the same name)
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_HEADERS")]
    otel_exporter_otlp_traces_headers: Option<String>,

    /// Longest wait for one export, in milliseconds
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TIMEOUT", default_value = "10000", value_parser = parse_millis)]
    otel_exporter_otlp_timeout: Duration,

    /// Longest wait for one export of traces, in milliseconds [default: OTEL_EXPORTER_OTLP_TIMEOUT]
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", value_parser = parse_millis)]
    otel_exporter_otlp_traces_timeout: Option<Duration>,

    /// OTLP transport by its standard name: grpc or http/protobuf
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    otel_exporter_otlp_protocol: Option<String>,

    /// OTLP transport for traces: grpc or http/protobuf
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")]
    otel_exporter_otlp_traces_protocol: Option<String>,

    /// Spans waiting for export at most; more are dropped and counted
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value = "2048", value_parser = parse_count::<NonZeroUsize>)]
    otel_bsp_max_queue_size: NonZeroUsize,

    /// Spans in one export at most
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value = "512", value_parser = parse_count::<NonZeroUsize>)]
    otel_bsp_max_export_batch_size: NonZeroUsize,

    /// Longest time a span waits for its batch, in milliseconds
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value = "5000", value_parser = parse_millis)]
    otel_bsp_schedule_delay: Duration,
}

/// A number of milliseconds (the OTel variables' unit), more than zero.
fn parse_millis(text: &str) -> Result<Duration, String> {
    let ms: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number of milliseconds"))?;
    if ms == 0 {
        return Err("must be more than 0 milliseconds".into());
    }
    Ok(Duration::from_millis(ms))
}

/// A share in [0, 1] (the reference clamps outside values; a typo there is more likely).
fn parse_sampling_rate(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} is not in [0, 1]"))
    }
}

impl TracingArgs {
    /// The exporter's settings, when `TRACING_ENABLED` asks for traces.
    pub(super) fn resolve(&self) -> Result<Option<TracingSettings>, SettingsError> {
        if !self.tracing_enabled {
            return Ok(None);
        }
        let protocol = self.protocol()?;
        let endpoint = match (
            non_empty(&self.otel_exporter_otlp_traces_endpoint),
            non_empty(&self.otel_exporter_otlp_endpoint),
        ) {
            (Some(url), _) => check_url(url)
                .map_err(|m| named(&["otel_exporter_otlp_traces_endpoint"], m))?
                .to_owned(),
            (None, Some(base)) => {
                let base =
                    check_url(base).map_err(|m| named(&["otel_exporter_otlp_endpoint"], m))?;
                match protocol {
                    OtlpProtocol::Http => format!("{}/v1/traces", base.trim_end_matches('/')),
                    OtlpProtocol::Grpc => base.to_owned(),
                }
            }
            (None, None) => match protocol {
                OtlpProtocol::Http => "http://localhost:4318/v1/traces".to_owned(),
                OtlpProtocol::Grpc => "http://localhost:4317".to_owned(),
            },
        };
        if protocol == OtlpProtocol::Http && endpoint.starts_with("https://") {
            let id = if non_empty(&self.otel_exporter_otlp_traces_endpoint).is_some() {
                "otel_exporter_otlp_traces_endpoint"
            } else {
                "otel_exporter_otlp_endpoint"
            };
            return Err(named(
                &[id],
                format!(
                    "'{endpoint}': OTLP over HTTP is sent without TLS; use an http:// collector, or TRACING_EXPORTER_PROTOCOL=grpc for TLS"
                ),
            ));
        }
        let mut headers = parse_headers(non_empty(&self.otel_exporter_otlp_headers).unwrap_or(""))
            .map_err(|m| named(&["otel_exporter_otlp_headers"], m))?;
        let traces =
            parse_headers(non_empty(&self.otel_exporter_otlp_traces_headers).unwrap_or(""))
                .map_err(|m| named(&["otel_exporter_otlp_traces_headers"], m))?;
        for (name, value) in traces {
            headers.retain(|(n, _)| *n != name);
            headers.push((name, value));
        }
        if self.otel_bsp_max_export_batch_size > self.otel_bsp_max_queue_size {
            return Err(named(
                &["otel_bsp_max_export_batch_size"],
                format!(
                    "{} is more than OTEL_BSP_MAX_QUEUE_SIZE ({})",
                    self.otel_bsp_max_export_batch_size, self.otel_bsp_max_queue_size
                ),
            ));
        }
        Ok(Some(TracingSettings {
            protocol,
            endpoint,
            headers,
            timeout: self
                .otel_exporter_otlp_traces_timeout
                .unwrap_or(self.otel_exporter_otlp_timeout),
            service_name: self.tracing_service_name.clone(),
            service_namespace: self.tracing_service_namespace.clone(),
            service_instance_id: non_empty(&Some(self.tracing_service_instance_id.clone()))
                .map(str::to_owned),
            sampling_rate: self.tracing_sampling_rate,
            descriptor_values: self.tracing_descriptor_values,
            max_queue: self.otel_bsp_max_queue_size.get(),
            max_batch: self.otel_bsp_max_export_batch_size.get(),
            schedule_delay: self.otel_bsp_schedule_delay,
        }))
    }

    /// `TRACING_EXPORTER_PROTOCOL` (the reference's), else the standard variables.
    fn protocol(&self) -> Result<OtlpProtocol, SettingsError> {
        if let Some(p) = non_empty(&self.tracing_exporter_protocol) {
            return match p.to_ascii_lowercase().as_str() {
                "http" => Ok(OtlpProtocol::Http),
                "grpc" => Ok(OtlpProtocol::Grpc),
                _ => Err(named(
                    &["tracing_exporter_protocol"],
                    format!("'{p}' is neither http nor grpc"),
                )),
            };
        }
        for (id, value) in [
            (
                "otel_exporter_otlp_traces_protocol",
                &self.otel_exporter_otlp_traces_protocol,
            ),
            (
                "otel_exporter_otlp_protocol",
                &self.otel_exporter_otlp_protocol,
            ),
        ] {
            if let Some(p) = non_empty(value) {
                return match p {
                    "grpc" => Ok(OtlpProtocol::Grpc),
                    "http/protobuf" => Ok(OtlpProtocol::Http),
                    _ => Err(named(
                        &[id],
                        format!("'{p}' is not supported (grpc or http/protobuf)"),
                    )),
                };
            }
        }
        Ok(OtlpProtocol::Http)
    }
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// An `http://` or `https://` URL with a host.
fn check_url(url: &str) -> Result<&str, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("'{url}' is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?']).next().unwrap_or("");
    if host.is_empty() || url.parse::<tonic::codegen::http::Uri>().is_err() {
        return Err(format!("'{url}' is not a valid URL"));
    }
    Ok(url)
}

/// `k=v,k2=v2` with URL-encoded values (the OTel specification's form).
fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("'{pair}' is not name=value"))?;
        let name = name.trim().to_ascii_lowercase();
        let value = percent_decode(value.trim())
            .ok_or_else(|| format!("'{value}' of {name} is not valid URL encoding"))?;
        if tonic::codegen::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("'{name}' is not a header name"));
        }
        if tonic::codegen::http::HeaderValue::from_str(&value).is_err() {
            return Err(format!("the value of {name} is not a valid header value"));
        }
        out.push((name, value));
    }
    Ok(out)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_url_decoded_and_bad_ones_named() {
        assert_eq!(
            parse_headers("api-key=a%20b, X-Team=core").unwrap(),
            vec![
                ("api-key".into(), "a b".into()),
                ("x-team".into(), "core".into())
            ]
        );
        assert!(parse_headers("novalue").unwrap_err().contains("novalue"));
        assert!(parse_headers("k=%zz").unwrap_err().contains("URL encoding"));
        assert!(
            parse_headers("bad name=v")
                .unwrap_err()
                .contains("header name")
        );
    }

    #[test]
    fn urls_need_a_scheme_and_a_host() {
        assert!(check_url("http://collector:4318").is_ok());
        assert!(check_url("collector:4318").is_err());
        assert!(check_url("http:///x").is_err());
    }

    fn tracing(args: &[&str]) -> Result<Option<TracingSettings>, String> {
        use clap::{Args as _, FromArgMatches as _};
        let command = TracingArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
        let matches = command
            .try_get_matches_from(args)
            .map_err(|e| e.to_string())?;
        let args = TracingArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
        args.resolve().map_err(|e| e.to_string())
    }

    #[test]
    fn the_reference_protocol_wins_and_endpoints_follow_it() {
        assert_eq!(tracing(&[]).unwrap(), None);
        let http = tracing(&["--tracing-enabled"]).unwrap().unwrap();
        assert_eq!(http.protocol, OtlpProtocol::Http);
        assert_eq!(http.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(http.service_name, "RateLimit");
        assert_eq!(http.service_instance_id, None);
        let grpc = tracing(&[
            "--tracing-enabled",
            "--otel-exporter-otlp-protocol",
            "http/protobuf",
            "--tracing-exporter-protocol",
            "grpc",
            "--otel-exporter-otlp-endpoint",
            "http://collector:4317",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(grpc.protocol, OtlpProtocol::Grpc);
        assert_eq!(grpc.endpoint, "http://collector:4317");
        let standard = tracing(&[
            "--tracing-enabled",
            "--otel-exporter-otlp-protocol",
            "http/protobuf",
            "--otel-exporter-otlp-endpoint",
            "http://collector:4318/",
            "--otel-exporter-otlp-headers",
            "a=1",
            "--otel-exporter-otlp-traces-headers",
            "a=2,b=3",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(standard.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(
            standard.headers,
            vec![("a".into(), "2".into()), ("b".into(), "3".into())]
        );
    }

    #[test]
    fn bad_tracing_settings_are_named() {
        let err =
            tracing(&["--tracing-enabled", "--tracing-exporter-protocol", "udp"]).unwrap_err();
        assert!(
            err.contains("TRACING_EXPORTER_PROTOCOL") && err.contains("'udp'"),
            "{err}"
        );
        let err = tracing(&[
            "--tracing-enabled",
            "--otel-exporter-otlp-protocol",
            "http/json",
        ])
        .unwrap_err();
        assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{err}");
        let err = tracing(&[
            "--tracing-enabled",
            "--otel-exporter-otlp-endpoint",
            "https://c:4318",
        ])
        .unwrap_err();
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.contains("without TLS"),
            "{err}"
        );
        let err = tracing(&["--tracing-enabled", "--tracing-sampling-rate", "2"]).unwrap_err();
        assert!(err.contains("[0, 1]"), "{err}");
        let err = tracing(&["--tracing-enabled", "--otel-bsp-max-queue-size", "0"]).unwrap_err();
        assert!(err.contains("at least 1"), "{err}");
    }

    #[test]
    fn sampling_rate_is_a_share() {
        assert_eq!(parse_sampling_rate("0").unwrap(), 0.0);
        assert!(parse_sampling_rate("1.5").is_err());
    }
}
