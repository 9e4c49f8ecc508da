//! The xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`): the control plane's address, the
//! node Sluice names itself, TLS to it, the reconnect backoff. The reference's variables and
//! defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::super::parse::{parse_duration, parse_positive_duration, parse_ratio};
use super::named;
use crate::settings::SettingsError;
use crate::source::xds::{XdsSettings, XdsTls};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "xDS config source (CONFIG_TYPE=GRPC_XDS_SOTW)")]
pub struct XdsArgs {
    /// The control plane's ADS address (host:port, or an http:// or https:// URL)
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000"
    )]
    config_grpc_xds_server_url: String,

    /// The node id Sluice subscribes as (Envoy Gateway's is envoy-ratelimit)
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_ID", default_value = "default")]
    config_grpc_xds_node_id: String,

    /// Node metadata, k=v pairs separated by commas
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_METADATA", default_value = "")]
    config_grpc_xds_node_metadata: String,

    /// gRPC metadata sent with the subscription, k=v pairs separated by commas
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        default_value = ""
    )]
    config_grpc_xds_client_additional_headers: String,

    /// Time allowed to connect to the control plane
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = parse_positive_duration)]
    config_grpc_xds_server_connect_retry_interval: Duration,

    /// First wait before reconnecting to a control plane that went away
    #[arg(long, env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    xds_client_backoff_initial_interval: Duration,

    /// Longest wait between reconnections
    #[arg(long, env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    xds_client_backoff_max_interval: Duration,

    /// Each wait is moved by up to this share of itself, in (0, 1]
    #[arg(long, env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", default_value = "0.5", value_parser = parse_ratio)]
    xds_client_backoff_random_factor: f64,

    /// Move each wait at random (by the random factor)
    #[arg(long, env = "XDS_CLIENT_BACKOFF_JITTER", default_value = "true")]
    xds_client_backoff_jitter: bool,

    /// Largest control-plane message accepted, in bytes [default: 4 MiB]
    #[arg(long, env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")]
    xds_client_max_msg_size_in_bytes: Option<String>,

    /// Serve before the first configuration arrives (decisions are gRPC errors until then)
    #[arg(long, env = "FORCE_START_WITHOUT_INITIAL_CONFIG")]
    force_start_without_initial_config: bool,

    /// Connect to the control plane over TLS
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_USE_TLS")]
    config_grpc_xds_server_use_tls: bool,

    /// PEM CA bundle the control plane's certificate must chain to (default: the system roots)
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")]
    config_grpc_xds_server_tls_cacert: Option<PathBuf>,

    /// PEM client certificate presented to the control plane (mutual TLS)
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")]
    config_grpc_xds_client_tls_cert: Option<PathBuf>,

    /// PEM key of the client certificate
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")]
    config_grpc_xds_client_tls_key: Option<PathBuf>,

    /// Name the control plane's certificate must be valid for [default: the URL's host]
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN")]
    config_grpc_xds_server_tls_san: Option<String>,

    /// Domains whose xDS rules are usage budgets (overdraft: true), separated by commas; *
    /// for every domain (the proto has no field for it)
    #[arg(long, env = "XDS_USAGE_BUDGET_DOMAINS", default_value = "")]
    xds_usage_budget_domains: String,
}

/// Most bytes of a control-plane message by default (tonic's default limit).
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

impl XdsArgs {
    pub(super) fn resolve(&self) -> Result<XdsSettings, SettingsError> {
        let pairs = |id: &str, text: &str| -> Result<Vec<(String, String)>, SettingsError> {
            text.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|pair| match pair.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => {
                        Ok((k.trim().to_owned(), v.trim().to_owned()))
                    }
                    _ => Err(named(&[id], format!("'{pair}' is not key=value"))),
                })
                .collect()
        };
        let max_message_bytes = match self.xds_client_max_msg_size_in_bytes.as_deref() {
            None | Some("") => DEFAULT_MAX_MESSAGE_BYTES,
            Some(text) => text
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    named(
                        &["xds_client_max_msg_size_in_bytes"],
                        format!("'{text}' is not a number of bytes above 0"),
                    )
                })?,
        };
        let tls = self.config_grpc_xds_server_use_tls.then(|| XdsTls {
            ca: self.config_grpc_xds_server_tls_cacert.clone(),
            cert: self.config_grpc_xds_client_tls_cert.clone(),
            key: self.config_grpc_xds_client_tls_key.clone(),
            server_name: self
                .config_grpc_xds_server_tls_san
                .clone()
                .filter(|s| !s.is_empty()),
        });
        if let Some(tls) = &tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(named(
                &[
                    "config_grpc_xds_client_tls_cert",
                    "config_grpc_xds_client_tls_key",
                ],
                "a client certificate needs its key, and a key its certificate",
            ));
        }
        Ok(XdsSettings {
            server_url: self.config_grpc_xds_server_url.clone(),
            node_id: self.config_grpc_xds_node_id.clone(),
            node_metadata: pairs(
                "config_grpc_xds_node_metadata",
                &self.config_grpc_xds_node_metadata,
            )?,
            headers: pairs(
                "config_grpc_xds_client_additional_headers",
                &self.config_grpc_xds_client_additional_headers,
            )?,
            connect_timeout: self.config_grpc_xds_server_connect_retry_interval,
            usage_budget_domains: self
                .xds_usage_budget_domains
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect(),
            backoff_initial: self.xds_client_backoff_initial_interval,
            backoff_max: self
                .xds_client_backoff_max_interval
                .max(self.xds_client_backoff_initial_interval),
            backoff_random: if self.xds_client_backoff_jitter {
                self.xds_client_backoff_random_factor
            } else {
                0.0
            },
            max_message_bytes,
            force_start: self.force_start_without_initial_config,
            tls,
        })
    }
}
