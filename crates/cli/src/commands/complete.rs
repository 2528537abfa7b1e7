//! `sasctl complete`: a callback step succeeded, with this output.
use anyhow::Result;

use super::{Global, ReplyArgs};
use crate::answer::{self, Answer};

/// Answer a callback step: it succeeded, with this output. Exit 1 when the answer was not
/// taken (stale, late, unknown token, task cancelled).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The callback token the step's agent handed over (a secret: never printed back).
    pub token: String,
    /// The step's output, JSON.
    #[arg(long, default_value = "{}")]
    pub output: String,
    #[command(flatten)]
    pub reply: ReplyArgs,
}

pub async fn run(args: &Args, global: &Global) -> Result<i32> {
    // the arguments are checked before anything else happens (the answer, then the token)
    let answer = Answer::Complete { output: answer::parse_json("--output", &args.output)? };
    let token = answer::parse_token(&args.token)?;
    super::answer_step(global, &token, &answer, args.reply).await
}
