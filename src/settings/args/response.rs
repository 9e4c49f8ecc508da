//! Response decoration: headers, the problem+json body and dynamic metadata.

use clap::Args;

use super::super::parse::parse_header_name;
use crate::rls::{ReferenceHeaders, ResponseOptions};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Responses")]
pub struct ResponseArgs {
    /// Retry-After on every OVER_LIMIT answer
    #[arg(long, env = "RETRY_AFTER_HEADER", default_value = "true")]
    retry_after_header: bool,

    /// The IETF draft RateLimit-Policy and RateLimit headers on every answer
    #[arg(long, env = "RATELIMIT_HEADERS")]
    ratelimit_headers: bool,

    /// The reference service's limit/remaining/reset headers on every answer
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED")]
    limit_response_headers_enabled: bool,

    /// Name of the reference's limit header
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = parse_header_name)]
    limit_limit_header: String,

    /// Name of the reference's remaining header
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = parse_header_name)]
    limit_remaining_header: String,

    /// Name of the reference's reset header
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = parse_header_name)]
    limit_reset_header: String,

    /// An application/problem+json body on OVER_LIMIT answers
    #[arg(long, env = "RESPONSE_PROBLEM_JSON")]
    problem_json: bool,

    /// The reference's dynamic metadata (domain, descriptors, merged rule metadata) on every answer
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA")]
    response_dynamic_metadata: bool,
}

impl ResponseArgs {
    pub(super) fn options(self) -> ResponseOptions {
        ResponseOptions {
            retry_after: self.retry_after_header,
            draft_headers: self.ratelimit_headers,
            reference_headers: self
                .limit_response_headers_enabled
                .then_some(ReferenceHeaders {
                    limit: self.limit_limit_header,
                    remaining: self.limit_remaining_header,
                    reset: self.limit_reset_header,
                }),
            problem_json: self.problem_json,
            dynamic_metadata: self.response_dynamic_metadata,
        }
    }
}
