//! The in-memory twin of the message bus. Queues keep SQS's semantics that the protocol relies
//! on: a message is delivered at least once; it becomes visible after its delay; a received
//! message is hidden for the visibility timeout and delivered again unless deleted; after
//! `max_receives` receives it moves to the queue's DLQ; a FIFO queue drops a repeated
//! deduplication id, and delivers a message group's messages in order, none of a group while one of
//! its messages is in flight (received, neither deleted nor back after its visibility timeout). Sending to a queue that was never created fails, as on SQS. The topic keeps
//! every publication and copies it to subscribed queues (raw delivery). Time comes from a
//! [`Clock`], so a test can move it by hand.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;

use super::{batch_outcome, Bus, BusError, Outgoing, Publication, Received, MAX_BATCH};
use crate::clock::Clock;
use crate::config::Resources;
use crate::ids::Millis;

/// How a queue treats messages that keep failing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueConfig {
    /// Where a message goes on the receive after `max_receives` (None: it stays forever).
    pub dlq: Option<String>,
    pub max_receives: u32,
}

#[derive(Debug, Clone)]
struct Stored {
    id: String,
    body: String,
    attributes: Vec<(String, String)>,
    visible_at: Millis,
    sent_at: Millis,
    trace_header: Option<String>,
    receive_count: u32,
    receipt: Option<String>,
    /// Its FIFO message group.
    group: Option<String>,
}

#[derive(Debug, Default)]
struct Queue {
    config: QueueConfig,
    messages: VecDeque<Stored>,
    dedup: HashSet<String>,
}

impl Queue {
    /// The FIFO groups with a message in flight (received, neither deleted nor back yet), with
    /// when the last of them is back: none of a held group's messages is delivered before.
    fn held_groups(&self, now: Millis) -> HashMap<&str, Millis> {
        let mut held: HashMap<&str, Millis> = HashMap::new();
        for m in self.messages.iter().filter(|m| m.receipt.is_some() && m.visible_at > now) {
            if let Some(g) = &m.group {
                let until = held.entry(g.as_str()).or_insert(m.visible_at);
                *until = (*until).max(m.visible_at);
            }
        }
        held
    }
}

#[derive(Debug, Default)]
struct Inner {
    queues: BTreeMap<String, Queue>,
    subscribers: BTreeMap<String, Vec<String>>,
    published: Vec<(String, Publication)>,
    /// Injected failures for sends to a queue (or "*" for any).
    send_failures: BTreeMap<String, u32>,
    /// Injected failures for the next send of a message with this body (one entry of a batch).
    body_failures: BTreeMap<String, u32>,
    /// Queues that refuse every send for good, with the SQS error code they answer.
    refusing: BTreeMap<String, String>,
    /// Injected failures of whole requests to a queue (or "*"): a SendMessage, or a
    /// SendMessageBatch whose every entry then fails (throttling, a network failure, the SDK's
    /// retries exhausted).
    request_failures: BTreeMap<String, u32>,
    next_id: u64,
    requests: BTreeMap<&'static str, u64>,
}

/// The in-memory implementation of [`Bus`]. Clones share the same queues.
#[derive(Debug, Clone)]
pub struct MemoryBus {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
}

