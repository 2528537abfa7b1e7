//! The DynamoDB state store: one table, one item per task, one conditional `PutItem` per
//! transition (with `ReturnValuesOnConditionCheckFailure`, so a lost write returns the current
//! item at no extra read).
//!
//! Besides the task's own attributes, it writes derived ones:
//! - `Shard` (with `CompleteBy`): the keys of the sparse `ByCompleteBy` index, present only while
//!   the task is in flight ([`super::index_key`]), so the Supervisor's queries cost what is
//!   expired, not the table;
//! - `WorkflowName`, `CurrentStep`: for operators (projected into `ByProcessState`);
//! - `ExpiresAt`: the TTL of a terminal task.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use futures::future::BoxFuture;

use super::{check_size, index_key, Page, PageKey, StateStore, StoreError, TaskSummary};
use crate::ids::{Millis, TaskId};
use crate::protocol::{ProcessState, Task};

pub const BY_COMPLETE_BY: &str = "ByCompleteBy";
pub const BY_PROCESS_STATE: &str = "ByProcessState";

type Item = HashMap<String, AttributeValue>;

fn aws<E>(
    op: &'static str,
) -> impl FnOnce(aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>) -> StoreError
where
    aws_sdk_dynamodb::Error: From<aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>>,
{
    move |e| backend(op, e.into())
}

