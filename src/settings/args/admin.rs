//! The admin API's counter reset: off unless a bearer token file or a client certificate
//! name enables it.

use std::path::PathBuf;

use clap::Args;

use super::named;
use crate::admin::ResetSettings;
use crate::net::tls::TlsFiles;
use crate::settings::SettingsError;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Admin API")]
pub struct AdminArgs {
    /// A file holding the bearer token that counter resets (DELETE /counters, ResetCounters) must send; re-read on each reset, so a rotated Secret needs no restart
    #[arg(long, env = "ADMIN_RESET_TOKEN_FILE")]
    admin_reset_token_file: Option<PathBuf>,

    /// A name (DNS name or IP address) a client certificate on the mutual-TLS gRPC port must be valid for to call ResetCounters without a token
    #[arg(long, env = "ADMIN_RESET_CLIENT_SAN")]
    admin_reset_client_san: Option<String>,
}

impl AdminArgs {
    /// Checks the token file now (a reset must not fail on a typo found at 3 a.m.) and that
    /// a client certificate name has a mutual-TLS port to come from.
    pub(super) fn resolve(
        &self,
        grpc_tls: Option<&TlsFiles>,
    ) -> Result<ResetSettings, SettingsError> {
        let token_file = self
            .admin_reset_token_file
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
        if let Some(path) = &token_file {
            crate::admin::read_token_within(path, crate::admin::TOKEN_STARTUP_DEADLINE)
                .map_err(|e| named(&["admin_reset_token_file"], e))?;
        }
        let client_san = self
            .admin_reset_client_san
            .clone()
            .filter(|s| !s.is_empty());
        if let Some(san) = &client_san {
            if grpc_tls.is_none_or(|tls| tls.client_ca.is_none()) {
                return Err(named(
                    &["admin_reset_client_san"],
                    "needs mutual TLS on the gRPC port (GRPC_SERVER_USE_TLS=true with GRPC_CLIENT_TLS_CACERT)",
                ));
            }
            crate::net::tls::client_name(san).map_err(|e| named(&["admin_reset_client_san"], e))?;
        }
        Ok(ResetSettings {
            token_file,
            client_san,
        })
    }
}
