//! The ground is real: the deployed template's queues, DLQs, indexes and topic behave as the
//! protocol relies on.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sas_core::store::{DynamoStore, StateStore, StoreError, TaskWriter, BY_COMPLETE_BY};
use sas_protocol::ids::{AttemptToken, Millis, TaskId};
use sas_protocol::messages::{Alert, AlertKind};
use sas_protocol::protocol::{self, Policy, ProcessState};

use crate::common::stack;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_max_receive_count_times_lands_in_its_dlq() {
    let s = stack("dlq").await;
    let q = s.out("SubmissionQueueUrl").to_owned();
    s.send(&q, "poison").await;
    // maxReceiveCount is 3: three receives without a delete, then SQS moves it on the next.
    let mut receives = 0;
    for _ in 0..20 {
        let out = s
            .sqs
            .receive_message()
            .queue_url(&q)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await
            .expect("ReceiveMessage");
        receives += out.messages.unwrap_or_default().len();
        if s.depth(s.out("SubmissionDlqUrl")).await > 0 {
            break;
        }
    }
    assert_eq!(receives, 3, "received exactly maxReceiveCount times before the redrive");
    let dlq = s.bodies_raw(s.out("SubmissionDlqUrl")).await;
    assert_eq!(dlq, vec!["poison".to_owned()]);
    assert_eq!(s.depth(&q).await, 0);
    s.delete().await;
}

