//! What the operator commands and the load benchmark read from the task table beyond the
//! [`StateStore`](sas_core::store::StateStore) port, which reads one task per request and lists a
//! state without counting it:
//! - [`TableReader::get_many`]: `BatchGetItem`, 100 ids per request (DynamoDB's limit), unprocessed
//!   keys retried;
//! - [`TableReader::count_by_state`]: `Select=COUNT` queries of the `ByEnd` index (ended states).
//!
//! Both return what they cost ([`ReadCost`]): the requests, the items, and the read capacity units
//! DynamoDB reports (`ReturnConsumedCapacity=TOTAL`), or an estimate from the items' sizes when it
//! reports none.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, ReturnConsumedCapacity};
use futures::stream::{self, StreamExt, TryStreamExt};
use sas_core::config::Resources;
use sas_core::store::{item_size, DynamoStore, StateStore};
use sas_protocol::ids::TaskId;
use sas_protocol::protocol::{ProcessState, Task};
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
    store: DynamoStore,
}

impl TableReader {
    pub fn new(sdk: &aws_config::SdkConfig, res: &Resources) -> Self {
        // with the call recorder when SAS_AWS_CALL_LOG is set (the operator policy's check)
        let client = sas_core::aws::dynamodb_client(sdk);
        let store = DynamoStore::new(client.clone(), res.task_table.clone(), res.shards, 0);
        TableReader { client, table: res.task_table.clone(), store }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.client
    }

    pub(crate) fn store(&self) -> &DynamoStore {
        &self.store
    }

    /// The shards of the table's indexes.
    pub fn shards(&self) -> u32 {
        self.store.shards()
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
                tasks.push(self.store.decode(item).await?);
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

    /// How many tasks are in `state`: for ended states a `Select=COUNT` query per shard of the
    /// `ByEnd` index (one request per 1 MB of keys, about 0.5 RCU per 4 KB); for states in flight,
    /// the tasks in flight are read (the `ByCompleteBy` keys, then the items).
    pub async fn count_by_state(&self, state: ProcessState) -> Result<u64> {
        if state.is_terminal() {
            Ok(self.store.count_ended(state).await?)
        } else {
            Ok(self.store.list_by_state(state, usize::MAX).await?.len() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
