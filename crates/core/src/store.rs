//! The state store: one DynamoDB table, one item per task. Every write is conditional; a lost
//! condition is the typed outcome [`StoreError::Conflict`] (carrying the current item, so the
//! caller can re-decide without another read) or [`StoreError::AlreadyExists`].
//!
//! Besides the task's own attributes, the store writes derived ones:
//! - `Shard` (with `CompleteBy`): the keys of the sparse `ByCompleteBy` index, present only while
//!   the task is in flight, so the Supervisor's queries cost what is expired, not the table;
//! - `WorkflowName`, `CurrentStep`: for operators (projected into `ByProcessState`);
//! - `ExpiresAt`: the TTL of a terminal task.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use crate::ids::{Millis, TaskId};
use crate::protocol::{ProcessState, Task};

pub const BY_COMPLETE_BY: &str = "ByCompleteBy";
pub const BY_PROCESS_STATE: &str = "ByProcessState";
/// DynamoDB's item limit is 400 KB; stay clear of it.
pub const MAX_ITEM_BYTES: usize = 380 * 1024;

type Item = HashMap<String, AttributeValue>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("a task with this id already exists")]
    AlreadyExists,
    /// The conditional write lost: the task changed since it was read. `current` is the item as
    /// it is now (absent if it was deleted).
    #[error("conditional write lost: the task changed since it was read")]
    Conflict { current: Option<Box<Task>> },
    #[error("task item would be about {bytes} bytes; the limit is {MAX_ITEM_BYTES}")]
    TooLarge { bytes: usize },
    #[error("DynamoDB {op}: {}", aws_sdk_dynamodb::error::DisplayErrorContext(source.as_ref()))]
    Aws {
        op: &'static str,
        #[source]
        source: Box<aws_sdk_dynamodb::Error>,
    },
    #[error("task item does not match the expected shape: {0}")]
    Codec(#[from] serde_dynamo::Error),
}

fn aws<E>(
    op: &'static str,
) -> impl FnOnce(aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>) -> StoreError
where
    aws_sdk_dynamodb::Error: From<aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>>,
{
    move |e| StoreError::Aws { op, source: Box::new(e.into()) }
}

/// One page of the Supervisor's query.
#[derive(Debug)]
pub struct Page {
    pub tasks: Vec<Task>,
    pub next: Option<Item>,
}

/// A row of the operators' `ByProcessState` index.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskSummary {
    pub task_id: TaskId,
    pub process_state: ProcessState,
    #[serde(default)]
    pub workflow_name: Option<String>,
    #[serde(default)]
    pub current_step: Option<String>,
    #[serde(default)]
    pub failure_count: u32,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub created_at: Option<Millis>,
    pub updated_at: Millis,
}

#[derive(Debug, Clone)]
pub struct TaskStore {
    client: Client,
    table: String,
    shards: u32,
    retention_days: u32,
}

/// The shard a task's index entry lives in: a stable hash of its id (FNV-1a).
pub fn shard_of(task_id: &TaskId, shards: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in task_id.as_str().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % shards.max(1)
}

impl TaskStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32, retention_days: u32) -> Self {
        TaskStore { client, table: table.into(), shards, retention_days }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The item as written: the task plus the derived attributes.
    pub fn to_item(&self, task: &Task) -> Result<Item, StoreError> {
        let bytes = serde_json::to_vec(task).map_or(0, |v| v.len());
        if bytes > MAX_ITEM_BYTES {
            return Err(StoreError::TooLarge { bytes });
        }
        let mut item: Item = serde_dynamo::to_item(task)?;
        item.insert("WorkflowName".into(), AttributeValue::S(task.workflow.name.clone()));
        if let Some(step) = task.current_step_name() {
            item.insert("CurrentStep".into(), AttributeValue::S(step.to_owned()));
        }
        if task.process_state.is_terminal() {
            if self.retention_days > 0 {
                let expires = task.updated_at.0 / 1000 + u64::from(self.retention_days) * 86_400;
                item.insert("ExpiresAt".into(), AttributeValue::N(expires.to_string()));
            }
        } else if task.complete_by.is_some() {
            let shard = shard_of(&task.task_id, self.shards);
            item.insert("Shard".into(), AttributeValue::S(shard.to_string()));
        }
        Ok(item)
    }

    pub fn from_item(item: Item) -> Result<Task, StoreError> {
        Ok(serde_dynamo::from_item(item)?)
    }

    /// Create a new task; `AlreadyExists` if its id is taken (duplicate submission).
    pub async fn create(&self, task: &Task) -> Result<(), StoreError> {
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

    /// Strongly consistent read of one task.
    pub async fn get(&self, task_id: &TaskId) -> Result<Option<Task>, StoreError> {
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

    /// Write `task` if the stored item is still `read` (same `Rev`, and the same `LockedBy`: the
    /// attempt's fencing token is re-checked on every write). One request per transition.
    pub async fn save(&self, task: &Task, read: &Task) -> Result<(), StoreError> {
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
                other => Err(StoreError::Aws { op: "PutItem", source: Box::new(other.into()) }),
            },
        }
    }

    /// One page of in-flight tasks in `shard` whose `CompleteBy <= now` (the sparse index).
    /// The index is eventually consistent: callers re-check with a conditional write.
    pub async fn expired(&self, shard: u32, now: Millis, limit: i32, start: Option<Item>) -> Result<Page, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(BY_COMPLETE_BY)
            .key_condition_expression("#s = :s AND CompleteBy <= :now")
            .expression_attribute_names("#s", "Shard")
            .expression_attribute_values(":s", AttributeValue::S(shard.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now.0.to_string()))
            .limit(limit)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(aws("Query"))?;
        let tasks = out.items.unwrap_or_default().into_iter().map(Self::from_item).collect::<Result<_, _>>()?;
        Ok(Page { tasks, next: out.last_evaluated_key })
    }

    /// Tasks in `state`, most recently updated first, for operators (paged internally up to `max`).
    pub async fn list_by_state(&self, state: ProcessState, max: usize) -> Result<Vec<TaskSummary>, StoreError> {
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
                rows.push(serde_dynamo::from_item(item)?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{submit, Policy};
    use crate::workflow::{WorkflowRegistry, BUILT_IN_WORKFLOWS};

    fn store() -> TaskStore {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        TaskStore::new(Client::from_conf(conf), "t", 4, 30)
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
        assert_eq!(TaskStore::from_item(item).unwrap(), t);

        let mut done = t.clone();
        done.process_state = ProcessState::Processed;
        done.complete_by = None;
        let item = s.to_item(&done).unwrap();
        assert!(!item.contains_key("Shard") && !item.contains_key("CompleteBy"), "sparse index: gone when terminal");
        assert!(item.contains_key("ExpiresAt"));
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        let id = TaskId::try_from("abc").unwrap();
        assert_eq!(shard_of(&id, 8), shard_of(&id, 8));
        let hits: std::collections::HashSet<u32> =
            (0..200).map(|i| shard_of(&TaskId::try_from(format!("t{i}")).unwrap(), 4)).collect();
        assert_eq!(hits.len(), 4, "ids spread over every shard");
    }
}
