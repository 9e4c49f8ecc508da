//! `sluice explain` and `sluice counters get|reset`: the admin API (`sluice.admin.v1.Admin`
//! on the gRPC port) from the command line, printed as text or as the HTTP API's JSON.

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use tonic::metadata::MetadataValue;

use super::{ClientTls, ToolError, channel, parse_descriptor};
use crate::admin::api::proto::{self, admin_client::AdminClient};
use crate::admin::counters::{counters_json, explain_json};

/// Where the server is, and how to print.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// gRPC address of the rate limit service
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Domain of the request
    #[arg(long)]
    pub domain: String,
    /// Print the answer as JSON (as the admin HTTP port answers)
    #[arg(long)]
    pub json: bool,
    /// TLS to the server
    #[command(flatten)]
    pub tls: ClientTls,
}

/// `sluice explain` arguments.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The server and domain.
    #[command(flatten)]
    pub target: Target,
    /// A descriptor as key=value[,key2=value2]; repeat for several
    #[arg(
        long = "descriptor",
        required_unless_present = "bucket",
        value_name = "K=V[,K2=V2]"
    )]
    pub descriptors: Vec<String>,
    /// Instead: an RLQS bucket id (Envoy's rate_limit_quota filter) as key=value[,key2=value2],
    /// in any order: its rule, its assignment, and this instance's part of the budget
    #[arg(long, conflicts_with = "descriptors", value_name = "K=V[,K2=V2]")]
    pub bucket: Option<String>,
}

/// `sluice counters` arguments.
#[derive(Debug, Clone, Args)]
pub struct CountersArgs {
    /// get or reset
    #[command(subcommand)]
    pub action: CountersAction,
}

/// What to do with a descriptor's counters.
#[derive(Debug, Clone, Subcommand)]
pub enum CountersAction {
    /// Print each limit's counter: used, remaining, time to reset
    Get(CountersTarget),
    /// Clear the counters (the server must enable it: a token or a client certificate)
    Reset(ResetArgs),
}

/// One descriptor of one domain.
#[derive(Debug, Clone, Args)]
pub struct CountersTarget {
    /// The server and domain.
    #[command(flatten)]
    pub target: Target,
    /// The descriptor as key=value[,key2=value2]
    #[arg(long, value_name = "K=V[,K2=V2]")]
    pub descriptor: String,
}

/// `sluice counters reset` arguments.
#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    /// The server, domain and descriptor.
    #[command(flatten)]
    pub counters: CountersTarget,
    /// A file holding the bearer token (the server's ADMIN_RESET_TOKEN_FILE); without it, the
    /// client certificate of --tls-cert must be one the server admits (ADMIN_RESET_CLIENT_SAN)
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

fn rpc_error(status: tonic::Status) -> ToolError {
    ToolError::Rpc(format!("{:?}: {}", status.code(), status.message()))
}

async fn client(target: &Target) -> Result<AdminClient<tonic::transport::Channel>, ToolError> {
    Ok(AdminClient::new(channel(&target.addr, &target.tls).await?))
}

