//! What the operator commands and the load benchmark read from the task table beyond the
//! [`StateStore`](sas_core::store::StateStore) port, which reads one task per request and lists a
//! state without counting it:
//! - [`TableReader::get_many`]: `BatchGetItem`, 100 ids per request (DynamoDB's limit), unprocessed
//!   keys retried;
//! - [`TableReader::count_by_state`]: a `Select=COUNT` query of the `ByProcessState` index.
//!
//! Both return what they cost ([`ReadCost`]): the requests, the items, and the read capacity units
//! DynamoDB reports (`ReturnConsumedCapacity=TOTAL`), or an estimate from the items' sizes when it
//! reports none.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, ReturnConsumedCapacity, Select};
use futures::stream::{self, StreamExt, TryStreamExt};
use sas_core::ids::TaskId;
use sas_core::protocol::{ProcessState, Task};
use sas_core::store::{DynamoStore, BY_PROCESS_STATE};
use serde::Serialize;

/// DynamoDB's largest `BatchGetItem`.
pub const BATCH_GET_MAX: usize = 100;
/// `BatchGetItem` requests in flight at once.
const IN_FLIGHT: usize = 4;

type Item = HashMap<String, AttributeValue>;

/// What a read cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReadCost {
    /// Requests sent (retries of unprocessed keys included).
    pub requests: u64,
    /// Items returned (or, for a count, index entries counted).
    pub items: u64,
    /// Read capacity units as DynamoDB reported them (`ReturnConsumedCapacity=TOTAL`).
    pub reported_rcu: f64,
    /// Read capacity units estimated from the items' sizes: each item of a `BatchGetItem` is
    /// rounded up to 4 KB; an eventually consistent read costs half.
    pub estimated_rcu: f64,
}

impl std::ops::AddAssign for ReadCost {
    fn add_assign(&mut self, o: Self) {
        self.requests += o.requests;
        self.items += o.items;
        self.reported_rcu += o.reported_rcu;
        self.estimated_rcu += o.estimated_rcu;
    }
}

impl std::fmt::Display for ReadCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} requests, {} items, ", self.requests, self.items)?;
        if self.reported_rcu > 0.0 {
            write!(f, "{:.1} RCU reported by DynamoDB", self.reported_rcu)?;
        } else {
            write!(f, "no RCU reported")?;
        }
        write!(f, " (estimate from item sizes: {:.1} RCU)", self.estimated_rcu)
    }
}

/// The size DynamoDB bills for an item, approximately: attribute names plus values (strings by
/// length, numbers by about half their digits, one byte per list or map element of overhead).
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::L(l) => 3 + l.iter().map(|e| 1 + value_size(e)).sum::<usize>(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, e)| 1 + k.len() + value_size(e)).sum::<usize>(),
        AttributeValue::Ss(s) => s.iter().map(String::len).sum(),
        AttributeValue::Ns(s) => s.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        _ => 1,
    }
}

/// Read capacity of one item read by `GetItem`/`BatchGetItem`: 1 RCU per 4 KB, rounded up, halved
/// for an eventually consistent read.
pub fn item_rcu(bytes: usize, consistent: bool) -> f64 {
    #[allow(clippy::cast_precision_loss)] // item sizes are far below 2^52
    let units = bytes.max(1).div_ceil(4096) as f64;
    if consistent {
        units
    } else {
        units / 2.0
    }
}

