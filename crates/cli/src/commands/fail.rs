//! `sasctl fail`: a callback step failed, for good or to be retried.
use anyhow::Result;

use super::{Global, ReplyArgs};
use crate::answer::{self, Answer};

/// Answer a callback step: it failed (for good, unless --retryable).
#[derive(clap::Args, Debug)]
pub struct Args {
    pub token: String,
    #[arg(long)]
    pub error: String,
    /// Let the step be retried (within its attempts) instead of failing it for good.
    #[arg(long)]
    pub retryable: bool,
    #[command(flatten)]
    pub reply: ReplyArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    // the arguments are checked before anything else happens (the answer, then the token)
    let answer = Answer::Fail { error: answer::non_empty("--error", &args.error)?, retryable: args.retryable };
    let token = answer::parse_token(&args.token)?;
    super::answer_step(global, &token, &answer, args.reply).await
}
