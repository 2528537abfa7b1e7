//! `sasctl reject`: an approval step fails for good, and the task compensates.
use anyhow::Result;

use super::{Global, ReplyArgs};
use crate::answer::{self, Answer};

/// Reject an approval step: it fails for good ("rejected: REASON"), and the task compensates.
#[derive(clap::Args, Debug)]
pub struct Args {
    pub token: String,
    #[arg(long)]
    pub reason: String,
    #[command(flatten)]
    pub reply: ReplyArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    // the arguments are checked before anything else happens (the answer, then the token)
    let answer = Answer::Reject { reason: answer::non_empty("--reason", &args.reason)? };
    let token = answer::parse_token(&args.token)?;
    super::answer_step(global, &token, &answer, args.reply).await
}