impl crate::common::Stack {
    async fn bodies_raw(&self, q: &str) -> Vec<String> {
        self.drain(q, 1, Duration::from_secs(5)).await.into_iter().filter_map(|m| m.body).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_complete_by_index_is_sparse() {
    let s = stack("gsi").await;
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let table = s.out("TaskTableName");
    let now = Millis::now();
    let put = |id: &str, keys: bool| {
        let mut item: HashMap<String, AttributeValue> = HashMap::new();
        item.insert("TaskId".into(), AttributeValue::S(id.into()));
        item.insert("ProcessState".into(), AttributeValue::S("Processing".into()));
        item.insert("UpdatedAt".into(), AttributeValue::N(now.0.to_string()));
        if keys {
            item.insert("Shard".into(), AttributeValue::S("0".into()));
            item.insert("CompleteBy".into(), AttributeValue::N((now.0 - 1_000).to_string()));
        }
        ddb.put_item().table_name(table).set_item(Some(item)).send()
    };
    put("in-flight", true).await.expect("PutItem");
    put("finished", false).await.expect("PutItem");
    let mut later: HashMap<String, AttributeValue> = HashMap::new();
    later.insert("TaskId".into(), AttributeValue::S("not-yet".into()));
    later.insert("Shard".into(), AttributeValue::S("0".into()));
    later.insert("CompleteBy".into(), AttributeValue::N((now.0 + 600_000).to_string()));
    ddb.put_item().table_name(table).set_item(Some(later)).send().await.expect("PutItem");

    let ids = |out: aws_sdk_dynamodb::operation::query::QueryOutput| -> Vec<String> {
        out.items
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.get("TaskId").and_then(|v| v.as_s().ok()).cloned())
            .collect()
    };
    let query = || {
        ddb.query()
            .table_name(table)
            .index_name(BY_COMPLETE_BY)
            // Shard is a reserved word in DynamoDB expressions.
            .key_condition_expression("#s = :s AND CompleteBy <= :now")
            .expression_attribute_names("#s", "Shard")
            .expression_attribute_values(":s", AttributeValue::S("0".into()))
            .expression_attribute_values(":now", AttributeValue::N(now.0.to_string()))
            .send()
    };
    assert_eq!(ids(query().await.expect("Query")), vec!["in-flight".to_owned()]);

    // Removing the keys (as a terminal transition does) drops the item from the index.
    ddb.update_item()
        .table_name(table)
        .key("TaskId", AttributeValue::S("in-flight".into()))
        .update_expression("REMOVE #s, CompleteBy")
        .expression_attribute_names("#s", "Shard")
        .send()
        .await
        .expect("UpdateItem");
    assert!(ids(query().await.expect("Query")).is_empty());
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_conditional_write_is_a_typed_conflict() {
    let s = stack("cond").await;
    let store = &s.table();
    let wf = s.deps.workflows.resolve("three", None).unwrap().clone();
    let t = protocol::submit(
        TaskId::try_from("c1").unwrap(),
        wf,
        serde_json::json!({}),
        None,
        &protocol::Ctx::at(Millis::now()),
        &Policy::default(),
    )
    .task;
    store.create(&t).await.expect("created");
    // The same request again, as the SDK sends it when the first copy landed but its answer was
    // lost: the item there (ALL_OLD) is the one it wrote, so it is created, not a duplicate.
    store.create(&t).await.expect("a retried create that had landed is not a duplicate");
    // Another submission of the same id (its own attempt token) is a duplicate.
    let mut other = t.clone();
    other.lock.locked_by = Some(AttemptToken::fresh());
    assert!(matches!(store.create(&other).await, Err(StoreError::AlreadyExists)));

    let mut newer = t.clone();
    newer.rev += 1;
    store.save(&newer, &t).await.expect("first writer wins");
    // A second writer that read the same revision loses, and is told what the item is now.
    let mut other = t.clone();
    other.rev += 1;
    other.failure_count = 7;
    match store.save(&other, &t).await {
        Err(StoreError::Conflict { current: Some(current) }) => assert_eq!(*current, newer),
        other => panic!("expected a typed conflict, got {other:?}"),
    }
    assert_eq!(store.get(&t.task_id).await.unwrap().unwrap().failure_count, 0);
    s.delete().await;
}

/// A task item of the previous layout (its definition embedded) pinned to a definition no
/// process deploys. A process that saves it names the definition by reference: the definition item
/// must be stored first, or no other process can read the task again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_task_names_only_a_stored_workflow_definition() {
    let s = stack("wfref").await;
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let table = s.res.task_table.clone();
    let mut wf = s.deps.workflows.resolve("three", None).unwrap().clone();
    wf.version = 99;
    wf.description = "retired: deployed by no process of this build".into();
    let t = protocol::submit(
        TaskId::try_from("legacy-1").unwrap(),
        wf,
        serde_json::json!({"n": 1}),
        None,
        &protocol::Ctx::at(Millis::now()),
        &Policy::default(),
    )
    .task;
    let legacy: HashMap<String, AttributeValue> = serde_dynamo::to_item(&t).expect("item");
    assert!(legacy.contains_key("Workflow"), "the previous layout embeds the definition");
    ddb.put_item().table_name(&table).set_item(Some(legacy)).send().await.expect("PutItem");

    // one process (it knows no definitions) reads the task and writes a transition
    let writer = DynamoStore::new(ddb.clone(), table.clone(), 2, 1);
    let read = writer.get(&t.task_id).await.expect("GetItem").expect("the task");
    let mut next = read.clone();
    next.rev += 1;
    next.failure_count += 1;
    writer.save(&next, &read).await.expect("saved");

    // another process reads it back
    let reader = DynamoStore::new(ddb, table, 2, 1);
    let got = reader.get(&t.task_id).await;
    assert!(matches!(&got, Ok(Some(task)) if *task == next), "{got:?}");
    s.delete().await;
}

/// A large input is stored once, apart from the task's item: every write of the task stays small
/// (the parent of a map over a long array is rewritten at each element's end), another process
/// reads the task whole, and the input expires after the task once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_input_is_stored_once_apart_from_the_task() {
    let s = stack("bigin").await;
    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let table = s.res.task_table.clone();
    let wf = s.deps.workflows.resolve("three", None).unwrap().clone();
    let lines: Vec<_> = (0..1000).map(|i| serde_json::json!({"sku": format!("sku-{i}"), "qty": 1})).collect();
    let t = protocol::submit(
        TaskId::try_from("big-1").unwrap(),
        wf,
        serde_json::json!({"items": lines, "total": 10.0}),
        None,
        &protocol::Ctx::at(Millis::now()),
        &Policy::default(),
    )
    .task;
    let writer = DynamoStore::new(ddb.clone(), table.clone(), 2, 1);
    writer.create(&t).await.expect("created");
    writer.create(&t).await.expect("a create sent again is not a duplicate");
    // a duplicate of the id with another input: refused, and its input item expires in a day
    let mut dup = t.clone();
    dup.input["items"][0]["qty"] = serde_json::json!(2);
    dup.lock.locked_by = Some(AttemptToken::fresh());
    assert!(matches!(writer.create(&dup).await, Err(StoreError::AlreadyExists)));
    let mut next = t.clone();
    next.rev += 1;
    next.failure_count += 1;
    writer.save(&next, &t).await.expect("saved");

