//! Pages of a task listing for `sasctl ui`, read through the table's two sparse indexes and never
//! a scan:
//! - ended tasks (`Processed`, `Compensated`, `Cancelled`, `Error`...): one `Query` of `ByEnd` per
//!   shard, newest first, each asking for one row more than a page from where the page starts
//!   (`UpdatedAt <=` the cursor), merged; the workflow filter is a `FilterExpression` on the
//!   projected `WorkflowRef` (a shard's query goes on while too few rows pass it), the time filter
//!   a bound of the key condition;
//! - tasks in flight: the keys of `ByCompleteBy` from the cursor on (keys only: a few dozen bytes
//!   a task), most overdue first, then `BatchGetItem` of as many as the page shows.
//!
//! So a page of 50 ended tasks costs `shards` requests however many tasks the table holds
//! (`docs/operate/console.md` has the figures on 10,000).

use std::collections::HashMap;

use anyhow::{bail, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use sas_core::store::{ended_row, TaskSummary, BY_COMPLETE_BY, BY_END};
use sas_protocol::ids::{Millis, TaskId};
use sas_protocol::protocol::{ProcessState, Task};

use crate::table::TableReader;

type Item = HashMap<String, AttributeValue>;

/// Where a page starts: after the row with this sort key (`UpdatedAt` for ended tasks, `CompleteBy`
/// for tasks in flight) and id. Written in links as `<millis>.<task id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at: Millis,
    pub task_id: TaskId,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}.{}", self.at.0, self.task_id)
    }

    pub fn parse(s: &str) -> Result<Self> {
        let Some((at, id)) = s.split_once('.') else { bail!("a cursor is <millis>.<task id>") };
        Ok(Cursor { at: Millis(at.parse()?), task_id: TaskId::try_from(id)? })
    }
}

/// Which tasks, from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// An ended state, or `None` for every task in flight (a state in flight narrows them).
    pub state: Option<ProcessState>,
    pub workflow: Option<String>,
    /// Ended tasks: ended at or after this instant. Tasks in flight: created at or after it.
    pub since: Option<Millis>,
    pub after: Option<Cursor>,
    pub page: usize,
}

/// One page and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub rows: Vec<TaskSummary>,
    pub next: Option<Cursor>,
    /// DynamoDB requests made for this page (`Query`, `BatchGetItem`).
    pub requests: u64,
    /// Index entries read (keys, or projected rows).
    pub index_rows: u64,
}

/// The `ByEnd` ordering of a listing: newest first, then by id (descending), so ties of one
/// millisecond page in a stable order.
fn ended_order(a: &TaskSummary, b: &TaskSummary) -> std::cmp::Ordering {
    (b.updated_at, &b.task_id).cmp(&(a.updated_at, &a.task_id))
}

/// Whether `row` comes after `cursor` in [`ended_order`].
fn after_ended(row: &TaskSummary, cursor: Option<&Cursor>) -> bool {
    cursor.is_none_or(|c| (row.updated_at, &row.task_id) < (c.at, &c.task_id))
}

/// Whether a key of `ByCompleteBy` comes after `cursor` (ascending `CompleteBy`, then id).
fn after_in_flight(at: Millis, id: &TaskId, cursor: Option<&Cursor>) -> bool {
    cursor.is_none_or(|c| (at, id) > (c.at, &c.task_id))
}

impl TableReader {
    /// One page of tasks (see the module's doc).
    pub async fn page(&self, q: &Query) -> Result<Page> {
        match q.state {
            Some(s) if s.is_terminal() => self.ended_page(s, q).await,
            _ => self.in_flight_page(q).await,
        }
    }

    /// Every shard's rows from the cursor on, queried at once, merged newest first.
    async fn ended_page(&self, state: ProcessState, q: &Query) -> Result<Page> {
        let shards = (0..self.shards().max(1)).map(|shard| self.ended_rows(state, shard, q));
        let (mut rows, mut requests, mut index_rows) = (Vec::new(), 0u64, 0u64);
        for (r, n, i) in futures::future::try_join_all(shards).await? {
            rows.extend(r);
            requests += n;
            index_rows += i;
        }
        rows.sort_by(ended_order);
        let next = (rows.len() > q.page).then(|| {
            let last = &rows[q.page - 1];
            Cursor { at: last.updated_at, task_id: last.task_id.clone() }
        });
        rows.truncate(q.page);
        Ok(Page { rows, next, requests, index_rows })
    }

