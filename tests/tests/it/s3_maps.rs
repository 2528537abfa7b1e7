//! A Distributed Map whose items are read from S3 (`ItemReader`), translated by `sasctl
//! import-asl`, on LocalStack: the `s3_items` agent reads a CSV once and writes it as pages to the
//! work bucket, one child task per page reads its page and maps its rows, each row a task of its
//! own whose `aws` agent writes it to DynamoDB; each page writes its rows' outputs to S3, and the
//! map a manifest of those files (`ResultWriter`). Every row arrives once, no task holds more than
//! a page, and the pages and results are where the task says.
//!
//! `SAS_IT_S3_ITEMS` sets how many rows (default 200); the book's 10,000 were run with it.
//!
//! The objects under a prefix, the other source, are read by the agent itself: more than one page
//! of S3's listing, each object once as Step Functions gives a listed object.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::messages::{AgentRequest, Outcome};
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::{json, Value};

use crate::common::{bucket, s3, stack_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_map_over_a_csv_in_s3_runs_every_row_once_a_page_at_a_time() {
    let rows: usize = std::env::var("SAS_IT_S3_ITEMS").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (source, work, table) = ("sas-it-items-in", "sas-it-items-work", "sas-it-s3-map-rows");
    let def = json!({"StartAt": "Rows", "States": {
        "Rows": {"Type": "Map", "MaxConcurrency": 100, "ResultPath": "$.written", "End": true,
            "ResultWriter": {"Resource": "arn:aws:states:::s3:putObject", "Parameters": {"Bucket": work, "Prefix": "results"}},
            "ItemReader": {"Resource": "arn:aws:states:::s3:getObject",
                "ReaderConfig": {"InputType": "CSV", "CSVHeaderLocation": "FIRST_ROW"},
                "Parameters": {"Bucket": source, "Key.$": "$.key"}},
            "ItemProcessor": {"ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                "StartAt": "Put", "States": {
                "Put": {"Type": "Task", "Resource": "arn:aws:states:::dynamodb:putItem", "End": true,
                    "Parameters": {"TableName": table, "Item": {"id": {"S.$": "$.id"}, "qty": {"N.$": "$.qty"}}},
                    "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": 3}]}}}}}});
    let i = sas_cli::asl::import("s3_rows", &def).expect("the definition translates");
    let workflows =
        WorkflowRegistry::from_json(&json!({"workflows": i.workflows()}).to_string()).expect("the workflows load");
    let s = stack_with("s3-map", workflows).await;
    crate::common::items_table(&s.sdk, table).await;
    let s3 = s3(&s.sdk);
    bucket(&s3, source).await;
    bucket(&s3, work).await;
    // rows of about 40 bytes of JSON each: several pages
    let key = format!("orders-{run}.csv");
    let mut csv = String::from("id,qty,note\n");
    for n in 0..rows {
        writeln!(csv, "{run}-{n:05},{},\"a, quoted note\"", n % 7).expect("a row");
    }
    s3.put_object().bucket(source).key(&key).body(csv.into_bytes().into()).send().await.expect("the CSV");

    let agents = AgentRuntime::from_config_with(
        &sas_cli::asl::agents_file(&i.agents).to_string(),
        &|v| (v == "MAP_BUCKET").then(|| work.to_owned()),
        AwsConfigCell::with(s.sdk.clone()),
    )
    .expect("the agents");
    let runner = s.runner_with(agents);
    let id = format!("s3-rows-{run}");
    let submission = json!({"v": 1, "task_id": id, "workflow": "s3_rows", "input": {"key": key}});
    let started = Instant::now();
    s.send(&s.res.submission_queue_url, &submission.to_string()).await;
    let t = s.wait_for(&id, Duration::from_secs(600 + rows as u64 / 5), |t| t.process_state.is_terminal()).await;
    let took = started.elapsed();
    assert_eq!(t.process_state, ProcessState::Processed, "{:#?}", t.history);

    // the reading step: every row counted, its pages where it says
    let read = t.steps.iter().find(|x| x.name == "Rows_items").expect("the reading step");
    let out: Value = read.output.clone().expect("its output");
    assert_eq!(out["count"], json!(rows), "{out}");
    let pages = out["pages"].as_array().expect("its pages").len();
    assert!(pages >= rows * 40 / 2048 && pages < rows, "{rows} rows of about 40 bytes in {pages} pages of 2 KiB");
    let prefix = out["prefix"].as_str().expect("its prefix");
    assert!(prefix.starts_with(&format!("sas-maps/{id}/")), "{prefix}");
    let listed = s3.list_objects_v2().bucket(work).prefix(prefix).send().await.expect("listing the pages");
    assert_eq!(listed.key_count().and_then(|n| usize::try_from(n).ok()), Some(pages), "{listed:?}");
    // no task of the map holds the rows but the page's: not the parent, whatever their number
    let parent = serde_json::to_string(&t).expect("the task");
    assert!(!parent.contains(&format!("{run}-00")), "the parent holds rows: {parent}");

    // the results: a manifest naming one file per page, each the outputs of its page's rows
    let written = t.result().expect("the task's output")["written"].clone();
    let manifest_key = format!("results/{id}/manifest.json");
    assert_eq!(written, json!({"MapRunArn": id, "ResultWriterDetails": {"Bucket": work, "Key": manifest_key}}));
    let read_json = |key: String| {
        let s3 = s3.clone();
        async move {
            let o = s3.get_object().bucket(work).key(&key).send().await.unwrap_or_else(|e| panic!("{key}: {e:?}"));
            let bytes = o.body.collect().await.expect("the body").into_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap_or_else(|e| panic!("{key}: {e}"))
        }
    };
    let manifest = read_json(manifest_key).await;
    assert_eq!(manifest["DestinationBucket"], work, "{manifest}");
    let files = manifest["ResultFiles"]["SUCCEEDED"].as_array().expect("the files").clone();
    assert_eq!(files.len(), pages, "{manifest}");
    let mut outputs = 0;
    for f in &files {
        let key = f["Key"].as_str().expect("a key");
        assert!(key.starts_with(&format!("results/{id}/SUCCEEDED_")), "{key}");
        outputs += read_json(key.to_owned()).await.as_array().expect("an array of outputs").len();
    }
    assert_eq!(outputs, rows, "one output per row");

    // every row written once, as the CSV says (qty as a number)
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let mut seen = std::collections::BTreeMap::new();
    let mut start: Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> = None;
    loop {
        let page = ddb.scan().table_name(table).set_exclusive_start_key(start.take()).send().await.expect("scan");
        for item in page.items() {
            let id = item["id"].as_s().expect("id").clone();
            if id.starts_with(&run) {
                seen.insert(id, item["qty"].as_n().expect("qty").clone());
            }
        }
        match page.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    assert_eq!(seen.len(), rows, "every row written");
    assert_eq!(seen.get(&format!("{run}-00009")).map(String::as_str), Some("2"));
    // the figure the book gives (with SAS_IT_S3_ITEMS=10000)
    #[allow(clippy::print_stderr)]
    {
        eprintln!("[s3-map] {rows} rows in {pages} pages: {:.1} s from submission to Processed", took.as_secs_f64());
    }
    runner.shutdown().await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_objects_under_a_prefix_are_read_page_by_page_of_the_listing_each_once() {
    assert!(std::env::var("AWS_ENDPOINT_URL").is_ok(), "set AWS_ENDPOINT_URL (LocalStack: `source infra/env.sh`)");
    let sdk = sas_core::aws::load_sdk_config().await;
    let s3 = s3(&sdk);
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (source, work) = ("sas-it-prefix-in", "sas-it-items-work");
    bucket(&s3, source).await;
    bucket(&s3, work).await;
    // S3 lists 1,000 keys a page: 1,005 objects take two, each of i % 10 bytes
    let n = 1_005usize;
    let prefix = format!("raw-{run}/");
    futures::stream::iter(0..n)
        .map(|i| {
            let (s3, key) = (s3.clone(), format!("{prefix}{i:04}.txt"));
            async move {
                s3.put_object()
                    .bucket(source)
                    .key(&key)
                    .body(vec![b'x'; i % 10].into())
                    .send()
                    .await
                    .expect("an object")
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    // beside the prefix: not listed
    s3.put_object()
        .bucket(source)
        .key(format!("raw-{run}-other/a.txt"))
        .body(b"y".to_vec().into())
        .send()
        .await
        .expect("an object beside");
    let agents = json!({"agents": {"objects": {"kind": "s3_items", "work_bucket": work,
        "sources": [format!("arn:aws:s3:::{source}"), format!("arn:aws:s3:::{source}/*")]}}});
    let rt = AgentRuntime::from_config_with(&agents.to_string(), &|_| None, AwsConfigCell::with(sdk.clone()))
        .expect("the agent");
    let task = TaskId::try_from(format!("prefix-{run}").as_str()).expect("an id");
    // the reading step's request, as its parameters make it: Step Functions' ItemReader parameters
    let mut req = AgentRequest::first_attempt(task, "objects", "objects", json!({}), Millis::now().plus_ms(300_000));
    req.input = json!({"Bucket": source, "Prefix": prefix});
    let now = i64::try_from(Millis::now().0 / 1_000).expect("seconds");
    let answer = rt.run(&req).await.expect("the agent answers");
    let Outcome::Succeeded { output } = answer.outcome else { panic!("the listing failed: {:?}", answer.outcome) };
    assert_eq!(output["count"], json!(n), "{output}");
    // every object once, from the pages the answer names
    let pages_at = output["prefix"].as_str().expect("where its pages are").to_owned();
    let mut seen = std::collections::BTreeMap::new();
    for page in output["pages"].as_array().expect("its pages") {
        let key = format!("{pages_at}{page}.json");
        let o = s3.get_object().bucket(work).key(&key).send().await.unwrap_or_else(|e| panic!("{key}: {e:?}"));
        let bytes = o.body.collect().await.expect("the page").into_bytes();
        let items: Vec<Value> = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{key}: {e}"));
        for item in items {
            let k = item["Key"].as_str().expect("a listed object's Key").to_owned();
            assert!(seen.insert(k.clone(), item).is_none(), "{k} listed twice");
        }
    }
    assert_eq!(seen.len(), n, "every object under the prefix, none beside it");
    for (i, (key, item)) in seen.iter().enumerate() {
        assert_eq!(key, &format!("{prefix}{i:04}.txt"));
        assert_eq!(item["Size"], json!(i % 10), "{item}");
        // as Step Functions gives a listed object: its ETag (quoted, as S3 gives it), its date,
        // its storage class
        assert!(item["Etag"].as_str().is_some_and(|e| e.len() > 2), "{item}");
        // (epoch seconds, as Step Functions gives it; S3 gives text)
        let when = item["LastModified"].as_i64().expect("a date in epoch seconds");
        assert!((when - now).abs() < 3_600, "{item}: the object was put a moment ago ({now})");
        assert_eq!(item["StorageClass"], json!("STANDARD"), "{item}");
    }
}