impl MemoryBus {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryBus { inner: Arc::default(), clock }
    }

    /// A bus with the stack's queues as the template makes them: each with its DLQ, messages moved
    /// there after 3 receives (5 for the scheduler queue, whose messages are cheap to retry).
    pub fn for_stack(clock: Arc<dyn Clock>, res: &Resources) -> Self {
        let bus = MemoryBus::new(clock);
        for (queue, receives) in [
            (&res.submission_queue_url, 3),
            (&res.scheduler_queue_url, 5),
            (&res.agent_queue_url, 3),
            (&res.supervisor_queue_url, 3),
        ]
        .into_iter()
        .chain(res.ends_queue_url.as_ref().map(|q| (q, 5)))
        {
            let dlq = Self::dlq_of(queue);
            bus.create_queue(&dlq, QueueConfig::default());
            bus.create_queue(queue, QueueConfig { dlq: Some(dlq), max_receives: receives });
        }
        if let Some(queue) = &res.callback_queue_url {
            let dlq = res.callback_dlq_url.clone().unwrap_or_else(|| format!("{queue}-dlq"));
            bus.create_queue(&dlq, QueueConfig::default());
            bus.create_queue(queue, QueueConfig { dlq: Some(dlq), max_receives: 3 });
        }
        bus.create_queue(&res.submission_dlq_url, QueueConfig::default());
        bus
    }

    /// The DLQ [`MemoryBus::for_stack`] gives `queue`: `<queue>-dlq`, or `<name>-dlq.fifo` for a
    /// FIFO queue (SQS redrives a FIFO queue only to a FIFO queue).
    pub fn dlq_of(queue: &str) -> String {
        match queue.strip_suffix(".fifo") {
            Some(base) => format!("{base}-dlq.fifo"),
            None => format!("{queue}-dlq"),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn create_queue(&self, url: &str, config: QueueConfig) {
        self.lock().queues.entry(url.to_owned()).or_default().config = config;
    }

    /// Copy every publication on `topic` to `queue` (raw message delivery).
    pub fn subscribe(&self, topic: &str, queue: &str) {
        self.lock().subscribers.entry(topic.to_owned()).or_default().push(queue.to_owned());
    }

    /// Make the next `n` sends to `queue` (or to any queue, with `"*"`) fail.
    pub fn fail_sends(&self, queue: &str, n: u32) {
        *self.lock().send_failures.entry(queue.to_owned()).or_default() += n;
    }

    /// Make the next send of a message whose body is `body` fail, alone or as one entry of a
    /// batch (the batch's other entries are sent).
    pub fn fail_send_of(&self, body: &str) {
        *self.lock().body_failures.entry(body.to_owned()).or_default() += 1;
    }

    /// Make every send to `queue` fail for good with SQS's error `code` (e.g. `AccessDenied`,
    /// `KMS.AccessDeniedException`), as a queue the sender may not write to does.
    pub fn refuse_sends(&self, queue: &str, code: &str) {
        self.lock().refusing.insert(queue.to_owned(), code.to_owned());
    }

    /// Make the next `n` requests to `queue` (or to any queue, with `"*"`) fail as a whole: a
    /// plain send, or a batch of up to [`MAX_BATCH`] entries that all fail with it.
    pub fn fail_requests(&self, queue: &str, n: u32) {
        *self.lock().request_failures.entry(queue.to_owned()).or_default() += n;
    }

    /// Forget every injected send failure not used yet.
    pub fn clear_send_failures(&self) {
        let mut inner = self.lock();
        inner.send_failures.clear();
        inner.body_failures.clear();
        inner.request_failures.clear();
    }

    /// Whether the request about to go to `queue` fails as a whole (and uses up the injection).
    fn request_fails(inner: &mut Inner, queue: &str) -> bool {
        for key in [queue, "*"] {
            if let Some(n) = inner.request_failures.get_mut(key).filter(|n| **n > 0) {
                *n -= 1;
                return true;
            }
        }
        false
    }

    fn request_error(op: &'static str, queue: &str) -> BusError {
        BusError::Backend { op, target: queue.to_owned(), message: "injected request failure".into(), source: None }
    }

    /// The bodies of every message in `queue`, visible or not, oldest first.
    pub fn bodies(&self, queue: &str) -> Vec<String> {
        self.lock().queues.get(queue).map(|q| q.messages.iter().map(|m| m.body.clone()).collect()).unwrap_or_default()
    }

    /// The message attributes of every message in `queue`, oldest first.
    pub fn attributes(&self, queue: &str) -> Vec<Vec<(String, String)>> {
        self.lock()
            .queues
            .get(queue)
            .map(|q| q.messages.iter().map(|m| m.attributes.clone()).collect())
            .unwrap_or_default()
    }

    /// Remove and return every message in `queue`, visible or not.
    pub fn take(&self, queue: &str) -> Vec<String> {
        self.lock().queues.get_mut(queue).map(|q| q.messages.drain(..).map(|m| m.body).collect()).unwrap_or_default()
    }

    /// When the next message of `queue` becomes visible (now or later), if it holds any.
    pub fn next_visible(&self, queue: &str) -> Option<Millis> {
        let inner = self.lock();
        let q = inner.queues.get(queue)?;
        // A held group's messages are not due before its message in flight is back (or deleted,
        // which happens at a step of its own).
        let held = q.held_groups(self.clock.now());
        q.messages
            .iter()
            .map(|m| match m.group.as_deref().and_then(|g| held.get(g)) {
                Some(until) => m.visible_at.max(*until),
                None => m.visible_at,
            })
            .min()
    }

    /// Messages in `queue`, visible or not.
    pub fn depth(&self, queue: &str) -> usize {
        self.lock().queues.get(queue).map_or(0, |q| q.messages.len())
    }

    /// Everything published, with its topic.
    pub fn published(&self) -> Vec<(String, Publication)> {
        self.lock().published.clone()
    }

    /// Requests served, by kind (`"send"`, `"send_batch"`, `"publish"`, `"receive"`, `"delete"`).
    pub fn requests(&self, kind: &str) -> u64 {
        self.lock().requests.get(kind).copied().unwrap_or(0)
    }

    fn count(inner: &mut Inner, kind: &'static str) {
        *inner.requests.entry(kind).or_default() += 1;
    }

    fn enqueue(&self, inner: &mut Inner, queue: &str, msg: Outgoing) -> Result<(), BusError> {
        let unavailable = |message: &str| BusError::Backend {
            op: "SendMessage",
            target: queue.to_owned(),
            message: message.to_owned(),
            source: None,
        };
        for key in [queue, "*"] {
            if let Some(n) = inner.send_failures.get_mut(key).filter(|n| **n > 0) {
                *n -= 1;
                return Err(unavailable("injected failure"));
            }
        }
        if let Some(n) = inner.body_failures.get_mut(&msg.body).filter(|n| **n > 0) {
            *n -= 1;
            return Err(unavailable("injected failure"));
        }
        let id = {
            inner.next_id += 1;
            format!("m-{}", inner.next_id)
        };
        let refused = |code: &str, message: String| BusError::Refused {
            op: "SendMessage",
            target: queue.to_owned(),
            code: code.to_owned(),
            message,
        };
        if let Some(code) = inner.refusing.get(queue) {
            return Err(refused(code, "refused (injected)".into()));
        }
        #[allow(clippy::case_sensitive_file_extension_comparisons)]
        if msg.fifo.is_none() && queue.ends_with(".fifo") {
            return Err(refused("MissingParameter", "a FIFO queue needs a MessageGroupId".into()));
        }
        if let Some(f) = &msg.fifo {
            // SQS: 1-128 characters of letters, digits and punctuation.
            for (what, id) in [("MessageGroupId", &f.group), ("MessageDeduplicationId", &f.dedup)] {
                if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(refused("InvalidParameterValue", format!("{what} must be 1-128 characters: {id}")));
                }
            }
        }
        let now = self.clock.now();
        let q = inner.queues.get_mut(queue).ok_or_else(|| BusError::NoSuchQueue { queue: queue.to_owned() })?;
        if let Some(f) = &msg.fifo {
            if !q.dedup.insert(f.dedup.clone()) {
                return Ok(());
            }
        }
        let delay = if msg.fifo.is_some() { 0 } else { u64::from(msg.delay_seconds) * 1000 };
        q.messages.push_back(Stored {
            id,
            body: msg.body,
            attributes: msg.attributes,
            visible_at: now.plus_ms(delay),
            sent_at: now,
            trace_header: msg.trace_header,
            receive_count: 0,
            receipt: None,
            group: msg.fifo.map(|f| f.group),
        });
        Ok(())
    }

    fn receive_now(&self, queue: &str, max: usize, visibility: Duration) -> Result<Vec<Received>, BusError> {
        let now = self.clock.now();
        let mut inner = self.lock();
        Self::count(&mut inner, "receive");
        inner.next_id += 1;
        let round = inner.next_id;
        let q = inner.queues.get_mut(queue).ok_or_else(|| BusError::Backend {
            op: "ReceiveMessage",
            target: queue.to_owned(),
            message: "AWS.SimpleQueueService.NonExistentQueue".into(),
            source: None,
        })?;
        let (dlq, max_receives) = (q.config.dlq.clone(), q.config.max_receives);
        let busy: HashSet<String> = q.held_groups(now).into_keys().map(str::to_owned).collect();
        let mut out = Vec::new();
        let mut to_dlq = Vec::new();
        let mut i = 0;
        while i < q.messages.len() && out.len() < max.clamp(1, MAX_BATCH) {
            let m = &mut q.messages[i];
            if m.visible_at > now || m.group.as_ref().is_some_and(|g| busy.contains(g)) {
                i += 1;
                continue;
            }
            if dlq.is_some() && max_receives > 0 && m.receive_count >= max_receives {
                to_dlq.push(q.messages.remove(i).expect("index is in range"));
                continue;
            }
            m.receive_count += 1;
            m.visible_at = now.plus_ms(u64::try_from(visibility.as_millis()).unwrap_or(u64::MAX));
            let receipt = format!("{}-r{round}", m.id);
            m.receipt = Some(receipt.clone());
            out.push(Received {
                message_id: m.id.clone(),
                receipt,
                body: m.body.clone(),
                receive_count: m.receive_count,
                sent_at: Some(m.sent_at),
                trace_header: m.trace_header.clone(),
            });
            i += 1;
        }
        if let Some(dlq) = dlq {
            if let Some(d) = inner.queues.get_mut(&dlq) {
                for mut m in to_dlq {
                    m.visible_at = now;
                    m.receipt = None;
                    m.receive_count = 0;
                    d.messages.push_back(m);
                }
            }
        }
        Ok(out)
    }

    async fn receive_waiting(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>, BusError> {
        let started = std::time::Instant::now();
        loop {
            let got = self.receive_now(queue, max, visibility)?;
            if !got.is_empty() || started.elapsed() >= wait {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(5).min(wait)).await;
        }
    }
}

impl Bus for MemoryBus {
    fn send<'a>(&'a self, queue: &'a str, msg: Outgoing) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Self::count(&mut inner, "send");
            if Self::request_fails(&mut inner, queue) {
                return Err(Self::request_error("SendMessage", queue));
            }
            self.enqueue(&mut inner, queue, msg)
        })
    }

    fn send_batch<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move { batch_outcome(self.send_entries(queue, msgs).await) })
    }

    /// One `"send_batch"` request per chunk of [`MAX_BATCH`]; each entry fails or succeeds on its
    /// own, as on SQS, unless the chunk's request fails as a whole (see
    /// [`MemoryBus::fail_requests`]).
    fn send_entries<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Vec<Result<(), BusError>>> {
        Box::pin(async move {
            let mut inner = self.lock();
            let mut out = Vec::with_capacity(msgs.len());
            let mut request_failed = false;
            for (i, m) in msgs.into_iter().enumerate() {
                if i % MAX_BATCH == 0 {
                    Self::count(&mut inner, "send_batch");
                    request_failed = Self::request_fails(&mut inner, queue);
                }
                if request_failed {
                    out.push(Err(Self::request_error("SendMessageBatch", queue)));
                } else {
                    out.push(self.enqueue(&mut inner, queue, m));
                }
            }
            out
        })
    }

    fn publish<'a>(&'a self, topic: &'a str, note: Publication) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Self::count(&mut inner, "publish");
            for key in [topic, "*"] {
                if let Some(n) = inner.send_failures.get_mut(key).filter(|n| **n > 0) {
                    *n -= 1;
                    return Err(BusError::Backend {
                        op: "Publish",
                        target: topic.to_owned(),
                        message: "injected failure".into(),
                        source: None,
                    });
                }
            }
            inner.published.push((topic.to_owned(), note.clone()));
            for q in inner.subscribers.get(topic).cloned().unwrap_or_default() {
                let msg =
                    Outgoing { body: note.message.clone(), attributes: note.attributes.clone(), ..Outgoing::default() };
                self.enqueue(&mut inner, &q, msg)?;
            }
            Ok(())
        })
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<Vec<Received>, BusError>> {
        Box::pin(self.receive_waiting(queue, max, wait, visibility))
    }

    fn delete<'a>(&'a self, queue: &'a str, receipts: Vec<String>) -> BoxFuture<'a, Result<(), BusError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Self::count(&mut inner, "delete");
            if let Some(q) = inner.queues.get_mut(queue) {
                q.messages.retain(|m| m.receipt.as_ref().is_none_or(|r| !receipts.contains(r)));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Fifo;
    use crate::clock::ManualClock;

    const Q: &str = "mem://q";
    const DLQ: &str = "mem://q-dlq";

    fn bus() -> (MemoryBus, ManualClock) {
        let clock = ManualClock::at(Millis(1_000));
        let bus = MemoryBus::new(Arc::new(clock.clone()));
        bus.create_queue(DLQ, QueueConfig::default());
        bus.create_queue(Q, QueueConfig { dlq: Some(DLQ.into()), max_receives: 2 });
        (bus, clock)
    }

    fn recv(bus: &MemoryBus) -> Vec<Received> {
        futures::executor::block_on(bus.receive(Q, 10, Duration::ZERO, Duration::from_secs(30))).unwrap()
    }

    #[test]
    fn delayed_messages_appear_when_due() {
        let (bus, clock) = bus();
        futures::executor::block_on(bus.send(Q, Outgoing::delayed("later".into(), 5))).unwrap();
        assert!(recv(&bus).is_empty());
        clock.advance(5_000);
        assert_eq!(recv(&bus)[0].body, "later");
    }

    #[test]
    fn unacknowledged_messages_come_back_then_go_to_the_dlq() {
        let (bus, clock) = bus();
        futures::executor::block_on(bus.send(Q, Outgoing::new("poison".into()))).unwrap();
        let first = recv(&bus);
        assert_eq!(first[0].receive_count, 1);
        assert!(recv(&bus).is_empty(), "hidden for the visibility timeout");
        clock.advance(30_000);
        assert_eq!(recv(&bus)[0].receive_count, 2, "delivered again");
        clock.advance(30_000);
        assert!(recv(&bus).is_empty(), "the third receive moves it to the DLQ instead");
        assert_eq!(bus.bodies(DLQ), vec!["poison"]);
    }

    #[test]
    fn deleted_messages_are_gone_and_stale_receipts_do_nothing() {
        let (bus, clock) = bus();
        futures::executor::block_on(bus.send(Q, Outgoing::new("m".into()))).unwrap();
        let r1 = recv(&bus);
        clock.advance(30_000);
        let r2 = recv(&bus);
        futures::executor::block_on(bus.delete(Q, vec![r1[0].receipt.clone()])).unwrap();
        assert_eq!(bus.depth(Q), 1, "the first receipt is stale");
        futures::executor::block_on(bus.delete(Q, vec![r2[0].receipt.clone()])).unwrap();
        assert_eq!(bus.depth(Q), 0);
    }

    #[test]
    fn a_fifo_group_is_delivered_in_order_and_not_while_one_of_its_messages_is_in_flight() {
        let (bus, clock) = bus();
        let send = |group: &str, body: &str| {
            let fifo = Some(Fifo { group: group.into(), dedup: body.into() });
            futures::executor::block_on(bus.send(Q, Outgoing { fifo, ..Outgoing::new(body.into()) })).unwrap();
        };
        for (g, b) in [("g", "g1"), ("g", "g2"), ("h", "h1")] {
            send(g, b);
        }
        let take = |max: usize| -> Vec<Received> {
            futures::executor::block_on(bus.receive(Q, max, Duration::ZERO, Duration::from_secs(30))).unwrap()
        };
        let bodies = |r: &[Received]| r.iter().map(|m| m.body.clone()).collect::<Vec<_>>();
        let first = take(1);
        assert_eq!(bodies(&first), ["g1"]);
        let h = take(10);
        assert_eq!(bodies(&h), ["h1"], "g2 waits behind g1, in flight");
        futures::executor::block_on(bus.delete(Q, vec![h[0].receipt.clone()])).unwrap();
        // nothing can come before g1 is back (a simulator waiting for the queue must not spin)
        let back = clock.now().plus_ms(30_000);
        assert_eq!(bus.next_visible(Q), Some(back), "g2 is visible but held until g1 is back");
        // g1 not deleted: back after its visibility timeout, still ahead of g2
        clock.advance(30_000);
        let again = take(1);
        assert_eq!(bodies(&again), ["g1"]);
        futures::executor::block_on(bus.delete(Q, vec![again[0].receipt.clone()])).unwrap();
        assert_eq!(bodies(&take(10)), ["g2"], "the group goes on once g1 is done");
        // a batch may take several messages of one free group, in order
        send("k", "k1");
        send("k", "k2");
        assert_eq!(bodies(&take(10)), ["k1", "k2"]);
        // standard messages are not held
        futures::executor::block_on(bus.send(Q, Outgoing::new("plain".into()))).unwrap();
        assert_eq!(bodies(&take(10)), ["plain"]);
    }

    #[test]
    fn fifo_deduplicates_and_missing_queues_fail() {
        let (bus, _) = bus();
        let m = Outgoing { fifo: Some(Fifo { group: "g".into(), dedup: "d1".into() }), ..Outgoing::new("a".into()) };
        futures::executor::block_on(bus.send(Q, m.clone())).unwrap();
        futures::executor::block_on(bus.send(Q, m)).unwrap();
        assert_eq!(bus.depth(Q), 1);
        assert!(futures::executor::block_on(bus.send("mem://nope", Outgoing::new("x".into()))).is_err());
    }

    #[test]
    fn a_failed_request_fails_every_entry_of_its_chunk() {
        let (bus, _) = bus();
        bus.fail_requests(Q, 1);
        let msgs = (0..25).map(|i| Outgoing::new(format!("{i}"))).collect();
        let r = futures::executor::block_on(bus.send_entries(Q, msgs));
        assert_eq!(r.iter().filter(|e| e.is_err()).count(), 10, "the first chunk's request failed: all its entries");
        assert!(r[..10].iter().all(Result::is_err) && r[10..].iter().all(Result::is_ok));
        assert_eq!(bus.depth(Q), 15);
        bus.fail_requests("*", 1);
        assert!(futures::executor::block_on(bus.send(Q, Outgoing::new("x".into()))).is_err());
        futures::executor::block_on(bus.send(Q, Outgoing::new("y".into()))).unwrap();
        assert_eq!(bus.depth(Q), 16);
    }

    #[test]
    fn a_failed_batch_entry_does_not_stop_the_rest() {
        let (bus, _) = bus();
        bus.fail_sends(Q, 1);
        let msgs = (0..25).map(|i| Outgoing::new(format!("{i}"))).collect();
        let r = futures::executor::block_on(bus.send_batch(Q, msgs));
        assert!(matches!(r, Err(BusError::Batch { failed: 1, total: 25, .. })), "{r:?}");
        assert_eq!(bus.depth(Q), 24);
        assert_eq!(bus.requests("send_batch"), 3);
    }
}