    let item = s.item("big-1").await;
    assert!(!item.contains_key("Input"), "the input is not in the task's item");
    let Some(AttributeValue::S(key)) = item.get("InputRef").cloned() else { panic!("no InputRef: {item:?}") };
    let bytes = sas_core::store::item_size(&item);
    assert!(bytes < 2048, "the task's item is {bytes} bytes");
    assert!(!s.item(&key).await.contains_key("ExpiresAt"), "no expiry while the task runs");
    let dup_key = writer.to_item(&dup).unwrap()["InputRef"].as_s().unwrap().clone();
    assert_ne!(dup_key, key);
    let day = Millis::now().0 / 1000 + 86_400;
    match s.item(&dup_key).await.get("ExpiresAt") {
        Some(AttributeValue::N(n)) => assert!(n.parse::<u64>().unwrap().abs_diff(day) < 600, "{n}"),
        other => panic!("the duplicate's input does not expire: {other:?}"),
    }

    // another process (an empty cache) reads the task whole (10.0 comes back as the number 10)
    let reader = DynamoStore::new(ddb.clone(), table.clone(), 2, 1);
    let got = reader.get(&t.task_id).await.expect("GetItem").expect("the task");
    assert_eq!((got.rev, got.failure_count, &got.input["items"]), (next.rev, next.failure_count, &next.input["items"]));
    assert_eq!(got.input["total"].as_f64(), Some(10.0));
    // ... and writes a transition of what it read: its item still names the input stored
    let mut next = got.clone();
    next.rev += 1;
    reader.save(&next, &got).await.expect("saved");
    // the same write again (as the SDK resends one whose answer was lost): it is ours, it landed
    reader.save(&next, &got).await.expect("a write found in place is the write that landed");
    let third = DynamoStore::new(ddb.clone(), table.clone(), 2, 1);
    let got = third.get(&t.task_id).await.expect("the input is found").expect("the task");
    assert_eq!(got.rev, next.rev);