/// Reads on the task table through its own DynamoDB client.
#[derive(Debug, Clone)]
pub struct TableReader {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl TableReader {
    pub fn new(sdk: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        TableReader { client: aws_sdk_dynamodb::Client::new(sdk), table: table.into() }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// The tasks among `ids` that exist, read with `BatchGetItem` (100 ids per request, four
    /// requests in flight). `consistent` reads cost twice as much as eventually consistent ones.
    pub async fn get_many(&self, ids: &[TaskId], consistent: bool) -> Result<(HashMap<TaskId, Task>, ReadCost)> {
        let chunks: Vec<&[TaskId]> = ids.chunks(BATCH_GET_MAX).collect();
        let parts: Vec<(Vec<Task>, ReadCost)> = stream::iter(chunks)
            .map(|chunk| self.get_chunk(chunk, consistent))
            .buffer_unordered(IN_FLIGHT)
            .try_collect()
            .await?;
        let mut found = HashMap::with_capacity(ids.len());
        let mut cost = ReadCost::default();
        for (tasks, c) in parts {
            cost += c;
            for t in tasks {
                found.insert(t.task_id.clone(), t);
            }
        }
        Ok((found, cost))
    }

    async fn get_chunk(&self, ids: &[TaskId], consistent: bool) -> Result<(Vec<Task>, ReadCost)> {
        let keys: Vec<Item> =
            ids.iter().map(|id| Item::from([("TaskId".to_owned(), AttributeValue::S(id.to_string()))])).collect();
        let mut pending = Some(
            KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(consistent)
                .build()
                .context("BatchGetItem keys")?,
        );
        let mut tasks = Vec::with_capacity(ids.len());
        let mut cost = ReadCost::default();
        let mut backoff = Duration::from_millis(50);
        while let Some(ka) = pending.take() {
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.table, ka)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(aws_sdk_dynamodb::Error::from)
                .with_context(|| format!("DynamoDB BatchGetItem on {}", self.table))?;
            cost.requests += 1;
            cost.reported_rcu += out.consumed_capacity().iter().filter_map(|c| c.capacity_units).sum::<f64>();
            for item in out.responses.unwrap_or_default().remove(&self.table).unwrap_or_default() {
                cost.items += 1;
                cost.estimated_rcu += item_rcu(item_size(&item), consistent);
                tasks.push(DynamoStore::from_item(item)?);
            }
            pending = out.unprocessed_keys.unwrap_or_default().remove(&self.table).filter(|k| !k.keys().is_empty());
            if pending.is_some() {
                // Throttled: DynamoDB asks for a retry of what it did not read, with backoff.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
        Ok((tasks, cost))
    }

    /// How many tasks the `ByProcessState` index holds in `state`: a `Select=COUNT` query, one
    /// request per 1 MB of index entries (the index projects a few small attributes, so roughly
    /// 3,000 to 5,000 entries per request); reading index entries costs 0.5 RCU per 4 KB.
    pub async fn count_by_state(&self, state: ProcessState) -> Result<(u64, ReadCost)> {
        let mut count = 0u64;
        let mut cost = ReadCost::default();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(BY_PROCESS_STATE)
                .key_condition_expression("ProcessState = :p")
                .expression_attribute_values(":p", AttributeValue::S(state.to_string()))
                .select(Select::Count)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(aws_sdk_dynamodb::Error::from)
                .with_context(|| format!("DynamoDB Query (Select=COUNT) on {}/{BY_PROCESS_STATE}", self.table))?;
            let n = u64::try_from(out.count).unwrap_or(0);
            count += n;
            cost.requests += 1;
            cost.items += n;
            cost.reported_rcu += out.consumed_capacity().and_then(|c| c.capacity_units).unwrap_or(0.0);
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok((count, cost));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_sizes_count_names_and_values() {
        let item = Item::from([
            ("TaskId".to_owned(), AttributeValue::S("t-1".into())),
            ("Rev".to_owned(), AttributeValue::N("12".into())),
            ("Steps".to_owned(), AttributeValue::L(vec![AttributeValue::Bool(true)])),
        ]);
        // 6 + 3, 3 + 2, 5 + (3 + 1 + 1)
        assert_eq!(item_size(&item), 9 + 5 + 10);
    }

    #[test]
    fn reads_round_up_to_4_kb_and_halve_when_eventually_consistent() {
        assert!((item_rcu(1, true) - 1.0).abs() < f64::EPSILON);
        assert!((item_rcu(4096, true) - 1.0).abs() < f64::EPSILON);
        assert!((item_rcu(4097, true) - 2.0).abs() < f64::EPSILON);
        assert!((item_rcu(4097, false) - 1.0).abs() < f64::EPSILON);
        assert!((item_rcu(0, false) - 0.5).abs() < f64::EPSILON);
    }

    #[test]
    fn costs_add_up() {
        let mut c = ReadCost { requests: 1, items: 100, reported_rcu: 50.0, estimated_rcu: 50.0 };
        c += ReadCost { requests: 2, items: 3, reported_rcu: 0.0, estimated_rcu: 1.5 };
        assert_eq!((c.requests, c.items), (3, 103));
        assert!((c.estimated_rcu - 51.5).abs() < f64::EPSILON);
    }
}