fn admin_descriptor(text: &str) -> Result<proto::RateLimitDescriptor, ToolError> {
    let envoy = parse_descriptor(text)?;
    Ok(proto::RateLimitDescriptor {
        entries: envoy
            .entries
            .into_iter()
            .map(|e| proto::rate_limit_descriptor::Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit: None,
    })
}

fn print(text: &str) {
    let _ = write!(std::io::stdout(), "{text}");
}

/// Sends `Explain` (or `ExplainBucket`) and prints the answer.
pub async fn explain(args: ExplainArgs) -> Result<(), ToolError> {
    if let Some(bucket) = &args.bucket {
        return explain_bucket(&args.target, bucket).await;
    }
    let descriptors = args
        .descriptors
        .iter()
        .map(|d| admin_descriptor(d))
        .collect::<Result<Vec<_>, _>>()?;
    let answer = client(&args.target)
        .await?
        .explain(proto::RateLimitRequest {
            domain: args.target.domain.clone(),
            descriptors,
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    if args.target.json {
        print(&format!("{:#}\n", explain_json(&answer)));
        return Ok(());
    }
    let mut out = format!(
        "domain {}{}\n",
        answer.domain,
        if answer.domain_found {
            ""
        } else {
            " (not loaded)"
        }
    );
    for (i, (e, text)) in answer.descriptors.iter().zip(&args.descriptors).enumerate() {
        out += &format!("descriptor {i} ({text}):\n");
        write_explanation(&mut out, e);
    }
    print(&out);
    Ok(())
}

/// Sends `ExplainBucket` for the pairs of `bucket` and prints the answer.
async fn explain_bucket(target: &Target, bucket: &str) -> Result<(), ToolError> {
    let pairs = admin_descriptor(bucket)?
        .entries
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    let answer = client(target)
        .await?
        .explain_bucket(proto::BucketRequest {
            domain: target.domain.clone(),
            bucket: pairs,
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    if target.json {
        print(&format!(
            "{:#}\n",
            crate::admin::counters::bucket_json(&answer)
        ));
        return Ok(());
    }
    let mut out = format!("bucket {bucket} of domain {}:\n", answer.domain);
    if answer.rule.is_empty() {
        out += "  no rule: ALLOW_ALL\n";
    } else {
        let order: Vec<String> = answer
            .descriptor
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        out += &format!(
            "  rule {} (as the descriptor {})\n",
            answer.rule,
            order.join(",")
        );
        out += &format!("  assignment {}", answer.assignment.to_uppercase());
        if answer.rate > 0 || answer.assignment == "token_bucket" {
            out += &format!(
                ": budget {} per {} s, burst {}{}",
                answer.rate,
                answer.window_seconds,
                answer.burst,
                if answer.shadow_mode {
                    " (shadow mode)"
                } else {
                    ""
                }
            );
        }
        out += "\n";
    }
    if !answer.tracked {
        out += "  not reported by any Envoy on this instance\n";
    } else if answer.assignment == "token_bucket" || answer.shadow_mode {
        out += &format!(
            "  this instance: claim {}, held {}, demand {:.1} per window\n",
            answer.claim, answer.held, answer.demand
        );
        for s in &answer.shares {
            out += &format!(
                "    stream {}: {} per window, capacity {}, demand {:.1}\n",
                s.stream, s.rate, s.burst, s.demand
            );
        }
    }
    print(&out);
    Ok(())
}

/// Sends `GetCounters` or `ResetCounters` and prints the answer.
pub async fn counters(args: CountersArgs) -> Result<(), ToolError> {
    match args.action {
        CountersAction::Get(target) => {
            let request = proto::CountersRequest {
                domain: target.target.domain.clone(),
                descriptor: Some(admin_descriptor(&target.descriptor)?),
            };
            let answer = client(&target.target)
                .await?
                .get_counters(request)
                .await
                .map_err(rpc_error)?
                .into_inner();
            if target.target.json {
                print(&format!("{:#}\n", counters_json(&answer)));
                return Ok(());
            }
            let mut out = format!("{} ({}):\n", target.descriptor, answer.store);
            if let Some(e) = &answer.explanation {
                write_explanation(&mut out, e);
            }
            for c in &answer.counters {
                let limit = c.limit.clone().unwrap_or_default();
                out += &format!(
                    "  counter {}: used {}, remaining {}, reset in {:.3}s{}{}{}\n",
                    limit.counter,
                    c.used,
                    c.remaining,
                    c.reset_after_ms as f64 / 1000.0,
                    if c.over { ", over the limit" } else { "" },
                    if c.overdraft > 0 {
                        format!(" (budget overdrawn by {})", c.overdraft)
                    } else {
                        String::new()
                    },
                    if c.degraded {
                        " (store failing: the failure mode's answer)"
                    } else {
                        ""
                    },
                );
            }
            print(&out);
            Ok(())
        }
        CountersAction::Reset(args) => reset(args).await,
    }
}

async fn reset(args: ResetArgs) -> Result<(), ToolError> {
    let target = &args.counters;
    let mut request = tonic::Request::new(proto::CountersRequest {
        domain: target.target.domain.clone(),
        descriptor: Some(admin_descriptor(&target.descriptor)?),
    });
    if let Some(path) = &args.token_file {
        let token = crate::admin::read_token(path).map_err(ToolError::Usage)?;
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| ToolError::Usage("the token is not a valid header value".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    let answer = client(&target.target)
        .await?
        .reset_counters(request)
        .await
        .map_err(rpc_error)?
        .into_inner();
    if target.target.json {
        let json = serde_json::json!({
            "counters": answer.counters,
            "deleted": answer.deleted.to_string(),
        });
        print(&format!("{json:#}\n"));
        return Ok(());
    }
    let mut out = format!(
        "reset {} counters of {} ({} held state)\n",
        answer.counters.len(),
        target.descriptor,
        answer.deleted
    );
    for counter in &answer.counters {
        out += &format!("  {counter}\n");
    }
    print(&out);
    Ok(())
}

fn write_explanation(out: &mut String, e: &proto::DescriptorExplanation) {
    *out += &format!("  {}: {}\n", e.outcome().as_str_name(), e.reason);
    for step in &e.path {
        let how = match step.kind() {
            proto::step::Kind::Wildcard => format!("WILDCARD {}", step.pattern),
            kind => kind.as_str_name().to_owned(),
        };
        *out += &format!(
            "  level {} {}={}: {how}\n",
            step.level, step.key, step.value
        );
    }
    for l in &e.limits {
        let mut line = format!(
            "  limit {}/{} {} {}, failure_mode {}",
            l.requests_per_unit, l.unit, l.algorithm, l.consistency, l.failure_mode
        );
        if l.burst > 0 {
            line += &format!(", burst {}", l.burst);
        }
        if !l.name.is_empty() {
            line += &format!(", name {}", l.name);
        }
        if l.overdraft {
            line += ", usage budget (overdraft)";
        }
        *out += &format!(
            "{line}\n    counter {}\n    store key {}\n",
            l.counter, l.store_key
        );
    }
}
