//! `sluice check`: send one request and print the answer.

use std::io::Write as _;

use clap::Args;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};

use super::{ClientTls, ToolError, connect, parse_descriptor};

/// `sluice check` arguments.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// gRPC address of the rate limit service
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Domain of the request
    #[arg(long)]
    pub domain: String,
    /// A descriptor as key=value[,key2=value2]; repeat for several
    #[arg(long = "descriptor", required = true, value_name = "K=V[,K2=V2]")]
    pub descriptors: Vec<String>,
    /// Hits to charge (the request's hits_addend; 0 counts as 1)
    #[arg(long, default_value = "1")]
    pub hits: u32,
    /// TLS to the server
    #[command(flatten)]
    pub tls: ClientTls,
}

/// What the answer was, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// OK.
    Ok,
    /// OVER_LIMIT.
    OverLimit,
}

/// Sends the request and prints the response.
pub async fn run(args: CheckArgs) -> Result<Answer, ToolError> {
    let descriptors = args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut client = connect(&args.addr, &args.tls).await?;
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: args.domain.clone(),
            descriptors,
            hits_addend: args.hits,
        })
        .await
        .map_err(|s| ToolError::Rpc(format!("{:?}: {}", s.code(), s.message())))?
        .into_inner();

    let code = |c: i32| Code::try_from(c).map_or("UNKNOWN", |c| c.as_str_name());
    let _ = writeln!(std::io::stdout(), "{}", code(response.overall_code));
    for (i, (status, text)) in response.statuses.iter().zip(&args.descriptors).enumerate() {
        let mut line = format!("  descriptor {i} ({text}): {}", code(status.code));
        if let Some(limit) = &status.current_limit {
            let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
            line += &format!(" limit={}/{}", limit.requests_per_unit, unit);
            if !limit.name.is_empty() {
                line += &format!(" name={}", limit.name);
            }
        }
        line += &format!(" remaining={}", status.limit_remaining);
        if let Some(d) = &status.duration_until_reset {
            line += &format!(" reset={:.3}s", d.seconds as f64 + f64::from(d.nanos) / 1e9);
        }
        let _ = writeln!(std::io::stdout(), "{line}");
    }
    for header in &response.response_headers_to_add {
        let _ = writeln!(
            std::io::stdout(),
            "  header {}: {}",
            header.key,
            header.value
        );
    }
    Ok(if response.overall_code == Code::OverLimit as i32 {
        Answer::OverLimit
    } else {
        Answer::Ok
    })
}
