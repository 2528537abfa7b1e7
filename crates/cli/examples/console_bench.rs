//! Benchmark of `sasctl ui`'s task listing on a table of many tasks (`make bench-console`): deploys
//! its own stack (functions off), writes `--tasks` ended tasks (80% Processed, 10% Compensated,
//! 10% Error, one a minute back from now) and 200 in flight, serves the console in-process, and
//! reads pages through it over HTTP as a browser does: the first page, the next pages following
//! each page's own link, a workflow filter and a time filter, tasks in flight, and the counts.
//! For each: the time to the whole page and the DynamoDB requests it made (the page says them).
//! Then deletes the stack. Needs `AWS_ENDPOINT_URL` (LocalStack).
//!
//! `cargo run -p sas-cli --example console_bench -- --tasks 10000 --pages 20`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use clap::Parser;
use futures::stream::{self, StreamExt};
use sas_cli::table::TableReader;
use sas_core::config::{Resources, Settings};
use sas_core::deps::Deps;
use sas_core::store::{DynamoStore, TaskWriter as _};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{submit, Ctx, Policy, ProcessState};
use sas_protocol::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

#[derive(Parser)]
struct Args {
    /// Ended tasks to write.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Pages to walk after the first.
    #[arg(long, default_value_t = 20)]
    pages: usize,
    /// Keep the stack (to look at it with `sasctl ui`).
    #[arg(long)]
    keep: bool,
}