fn backend(op: &'static str, e: aws_sdk_dynamodb::Error) -> StoreError {
    StoreError::Backend {
        op,
        message: format!("DynamoDB {op}: {}", aws_sdk_dynamodb::error::DisplayErrorContext(&e)),
        source: Some(Box::new(e)),
    }
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(codec)`
fn codec(e: serde_dynamo::Error) -> StoreError {
    StoreError::Codec(e.to_string())
}

/// The DynamoDB implementation of [`StateStore`].
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    shards: u32,
    retention_days: u32,
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32, retention_days: u32) -> Self {
        DynamoStore { client, table: table.into(), shards, retention_days }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The item as written: the task plus the derived attributes.
    pub fn to_item(&self, task: &Task) -> Result<Item, StoreError> {
        check_size(task)?;
        let mut item: Item = serde_dynamo::to_item(task).map_err(codec)?;
        item.insert("WorkflowName".into(), AttributeValue::S(task.workflow.name.clone()));
        if let Some(step) = task.current_step_name() {
            item.insert("CurrentStep".into(), AttributeValue::S(step.to_owned()));
        }
        if task.process_state.is_terminal() {
            // An Error task waits for an operator: it never expires.
            if self.retention_days > 0 && task.process_state != ProcessState::Error {
                let expires = task.updated_at.0 / 1000 + u64::from(self.retention_days) * 86_400;
                item.insert("ExpiresAt".into(), AttributeValue::N(expires.to_string()));
            }
        } else if let Some((shard, _)) = index_key(task, self.shards) {
            item.insert("Shard".into(), AttributeValue::S(shard.to_string()));
        }
        Ok(item)
    }

    pub fn from_item(item: Item) -> Result<Task, StoreError> {
        serde_dynamo::from_item(item).map_err(codec)
    }

    async fn create_item(&self, task: &Task) -> Result<(), StoreError> {
        let item = self.to_item(task)?;
        let r = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(TaskId)")
            .send()
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::put_item::PutItemError::is_conditional_check_failed_exception,
                ) =>
            {
                Err(StoreError::AlreadyExists)
            }
            Err(e) => Err(aws("PutItem")(e)),
        }
    }

    async fn get_item(&self, task_id: &TaskId) -> Result<Option<Task>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("TaskId", AttributeValue::S(task_id.to_string()))
            .consistent_read(true)
            .send()
            .await
            .map_err(aws("GetItem"))?;
        out.item.map(Self::from_item).transpose()
    }

    async fn save_item(&self, task: &Task, read: &Task) -> Result<(), StoreError> {
        let item = self.to_item(task)?;
        let mut req = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .expression_attribute_names("#rev", "Rev")
            .expression_attribute_values(":rev", AttributeValue::N(read.rev.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        req = match &read.locked_by {
            Some(token) => req
                .condition_expression("#rev = :rev AND LockedBy = :lock")
                .expression_attribute_values(":lock", AttributeValue::S(token.to_string())),
            None => req.condition_expression("#rev = :rev AND attribute_not_exists(LockedBy)"),
        };
        match req.send().await {
            Ok(_) => Ok(()),
            Err(e) => match e.into_service_error() {
                aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => {
                    let current = c.item.map(Self::from_item).transpose()?.map(Box::new);
                    Err(StoreError::Conflict { current })
                }
                other => Err(backend("PutItem", other.into())),
            },
        }
    }

    async fn query_expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> Result<Page, StoreError> {
        let start = start.map(|k| {
            Item::from([
                ("TaskId".to_owned(), AttributeValue::S(k.task_id.to_string())),
                ("Shard".to_owned(), AttributeValue::S(shard.to_string())),
                ("CompleteBy".to_owned(), AttributeValue::N(k.complete_by.0.to_string())),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(BY_COMPLETE_BY)
            .key_condition_expression("#s = :s AND CompleteBy <= :now")
            .expression_attribute_names("#s", "Shard")
            .expression_attribute_values(":s", AttributeValue::S(shard.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now.0.to_string()))
            .limit(i32::try_from(limit.clamp(1, 1000)).unwrap_or(1000))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(aws("Query"))?;
        let mut tasks = Vec::new();
        let mut unreadable = Vec::new();
        for item in out.items.unwrap_or_default() {
            let key = match item.get("TaskId") {
                Some(AttributeValue::S(s)) => s.clone(),
                _ => "(no TaskId)".to_owned(),
            };
            match Self::from_item(item) {
                Ok(t) => tasks.push(t),
                Err(e) => unreadable.push(format!("{key}: {e}")),
            }
        }
        let next = match out.last_evaluated_key {
            None => None,
            Some(k) => Some(page_key(&k)?),
        };
        Ok(Page { tasks, next, unreadable })
    }

    async fn query_by_state(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
        let mut rows = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(BY_PROCESS_STATE)
                .key_condition_expression("ProcessState = :p")
                .expression_attribute_values(":p", AttributeValue::S(state.to_string()))
                .scan_index_forward(false)
                .limit(i32::try_from(max.min(1000)).unwrap_or(1000))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(aws("Query"))?;
            for item in out.items.unwrap_or_default() {
                rows.push(serde_dynamo::from_item(item).map_err(codec)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() || rows.len() >= max {
                break;
            }
        }
        rows.truncate(max);
        Ok(rows)
    }
}

/// The typed page key of a `ByCompleteBy` LastEvaluatedKey.
fn page_key(k: &Item) -> Result<PageKey, StoreError> {
    let bad = || StoreError::Codec(format!("unexpected LastEvaluatedKey {k:?}"));
    let task_id = match k.get("TaskId") {
        Some(AttributeValue::S(s)) => TaskId::try_from(s.as_str()).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let complete_by = match k.get("CompleteBy") {
        Some(AttributeValue::N(n)) => Millis(n.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    Ok(PageKey { task_id, complete_by })
}

impl StateStore for DynamoStore {
    fn create<'a>(&'a self, task: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.create_item(task))
    }

    fn get<'a>(&'a self, task_id: &'a TaskId) -> BoxFuture<'a, Result<Option<Task>, StoreError>> {
        Box::pin(self.get_item(task_id))
    }

    fn save<'a>(&'a self, task: &'a Task, read: &'a Task) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.save_item(task, read))
    }

    fn expired(
        &self,
        shard: u32,
        now: Millis,
        limit: usize,
        start: Option<PageKey>,
    ) -> BoxFuture<'_, Result<Page, StoreError>> {
        Box::pin(self.query_expired(shard, now, limit, start))
    }

    fn list_by_state(&self, state: ProcessState, max: usize) -> BoxFuture<'_, Result<Vec<TaskSummary>, StoreError>> {
        Box::pin(self.query_by_state(state, max))
    }

    fn shards(&self) -> u32 {
        self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{submit, Policy};
    use crate::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    fn store() -> DynamoStore {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        DynamoStore::new(Client::from_conf(conf), "t", 4, 30)
    }

    fn task() -> Task {
        let wf = WorkflowRegistry::from_json(BUILT_IN_WORKFLOWS).unwrap().resolve("order", None).unwrap().clone();
        submit(
            TaskId::try_from("order-1").unwrap(),
            wf,
            serde_json::json!({"n": 1.5, "s": "x", "l": [1, null, true], "empty": {}}),
            None,
            Millis(1_000),
            &Policy::default(),
        )
        .task
    }

    #[test]
    fn item_round_trips_and_carries_index_keys_only_in_flight() {
        let s = store();
        let t = task();
        let item = s.to_item(&t).unwrap();
        assert!(item.contains_key("Shard"));
        assert_eq!(item.get("CompleteBy"), Some(&AttributeValue::N("31000".into())));
        assert_eq!(item.get("ProcessState"), Some(&AttributeValue::S("Pending".into())));
        assert_eq!(item.get("CurrentStep"), Some(&AttributeValue::S("reserve".into())));
        assert!(!item.contains_key("LockedBy"), "absent, not NULL");
        assert!(!item.contains_key("ExpiresAt"));
        assert_eq!(DynamoStore::from_item(item).unwrap(), t);

        let mut done = t.clone();
        done.process_state = ProcessState::Processed;
        done.complete_by = None;
        let item = s.to_item(&done).unwrap();
        assert!(!item.contains_key("Shard") && !item.contains_key("CompleteBy"), "sparse index: gone when terminal");
        assert!(item.contains_key("ExpiresAt"));
    }

    #[test]
    fn page_keys_round_trip_through_last_evaluated_key() {
        let k = Item::from([
            ("TaskId".to_owned(), AttributeValue::S("t-1".into())),
            ("Shard".to_owned(), AttributeValue::S("3".into())),
            ("CompleteBy".to_owned(), AttributeValue::N("1234".into())),
        ]);
        assert_eq!(
            page_key(&k).unwrap(),
            PageKey { task_id: TaskId::try_from("t-1").unwrap(), complete_by: Millis(1234) }
        );
        assert!(matches!(page_key(&Item::new()), Err(StoreError::Codec(_))));
    }
}
