//! `sasctl approve`: an approval step succeeds.
use anyhow::Result;

use super::{Global, ReplyArgs};
use crate::answer::{self, Answer};

/// Approve an approval step: it succeeds with output {"approved": true, "comment": ...}.
#[derive(clap::Args, Debug)]
pub struct Args {
    pub token: String,
    #[arg(long)]
    pub comment: Option<String>,
    #[command(flatten)]
    pub reply: ReplyArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    // the arguments are checked before anything else happens (the answer, then the token)
    let token = answer::parse_token(&args.token)?;
    super::answer_step(global, &token, &Answer::Approve { comment: args.comment.clone() }, args.reply).await
}