    /// One shard's rows of `ByEnd` after the cursor, at most one more than a page (and what that
    /// cost: requests, index entries read).
    async fn ended_rows(&self, state: ProcessState, shard: u32, q: &Query) -> Result<(Vec<TaskSummary>, u64, u64)> {
        let want = q.page + 1;
        let (mut rows, mut requests, mut index_rows) = (Vec::new(), 0u64, 0u64);
        let mut key = "EndShard = :k".to_owned();
        let mut values: Item = HashMap::from([(":k".to_owned(), AttributeValue::S(format!("{state}#{shard}")))]);
        match (q.since, &q.after) {
            (Some(since), Some(c)) => {
                key.push_str(" AND UpdatedAt BETWEEN :lo AND :hi");
                values.insert(":lo".into(), AttributeValue::N(since.0.to_string()));
                values.insert(":hi".into(), AttributeValue::N(c.at.0.to_string()));
            }
            (Some(since), None) => {
                key.push_str(" AND UpdatedAt >= :lo");
                values.insert(":lo".into(), AttributeValue::N(since.0.to_string()));
            }
            (None, Some(c)) => {
                key.push_str(" AND UpdatedAt <= :hi");
                values.insert(":hi".into(), AttributeValue::N(c.at.0.to_string()));
            }
            (None, None) => {}
        }
        let filter = q.workflow.as_ref().map(|w| {
            values.insert(":wf".into(), AttributeValue::S(format!("{w}@")));
            "begins_with(WorkflowRef, :wf)"
        });
        let mut start = None;
        loop {
            let out = self
                .client()
                .query()
                .table_name(self.table())
                .index_name(BY_END)
                .key_condition_expression(&key)
                .set_filter_expression(filter.map(str::to_owned))
                .set_expression_attribute_values(Some(values.clone()))
                .scan_index_forward(false)
                // the cursor's own row comes back too (`<=`): one more, so one request is enough
                .limit(i32::try_from((want + usize::from(q.after.is_some())).min(1000)).unwrap_or(1000))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(aws_sdk_dynamodb::Error::from)?;
            requests += 1;
            index_rows += u64::try_from(out.scanned_count).unwrap_or(0);
            for item in out.items.unwrap_or_default() {
                let row = ended_row(item)?;
                if after_ended(&row, q.after.as_ref()) {
                    rows.push(row);
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() || rows.len() >= want {
                break;
            }
        }
        Ok((rows, requests, index_rows))
    }

    async fn in_flight_page(&self, q: &Query) -> Result<Page> {
        let (mut requests, mut index_rows) = (0u64, 0u64);
        let mut keys: Vec<(Millis, TaskId)> = Vec::new();
        for shard in 0..self.shards().max(1) {
            let mut values: Item = HashMap::from([(":s".to_owned(), AttributeValue::S(shard.to_string()))]);
            // Shard is a reserved word of DynamoDB's expressions
            let mut key = "#s = :s".to_owned();
            if let Some(c) = &q.after {
                key.push_str(" AND CompleteBy >= :c");
                values.insert(":c".into(), AttributeValue::N(c.at.0.to_string()));
            }
            let mut start = None;
            loop {
                let out = self
                    .client()
                    .query()
                    .table_name(self.table())
                    .index_name(BY_COMPLETE_BY)
                    .key_condition_expression(&key)
                    .expression_attribute_names("#s", "Shard")
                    .set_expression_attribute_values(Some(values.clone()))
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(aws_sdk_dynamodb::Error::from)?;
                requests += 1;
                for item in out.items.unwrap_or_default() {
                    index_rows += 1;
                    let id = match item.get("TaskId") {
                        Some(AttributeValue::S(s)) => TaskId::try_from(s.as_str())?,
                        _ => continue,
                    };
                    let at = match item.get("CompleteBy") {
                        Some(AttributeValue::N(n)) => Millis(n.parse()?),
                        _ => continue,
                    };
                    if after_in_flight(at, &id, q.after.as_ref()) {
                        keys.push((at, id));
                    }
                }
                start = out.last_evaluated_key;
                if start.is_none() {
                    break;
                }
            }
        }
        keys.sort();
        let mut rows = Vec::new();
        let mut last_read = None;
        // read the items a page at a time until the page is full (a state, workflow or time
        // filter may pass only some)
        for chunk in keys.chunks(q.page.clamp(1, crate::table::BATCH_GET_MAX)) {
            let ids: Vec<TaskId> = chunk.iter().map(|(_, id)| id.clone()).collect();
            // one BatchGetItem (a page is at most 100 keys; unprocessed keys are asked again)
            let tasks: HashMap<TaskId, Task> =
                self.store().get_items(&ids).await?.into_iter().map(|t| (t.task_id.clone(), t)).collect();
            requests += 1;
            for (at, id) in chunk {
                last_read = Some(Cursor { at: *at, task_id: id.clone() });
                let Some(t) = tasks.get(id) else { continue };
                let keep = q.state.is_none_or(|s| s == t.process_state)
                    && !t.process_state.is_terminal()
                    && q.workflow.as_ref().is_none_or(|w| *w == t.workflow.name)
                    && q.since.is_none_or(|s| t.created_at >= s);
                if keep {
                    rows.push(TaskSummary::of(t));
                    if rows.len() == q.page {
                        break;
                    }
                }
            }
            if rows.len() == q.page {
                break;
            }
        }
        let more =
            last_read.as_ref().is_some_and(|c| keys.last().is_some_and(|(at, id)| (at, id) != (&c.at, &c.task_id)));
        let next = if more { last_read } else { None };
        Ok(Page { rows, next, requests, index_rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, at: u64) -> TaskSummary {
        TaskSummary {
            task_id: TaskId::try_from(id).unwrap(),
            process_state: ProcessState::Processed,
            workflow_name: None,
            current_step: None,
            failure_count: 0,
            reason: None,
            created_at: None,
            updated_at: Millis(at),
        }
    }

    #[test]
    fn a_cursor_is_written_in_links_and_read_back() {
        let c = Cursor { at: Millis(1_700_000_000_123), task_id: TaskId::try_from("order-7.b").unwrap() };
        assert_eq!(Cursor::parse(&c.encode()).unwrap(), c);
        assert!(Cursor::parse("nope").is_err());
        assert!(Cursor::parse("12x.order").is_err());
    }

    #[test]
    fn ended_rows_page_newest_first_and_ties_of_one_millisecond_by_id() {
        let mut rows = [row("a", 5), row("c", 7), row("b", 7), row("d", 9)];
        rows.sort_by(ended_order);
        let ids: Vec<&str> = rows.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(ids, ["d", "c", "b", "a"]);
        // a page that ended at c goes on with b (same millisecond), then a; never c or d again
        let c = Cursor { at: Millis(7), task_id: TaskId::try_from("c").unwrap() };
        let rest: Vec<&str> = rows.iter().filter(|r| after_ended(r, Some(&c))).map(|r| r.task_id.as_str()).collect();
        assert_eq!(rest, ["b", "a"]);
    }

    #[test]
    fn tasks_in_flight_page_most_overdue_first() {
        let c = Cursor { at: Millis(7), task_id: TaskId::try_from("b").unwrap() };
        assert!(!after_in_flight(Millis(7), &TaskId::try_from("a").unwrap(), Some(&c)));
        assert!(!after_in_flight(Millis(7), &TaskId::try_from("b").unwrap(), Some(&c)));
        assert!(after_in_flight(Millis(7), &TaskId::try_from("c").unwrap(), Some(&c)));
        assert!(after_in_flight(Millis(8), &TaskId::try_from("a").unwrap(), Some(&c)));
        assert!(after_in_flight(Millis(1), &TaskId::try_from("a").unwrap(), None));
    }
}