    // the task ends: its input expires 30 days after it
    let mut done = next.clone();
    done.rev += 1;
    done.process_state = ProcessState::Cancelled;
    done.lock.locked_by = None;
    done.complete_by = None;
    writer.save(&done, &next).await.expect("ended");
    let item = s.item("big-1").await;
    let expiry = |i: &HashMap<String, AttributeValue>| match i.get("ExpiresAt") {
        Some(AttributeValue::N(n)) => n.parse::<u64>().unwrap(),
        other => panic!("no ExpiresAt: {other:?}"),
    };
    assert_eq!(expiry(&s.item(&key).await), expiry(&item) + 30 * 86_400);
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_reaches_a_subscribed_queue() {
    let s = stack("sns").await;
    let listener = s.alert_listener().await;
    let alert = Alert {
        v: 1,
        kind: AlertKind::TaskError,
        task_id: TaskId::try_from("order-9").unwrap(),
        workflow: "three@1".into(),
        state: ProcessState::Error,
        step: Some("undo_a".into()),
        failure_count: 4,
        reason: "compensation failed".into(),
        at: Millis::now(),
    };
    s.deps.outbox().alert(&alert).await.expect("Publish");
    let got = s.bodies(&listener, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let received: Alert = serde_json::from_value(got[0].clone()).expect("an Alert");
    assert_eq!(received, alert);
    s.delete().await;
}

/// What `template.yaml` promises the protocol, read back from the deployed stack: every output,
/// the two indexes with their keys and projections, TTL, each queue's redrive to its own DLQ,
/// and the alert topic's encryption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_template_has_its_indexes_ttl_redrive_and_encryption() {
    let s = stack("template").await;
    for queue in ["Submission", "Scheduler", "Agent", "Supervisor"] {
        for kind in ["Queue", "Dlq"] {
            for attr in ["Url", "Arn"] {
                let key = format!("{queue}{kind}{attr}");
                assert!(s.outputs.contains_key(&key), "output {key} missing");
            }
        }
    }
    for key in ["TaskTableName", "TaskTableArn", "AlertTopicArn"] {
        assert!(s.outputs.contains_key(key), "output {key} missing");
    }

    let ddb = aws_sdk_dynamodb::Client::new(&s.sdk);
    let table = ddb.describe_table().table_name(s.out("TaskTableName")).send().await.expect("DescribeTable");
    let table = table.table.expect("a table");
    let indexes: HashMap<String, _> =
        table.global_secondary_indexes().iter().map(|i| (i.index_name().unwrap_or_default().to_owned(), i)).collect();
    let mut names: Vec<&String> = indexes.keys().collect();
    names.sort();
    assert_eq!(names, vec!["ByCompleteBy", "ByEnd"]);
    let keys: Vec<&str> = indexes["ByCompleteBy"]
        .key_schema()
        .iter()
        .map(aws_sdk_dynamodb::types::KeySchemaElement::attribute_name)
        .collect();
    assert_eq!(keys, vec!["Shard", "CompleteBy"]);
    let projection = |i: &str| indexes[i].projection().and_then(|p| p.projection_type()).map(|t| t.as_str().to_owned());
    assert_eq!(projection("ByCompleteBy").as_deref(), Some("KEYS_ONLY"), "the sweep reads keys, not items");
    assert_eq!(projection("ByEnd").as_deref(), Some("INCLUDE"));
    let ttl = ddb.describe_time_to_live().table_name(s.out("TaskTableName")).send().await.expect("DescribeTimeToLive");
    let ttl = ttl.time_to_live_description().expect("a TTL description");
    assert_eq!(ttl.attribute_name(), Some("ExpiresAt"));
    assert_eq!(ttl.time_to_live_status().map(aws_sdk_dynamodb::types::TimeToLiveStatus::as_str), Some("ENABLED"));

    for (queue, limit) in [("Submission", 3), ("Scheduler", 5), ("Agent", 3), ("Supervisor", 3)] {
        let attrs = s
            .sqs
            .get_queue_attributes()
            .queue_url(s.out(&format!("{queue}QueueUrl")))
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .expect("GetQueueAttributes");
        let policy = attrs.attributes().and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy));
        let policy: serde_json::Value = serde_json::from_str(policy.expect("a redrive policy")).expect("JSON");
        assert_eq!(policy["deadLetterTargetArn"], s.out(&format!("{queue}DlqArn")), "{queue}Queue redrives to its DLQ");
        assert_eq!(policy["maxReceiveCount"].to_string().trim_matches('"'), limit.to_string(), "{queue}Queue");
    }

    let sns = aws_sdk_sns::Client::new(&s.sdk);
    let topic = sns.get_topic_attributes().topic_arn(s.out("AlertTopicArn")).send().await.expect("GetTopicAttributes");
    assert!(
        topic.attributes().and_then(|a| a.get("KmsMasterKeyId")).is_some_and(|k| !k.is_empty()),
        "the alert topic is encrypted with its KMS key"
    );
    // The stack (functions off, as most tests and the local runner deploy it) is deleted for good:
    // a GetAtt of a resource its condition leaves out once kept it in DELETE_IN_PROGRESS.
    let cfn = aws_sdk_cloudformation::Client::new(&s.sdk);
    let deleted = sas_cli::stack::delete_and_wait(&cfn, &s.name, Duration::from_mins(2)).await;
    assert!(deleted.is_ok(), "{deleted:?}");
}
