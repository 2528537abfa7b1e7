//! `sasctl heartbeat`: a callback step is still being worked on.
use anyhow::Result;

use super::{Global, ReplyArgs};
use crate::answer::{self, Answer};

/// Answer a callback step: still working; extends its deadline (never past its hard timeout).
#[derive(clap::Args, Debug)]
pub struct Args {
    pub token: String,
    /// Progress details, JSON.
    #[arg(long)]
    pub details: Option<String>,
    #[command(flatten)]
    pub reply: ReplyArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    // the arguments are checked before anything else happens (the answer, then the token)
    let details = args.details.as_deref().map(|d| answer::parse_json("--details", d)).transpose()?;
    let token = answer::parse_token(&args.token)?;
    super::answer_step(global, &token, &Answer::Heartbeat { details }, args.reply).await
}
