//! Integration tests against LocalStack (or AWS): every test deploys its own stack from
//! template.yaml, so tests run in parallel without seeing each other's messages.
//! Needs `AWS_ENDPOINT_URL` (see `make test`).

mod common;
mod ground;
mod orders;
mod protocol;
