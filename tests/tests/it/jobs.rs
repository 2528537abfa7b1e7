//! Jobs run to completion (Step Functions' `.sync`, imported as a loop: start, then polls) against
//! a recorded fake of a service LocalStack does not emulate: Athena's `StartQueryExecution`,
//! `GetQueryExecution` and `StopQueryExecution`, answered as the Athena API reference shows them
//! (the shapes recorded below), over HTTP, signed and sent by the `aws` agent as to AWS. The tasks
//! run on LocalStack's table and queues. Step Functions' own executions run against LocalStack in
//! the differential test (`asl_diff`'s `sync-child`).
//!
//! A query that succeeds after some polls ends the task with the last poll's answer; one that
//! fails fails the task as `States.TaskFailed` (its description the cause) and is stopped by the
//! compensation; one still
//! running when the task is cancelled is stopped; a start carries a client token made from the
//! step's idempotency key, and the fake applies it as Athena does (the same token, the same query).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use sas_core::agent::{AgentRuntime, AwsConfigCell};
use sas_protocol::protocol::ProcessState;
use sas_protocol::workflow::WorkflowRegistry;
use serde_json::{json, Value};

use crate::common::stack_with;

/// What the fake was asked: each query by id, with its text, its client token, how many times
/// its status was asked for and whether it was stopped.
#[derive(Debug, Default)]
struct Athena {
    queries: HashMap<String, Query>,
    /// client token -> query id (Athena's idempotency: the same token starts no second query)
    tokens: HashMap<String, String>,
    starts: usize,
}

#[derive(Debug, Clone, Default)]
struct Query {
    sql: String,
    polls: u32,
    stopped: bool,
}

/// GetQueryExecution's answer, as the API reference records it, in the state the query is in: a
/// query containing "fail" fails at its second poll; "slow" runs until stopped; any other is
/// QUEUED, then RUNNING twice, then SUCCEEDED.
fn execution(id: &str, q: &Query) -> Value {
    let state = if q.stopped {
        "CANCELLED"
    } else if q.sql.contains("fail") {
        if q.polls >= 1 {
            "FAILED"
        } else {
            "RUNNING"
        }
    } else if q.sql.contains("slow") {
        "RUNNING"
    } else {
        match q.polls {
            0 => "QUEUED",
            1 | 2 => "RUNNING",
            _ => "SUCCEEDED",
        }
    };
    let mut status = json!({"State": state, "SubmissionDateTime": 1.764e9});
    if state == "FAILED" {
        status["StateChangeReason"] = json!("SYNTAX_ERROR: line 1:8: Column 'fail' cannot be resolved");
        status["AthenaError"] = json!({"ErrorCategory": 2, "ErrorType": 1006, "Retryable": false});
    }
    json!({"QueryExecution": {
        "QueryExecutionId": id, "Query": q.sql, "StatementType": "DML",
        "ResultConfiguration": {"OutputLocation": format!("s3://results/{id}.csv")},
        "QueryExecutionContext": {"Database": "sales"},
        "Status": status,
        "Statistics": {"EngineExecutionTimeInMillis": 1_234, "DataScannedInBytes": 5_678},
        "WorkGroup": "primary"
    }})
}

fn fake_athena(state: &Mutex<Athena>, headers: &HeaderMap, body: &Bytes) -> impl IntoResponse {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let signed = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut a = state.lock().expect("the fake's state");
    let (status, answer) = if !signed.starts_with("AWS4-HMAC-SHA256 ") || !signed.contains("/athena/aws4_request") {
        (StatusCode::FORBIDDEN, json!({"__type": "UnrecognizedClientException", "message": "not signed for athena"}))
    } else {
        match target.as_str() {
            "AmazonAthena.StartQueryExecution" => {
                a.starts += 1;
                let token = req["ClientRequestToken"].as_str().unwrap_or("").to_owned();
                let id = match a.tokens.get(&token) {
                    Some(id) if !token.is_empty() => id.clone(),
                    _ => {
                        let id = format!("q-{}", a.queries.len() + 1);
                        let sql = req["QueryString"].as_str().unwrap_or("").to_owned();
                        a.queries.insert(id.clone(), Query { sql, ..Query::default() });
                        a.tokens.insert(token, id.clone());
                        id
                    }
                };
                (StatusCode::OK, json!({"QueryExecutionId": id}))
            }
            "AmazonAthena.GetQueryExecution" | "AmazonAthena.StopQueryExecution" => {
                let id = req["QueryExecutionId"].as_str().unwrap_or("").to_owned();
                match a.queries.get_mut(&id) {
                    None => (
                        StatusCode::BAD_REQUEST,
                        json!({"__type": "InvalidRequestException", "Message": format!("QueryExecution {id} was not found")}),
                    ),
                    Some(q) if target.ends_with("StopQueryExecution") => {
                        q.stopped = true;
                        (StatusCode::OK, json!({}))
                    }
                    Some(q) => {
                        let answer = execution(&id, q);
                        q.polls += 1;
                        (StatusCode::OK, answer)
                    }
                }
            }
            other => (StatusCode::BAD_REQUEST, json!({"__type": "UnknownOperationException", "message": other})),
        }
    };
    (status, [("content-type", "application/x-amz-json-1.1")], answer.to_string())
}