/// The number after `label` in the page's note ("this page: 50 rows, 16 DynamoDB requests, ...").
fn figure(html: &str, label: &str) -> Option<u64> {
    let at = html.find(label)?;
    html[..at].trim_end().rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The `next page` link of a page.
fn next_link(html: &str) -> Option<String> {
    let at = html.find("id=\"next\" href=\"")? + "id=\"next\" href=\"".len();
    let end = html[at..].find('"')? + at;
    Some(html[at..end].replace("&amp;", "&"))
}

struct Row {
    what: String,
    ms: f64,
    rows: u64,
    requests: u64,
    index: u64,
}

async fn get(http: &reqwest::Client, base: &str, path: &str, what: &str) -> Result<(Row, String)> {
    let t = Instant::now();
    let res = http.get(format!("{base}{path}")).send().await?;
    let status = res.status();
    let html = res.text().await?;
    anyhow::ensure!(status.is_success(), "{path}: {status}: {html}");
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let row = Row {
        what: what.to_owned(),
        ms,
        rows: figure(&html, " rows,").unwrap_or(0),
        requests: figure(&html, " DynamoDB requests").unwrap_or(0),
        index: figure(&html, " index entries read").unwrap_or(0),
    };
    Ok((row, html))
}

#[tokio::main]
#[allow(clippy::print_stdout, clippy::print_stderr, clippy::cast_precision_loss)]
async fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        std::env::var("AWS_ENDPOINT_URL").is_ok(),
        "set AWS_ENDPOINT_URL (LocalStack: source infra/env.sh)"
    );
    let sdk = sas_core::aws::load_sdk_config().await;
    let name = format!("sas-bench-console-{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let template = sas_cli::stack::local_template(sas_cli::stack::TEMPLATE);
    let params = [("DeployFunctions", "false"), ("TableDeletionProtection", "false")];
    let out = sas_cli::stack::deploy(&sdk, &name, &template, &params).await.context("deploying")?;
    let res = Resources::from_outputs(&out)?;
    eprintln!("stack {name}: table {} ({} shards)", res.task_table, res.shards);
    let workflows = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS)?;
    let def = workflows.resolve("sim-order", None).context("sim-order")?.clone();
    let client = sas_core::aws::dynamodb_client(&sdk);
    let store = DynamoStore::new(client.clone(), res.task_table.clone(), res.shards, 30);
    let now = Millis::now();

    // 200 tasks in flight (created as the Submitter does: the workflow's item too)
    for i in 0..200 {
        let t = submit(
            TaskId::try_from(format!("live-{i:04}").as_str())?,
            def.clone(),
            serde_json::json!({}),
            None,
            &Ctx::at(now),
            &Policy::default(),
        )
        .task;
        store.create(&t).await?;
    }
    // the ended tasks, 25 to a BatchWriteItem, 8 in flight
    let load = Instant::now();
    let items: Vec<_> = (0..args.tasks)
        .map(|i| {
            let mut t = submit(
                TaskId::try_from(format!("done-{i:06}").as_str()).expect("an id"),
                def.clone(),
                serde_json::json!({"n": i}),
                None,
                &Ctx::at(now),
                &Policy::default(),
            )
            .task;
            t.process_state = match i % 10 {
                0 => ProcessState::Error,
                1 => ProcessState::Compensated,
                _ => ProcessState::Processed,
            };
            t.lock.locked_by = None;
            t.complete_by = None;
            t.updated_at = Millis(now.0 - 60_000 * i as u64);
            t.created_at = Millis(t.updated_at.0 - 5_000);
            store.to_item(&t).expect("an item")
        })
        .collect();
    let batches: Vec<Vec<_>> = items.chunks(25).map(<[_]>::to_vec).collect();
    let table = res.task_table.clone();
    let written: Vec<Result<()>> = stream::iter(batches)
        .map(|batch| {
            let (client, table) = (client.clone(), table.clone());
            async move {
                let mut writes: Vec<WriteRequest> = batch
                    .into_iter()
                    .map(|item| {
                        WriteRequest::builder()
                            .put_request(PutRequest::builder().set_item(Some(item)).build().expect("item"))
                            .build()
                    })
                    .collect();
                while !writes.is_empty() {
                    let out = client
                        .batch_write_item()
                        .request_items(&table, writes)
                        .send()
                        .await
                        .map_err(aws_sdk_dynamodb::Error::from)?;
                    writes = out.unprocessed_items.and_then(|mut m| m.remove(&table)).unwrap_or_default();
                }
                Ok(())
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for w in written {
        w?;
    }
    eprintln!("{} ended tasks written in {:.0} s", args.tasks, load.elapsed().as_secs_f64());

    // the console, in-process, on a free port
    let deps = Arc::new(Deps::aws(&sdk, res.clone(), workflows, Settings::default()));
    let reader = TableReader::new(&sdk, &res);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let console = Arc::new(sas_cli::ui::Console::new(deps, reader, format!("stack {name}"), addr, true));
    tokio::spawn(sas_cli::ui::serve(listener, console));
    let base = format!("http://127.0.0.1:{}", addr.port());
    let http = reqwest::Client::new();

    let mut rows = Vec::new();
    let (first, mut html) =
        get(&http, &base, "/tasks?state=Processed&after=", "Processed, first page (with the counts)").await?;
    rows.push(first);
    let mut walked = Vec::new();
    for _ in 0..args.pages {
        let Some(link) = next_link(&html) else { break };
        let (r, h) = get(&http, &base, &link, "Processed, a next page").await?;
        walked.push(r);
        html = h;
    }
    let (r, _) =
        get(&http, &base, "/tasks?state=Processed&workflow=sim-order", "Processed, workflow sim-order").await?;
    rows.push(r);
    let (r, _) = get(&http, &base, "/tasks?state=Error&since=1h", "Error, ended in the last hour").await?;
    rows.push(r);
    let (r, _) = get(&http, &base, "/tasks?state=in-flight", "in flight (200), first page").await?;
    rows.push(r);

    println!("\n## `sasctl ui` task listing: {} ended tasks, 200 in flight, {} shards\n", args.tasks, res.shards);
    println!("| page | rows | DynamoDB requests | index entries read | time to the whole page |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!("| {} | {} | {} | {} | {:.0} ms |", r.what, r.rows, r.requests, r.index, r.ms);
    }
    if !walked.is_empty() {
        let n = walked.len() as f64;
        let mut ms: Vec<f64> = walked.iter().map(|r| r.ms).collect();
        ms.sort_by(f64::total_cmp);
        let req: u64 = walked.iter().map(|r| r.requests).sum();
        let idx: u64 = walked.iter().map(|r| r.index).sum();
        println!(
            "| the next {} pages, each (mean) | {} | {:.1} | {:.1} | median {:.0} ms, max {:.0} ms |",
            walked.len(),
            walked[0].rows,
            req as f64 / n,
            idx as f64 / n,
            ms[ms.len() / 2],
            ms[ms.len() - 1]
        );
    }
    let first_counts = {
        let h = http.get(format!("{base}/tasks?state=Processed")).send().await?.text().await?;
        h.find("the counts: ").and_then(|at| h[at + "the counts: ".len()..].split(' ').next()?.parse::<u64>().ok())
    };
    if let Some(c) = first_counts {
        println!("\nThe counts above the first page (in flight by state, each ended state): {c} requests.");
    }
    if args.keep {
        eprintln!("kept stack {name}");
    } else {
        let cfn = aws_sdk_cloudformation::Client::new(&sdk);
        sas_cli::stack::delete_and_wait(&cfn, &name, Duration::from_mins(2)).await?;
        eprintln!("stack {name} deleted");
    }
    Ok(())
}
