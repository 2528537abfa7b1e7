//! Integration tests against LocalStack (or AWS): every test deploys its own stack from
//! template.yaml, so tests run in parallel without seeing each other's messages.
//! Needs `AWS_ENDPOINT_URL` (see `make test`).
// Pedantic lints that only add noise to test scenarios.
#![allow(
    clippy::similar_names,
    clippy::needless_pass_by_value,
    clippy::items_after_statements,
    clippy::match_wildcard_for_single_variants,
    clippy::too_many_lines
)]

mod approval;
mod asl_diff;
mod common;
mod deliver;
mod ground;
mod http_auth;
mod jobs;
mod keys;
mod lambda;
mod lambda_agent;
mod limits;
mod loops;
mod maps;
mod orders;
mod protocol;
mod s3_maps;
mod schedules;
mod variables;