/// The fake, listening on a port of its own: its URL and what it was asked.
async fn serve() -> (String, Arc<Mutex<Athena>>) {
    let state = Arc::new(Mutex::new(Athena::default()));
    let s = state.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
        let s = s.clone();
        async move { fake_athena(&s, &headers, &body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the fake");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("the fake serves") });
    (url, state)
}

/// The state machine imported, polled every second (the importer's 10 s, shortened for the test).
fn imported() -> (WorkflowRegistry, String) {
    let def = json!({"StartAt": "Query", "States": {
        "Query": {"Type": "Task", "Resource": "arn:aws:states:::athena:startQueryExecution.sync", "End": true,
                  "Parameters": {"QueryString.$": "$.sql", "WorkGroup": "primary",
                                 "QueryExecutionContext": {"Database": "sales"}},
                  "ResultSelector": {"state.$": "$.QueryExecution.Status.State",
                                     "csv.$": "$.QueryExecution.ResultConfiguration.OutputLocation"},
                  "TimeoutSeconds": 300}}});
    let mut i = sas_cli::asl::import("report", &def).expect("the definition translates");
    i.workflow["steps"][0]["wait_ms"] = json!(1_000);
    i.workflow["steps"][0]["max_iterations"] = json!(200);
    let registry = WorkflowRegistry::from_json(&json!({"workflows": i.workflows()}).to_string()).expect("workflows");
    (registry, sas_cli::asl::agents_file(&i.agents).to_string())
}

#[tokio::test]
async fn a_job_is_polled_to_its_end_failed_as_step_functions_fails_it_and_stopped_when_cancelled() {
    let (url, athena) = serve().await;
    let (registry, agents) = imported();
    let s = stack_with("jobs", registry).await;
    // the aws agents call the fake; the tasks live on LocalStack
    let fake = s.sdk.to_builder().endpoint_url(&url).build();
    let rt = AgentRuntime::from_config_with(&agents, &|_| None, AwsConfigCell::with(fake)).expect("the agents");
    let runner = s.runner_with(rt);
    for (id, sql) in [("ok", "select total from sales"), ("bad", "select fail"), ("slow", "select slow")] {
        let body = json!({"v": 1, "task_id": id, "workflow": "report", "input": {"sql": sql}});
        s.send(&s.res.submission_queue_url, &body.to_string()).await;
    }
    let query_of = |sql: &str| {
        let a = athena.lock().expect("the fake");
        a.queries.iter().find(|(_, q)| q.sql == sql).map(|(id, q)| (id.clone(), q.clone()))
    };

    // polled until it succeeded: the last poll's answer, selected as the definition says
    let ok = s.wait_for("ok", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(ok.process_state, ProcessState::Processed, "{:?}", ok.reason);
    let (id, q) = query_of("select total from sales").expect("the query started");
    assert_eq!(ok.result(), Some(json!({"state": "SUCCEEDED", "csv": format!("s3://results/{id}.csv")})));
    assert!(q.polls >= 3 && !q.stopped, "QUEUED, RUNNING, RUNNING, SUCCEEDED: {q:?}");

    // a query that fails fails the task as States.TaskFailed, its description the cause, and the
    // task's compensation stops it (nothing to do for Athena: it ended)
    let bad = s.wait_for("bad", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(bad.process_state, ProcessState::Compensated, "{:?}", bad.reason);
    let reason = bad.reason.clone().unwrap_or_default();
    assert!(reason.contains("States.TaskFailed") && reason.contains(r#""Query":"select fail""#), "{reason}");
    let (_, q) = query_of("select fail").expect("the failing query started");
    assert!(q.stopped, "the start undone: {q:?}");

    // a query still running when the task is cancelled is stopped
    s.wait_for("slow", Duration::from_mins(3), |_| query_of("select slow").is_some_and(|(_, q)| q.polls >= 2)).await;
    let cancel = json!({"type": "cancel", "v": 1, "task_id": "slow", "reason": "no longer needed"});
    s.send(&s.res.scheduler_queue_url, &cancel.to_string()).await;
    let slow = s.wait_for("slow", Duration::from_mins(3), |t| t.process_state.is_terminal()).await;
    assert_eq!(slow.process_state, ProcessState::Cancelled, "{:?}", slow.reason);
    let (_, q) = query_of("select slow").expect("the slow query started");
    assert!(q.stopped, "the cancel stopped the query: {q:?}");

    // every start carried a client token, so one started twice would be one query
    {
        let a = athena.lock().expect("the fake");
        assert_eq!(a.queries.len(), 3, "one query per task: {a:?}");
        assert!(a.tokens.keys().all(|t| (32..=128).contains(&t.len())), "client tokens: {:?}", a.tokens.keys());
        assert!(a.starts >= 3);
    }
    runner.shutdown().await;
    s.delete().await;
}
