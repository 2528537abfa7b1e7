//! Client-side batching of sends, like the AWS SDK for Java's `AmazonSQSBufferedAsyncClient`: a
//! SendMessageBatch of up to 10 messages costs one SQS request, as one SendMessage does.
//!
//! [`BufferedBus`] wraps another [`Bus`]. Each [`Bus::send`] joins its queue's open buffer and
//! waits for the outcome of its own message. The first message opens the buffer; the buffer is
//! sent when it holds [`MAX_BATCH`] messages, when the next message would take it over
//! [`MAX_BATCH_BYTES`], or when the linger has passed since it opened. A buffer of one message
//! goes as a plain SendMessage. Everything else (batches, publications, receives, deletes)
//! passes straight through.
//!
//! The sends run in spawned tasks, not in the callers' futures: a caller that stops waiting
//! (its future dropped) neither loses nor delays the others' messages; its own message, already
//! handed over, is still sent. Entries go in the order they were added, and a buffer holding
//! FIFO messages is sent only after the queue's previous buffer is answered, so the messages of
//! one FIFO group keep their order across buffers.
//!
//! Outside a tokio runtime (nothing to spawn on) and with a linger of 0, sends pass straight
//! through. The linger timer needs the runtime's time driver (`#[tokio::main]`, the Lambda
//! runtime and `#[tokio::test]` have it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::{Bus, BusError, Outgoing, Publication, Received, MAX_BATCH};

/// SQS's limit on the total payload of one SendMessageBatch (every entry's body and attributes).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

/// How long a buffer waits for more messages after its first, unless configured otherwise
/// (`SEND_LINGER_MS`).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(20);

/// What one message counts against [`MAX_BATCH_BYTES`]: its body, and each attribute's name,
/// data type (`String`) and value, as SQS counts them.
pub fn entry_bytes(msg: &Outgoing) -> usize {
    msg.body.len() + msg.attributes.iter().map(|(k, v)| k.len() + "String".len() + v.len()).sum::<usize>()
}

type Outcome = Result<(), BusError>;

struct Entry {
    msg: Outgoing,
    /// Where the caller waits for its message's outcome (gone if the caller stopped waiting).
    reply: oneshot::Sender<Outcome>,
}

/// A buffer still taking messages.
struct Open {
    id: u64,
    entries: Vec<Entry>,
    bytes: usize,
}

#[derive(Default)]
struct QueueState {
    open: Option<Open>,
    /// The last buffer sent to this queue: its id, and a receiver that resolves once its request
    /// is answered (its sender is dropped then, or if the task dies).
    last_flush: Option<(u64, oneshot::Receiver<()>)>,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, QueueState>,
    next_id: u64,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The critical sections only move values around; a panic elsewhere leaves the state usable.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A [`Bus`] that coalesces sends per queue into SendMessageBatch requests. Clones share the
/// buffers.
#[derive(Clone)]
pub struct BufferedBus {
    inner: Arc<dyn Bus>,
    linger: Duration,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for BufferedBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedBus").field("inner", &self.inner).field("linger", &self.linger).finish_non_exhaustive()
    }
}

impl BufferedBus {
    /// Buffer the sends to `inner` for up to `linger` (zero: no buffering).
    pub fn new(inner: Arc<dyn Bus>, linger: Duration) -> Self {
        BufferedBus { inner, linger, state: Arc::default() }
    }

    pub fn linger(&self) -> Duration {
        self.linger
    }

    /// Add `msg` to `queue`'s open buffer (opening one if needed) and start whatever sends that
    /// calls for; the receiver gets the message's outcome.
    fn enqueue(&self, rt: &Handle, queue: &str, msg: Outgoing) -> oneshot::Receiver<Outcome> {
        let (reply, outcome) = oneshot::channel();
        let bytes = entry_bytes(&msg);
        let mut flushes = Vec::new();
        let mut timer = None;
        {
            let mut guard = lock(&self.state);
            let State { queues, next_id } = &mut *guard;
            let q = queues.entry(queue.to_owned()).or_default();
            if q.open.as_ref().is_some_and(|o| !o.entries.is_empty() && o.bytes + bytes > MAX_BATCH_BYTES) {
                if let Some(open) = q.open.take() {
                    flushes.push(self.flush(q, queue, open));
                }
            }
            let open = q.open.get_or_insert_with(|| {
                *next_id += 1;
                timer = Some(*next_id);
                Open { id: *next_id, entries: Vec::with_capacity(MAX_BATCH), bytes: 0 }
            });
            open.entries.push(Entry { msg, reply });
            open.bytes += bytes;
            if open.entries.len() >= MAX_BATCH || open.bytes >= MAX_BATCH_BYTES {
                if let Some(open) = q.open.take() {
                    if timer == Some(open.id) {
                        timer = None;
                    }
                    flushes.push(self.flush(q, queue, open));
                }
            }
        }
        for f in flushes {
            rt.spawn(f);
        }
        if let Some(id) = timer {
            rt.spawn(self.linger_then_flush(queue.to_owned(), id));
        }
        outcome
    }

    /// After the linger, send buffer `id` of `queue` if it is still open.
    fn linger_then_flush(&self, queue: String, id: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move {
            tokio::time::sleep(this.linger).await;
            let flush = {
                let mut guard = lock(&this.state);
                let Some(q) = guard.queues.get_mut(&queue) else { return };
                match q.open.take() {
                    Some(open) if open.id == id => this.flush(q, &queue, open),
                    other => {
                        // Sent already (it filled up); `other` is a later buffer with its own timer.
                        q.open = other;
                        return;
                    }
                }
            };
            flush.await;
        }
    }

    /// The task that sends `open` (taken from `q`, under the lock) and answers its callers.
    fn flush(
        &self,
        q: &mut QueueState,
        queue: &str,
        open: Open,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (done, done_rx) = oneshot::channel::<()>();
        let previous = q.last_flush.replace((open.id, done_rx)).map(|(_, rx)| rx);
        let (inner, state, queue) = (Arc::clone(&self.inner), Arc::clone(&self.state), queue.to_owned());
        async move {
            let id = open.id;
            // FIFO messages keep their group's order only if the previous buffer landed first.
            if open.entries.iter().any(|e| e.msg.fifo.is_some()) {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
            }
            deliver(inner.as_ref(), &queue, open.entries).await;
            drop(done);
            // Forget a queue with nothing pending (reply queues come and go).
            let mut guard = lock(&state);
            if guard
                .queues
                .get(&queue)
                .is_some_and(|q| q.open.is_none() && q.last_flush.as_ref().is_some_and(|(last, _)| *last == id))
            {
                guard.queues.remove(&queue);
            }
        }
    }
}

/// Send `entries` in one request (a plain send for one) and give each caller its outcome.
async fn deliver(inner: &dyn Bus, queue: &str, entries: Vec<Entry>) {
    let (msgs, replies): (Vec<_>, Vec<_>) = entries.into_iter().map(|e| (e.msg, e.reply)).unzip();
    let results = match <[Outgoing; 1]>::try_from(msgs) {
        Ok([only]) => vec![inner.send(queue, only).await],
        Err(msgs) => inner.send_entries(queue, msgs).await,
    };
    let mut results = results.into_iter();
    for reply in replies {
        let outcome = results.next().unwrap_or_else(|| {
            Err(BusError::Backend {
                op: "SendMessageBatch",
                target: queue.to_owned(),
                message: "no outcome for the entry".into(),
                source: None,
            })
        });
        // The caller may have stopped waiting: its message is sent all the same.
        let _ = reply.send(outcome);
    }
}

impl Bus for BufferedBus {
    fn send<'a>(&'a self, queue: &'a str, msg: Outgoing) -> BoxFuture<'a, Result<(), BusError>> {
        if self.linger.is_zero() {
            return self.inner.send(queue, msg);
        }
        Box::pin(async move {
            let Ok(rt) = Handle::try_current() else {
                return self.inner.send(queue, msg).await;
            };
            self.enqueue(&rt, queue, msg).await.unwrap_or_else(|_| {
                Err(BusError::Backend {
                    op: "SendMessage",
                    target: queue.to_owned(),
                    message: "the buffered send was dropped before SQS answered".into(),
                    source: None,
                })
            })
        })
    }

    fn send_batch<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Result<(), BusError>> {
        self.inner.send_batch(queue, msgs)
    }

    fn send_entries<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Vec<Result<(), BusError>>> {
        self.inner.send_entries(queue, msgs)
    }

    fn publish<'a>(&'a self, topic: &'a str, note: Publication) -> BoxFuture<'a, Result<(), BusError>> {
        self.inner.publish(topic, note)
    }

    fn receive<'a>(
        &'a self,
        queue: &'a str,
        max: usize,
        wait: Duration,
        visibility: Duration,
    ) -> BoxFuture<'a, Result<Vec<Received>, BusError>> {
        self.inner.receive(queue, max, wait, visibility)
    }

    fn delete<'a>(&'a self, queue: &'a str, receipts: Vec<String>) -> BoxFuture<'a, Result<(), BusError>> {
        self.inner.delete(queue, receipts)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use futures::future::join_all;
    use futures::FutureExt;

    use super::*;
    use crate::bus::{Fifo, MemoryBus, QueueConfig};
    use crate::clock::ManualClock;
    use crate::ids::Millis;

    const Q: &str = "mem://q";
    const Q2: &str = "mem://q2";
    const LINGER: Duration = Duration::from_millis(30);

    fn buffered(linger: Duration) -> (BufferedBus, MemoryBus) {
        let mem = MemoryBus::new(Arc::new(ManualClock::at(Millis(1_000))));
        mem.create_queue(Q, QueueConfig::default());
        mem.create_queue(Q2, QueueConfig::default());
        (BufferedBus::new(Arc::new(mem.clone()), linger), mem)
    }

    fn msgs(prefix: &str, n: usize) -> Vec<Outgoing> {
        (0..n).map(|i| Outgoing::new(format!("{prefix}{i}"))).collect()
    }

    fn bodies(prefix: &str, n: usize) -> Vec<String> {
        msgs(prefix, n).into_iter().map(|m| m.body).collect()
    }

    async fn send_all(bus: &BufferedBus, queue: &str, msgs: Vec<Outgoing>) -> Vec<Result<(), BusError>> {
        join_all(msgs.into_iter().map(|m| bus.send(queue, m))).await
    }

    #[tokio::test]
    async fn ten_concurrent_sends_make_one_batch_request_in_order() {
        let (bus, mem) = buffered(LINGER);
        let started = Instant::now();
        let r = send_all(&bus, Q, msgs("m", 10)).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (1, 0));
        assert_eq!(mem.bodies(Q), bodies("m", 10));
        assert!(started.elapsed() < LINGER, "a full buffer goes at once, without waiting for the linger");
    }

    #[tokio::test]
    async fn twenty_five_sends_make_three_batches_and_queues_are_batched_apart() {
        let (bus, mem) = buffered(LINGER);
        let r = send_all(&bus, Q, msgs("m", 25)).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (3, 0));
        assert_eq!(mem.bodies(Q), bodies("m", 25));

        let (bus, mem) = buffered(LINGER);
        let both = msgs("a", 4).into_iter().map(|m| (Q, m)).chain(msgs("b", 3).into_iter().map(|m| (Q2, m)));
        let r = join_all(both.map(|(q, m)| bus.send(q, m))).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (2, 0));
        assert_eq!((mem.bodies(Q), mem.bodies(Q2)), (bodies("a", 4), bodies("b", 3)));
    }

    #[tokio::test]
    async fn a_lone_send_goes_after_the_linger_as_a_plain_send() {
        let (bus, mem) = buffered(LINGER);
        let started = Instant::now();
        bus.send(Q, Outgoing::new("alone".into())).await.unwrap();
        assert!(started.elapsed() >= LINGER, "{:?}", started.elapsed());
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (0, 1));
        assert_eq!(mem.bodies(Q), ["alone"]);
    }

    #[tokio::test]
    async fn each_caller_gets_the_outcome_of_its_own_entry() {
        let (bus, mem) = buffered(LINGER);
        mem.fail_send_of("m3");
        let r = send_all(&bus, Q, msgs("m", 10)).await;
        for (i, r) in r.iter().enumerate() {
            assert_eq!(r.is_err(), i == 3, "entry {i}: {r:?}");
        }
        assert_eq!(mem.requests("send_batch"), 1);
        assert_eq!(mem.depth(Q), 9);

        // A request that fails as a whole fails every caller.
        let r = send_all(&bus, "mem://missing", msgs("x", 4)).await;
        assert!(r.iter().all(|r| matches!(r, Err(BusError::NoSuchQueue { .. }))), "{r:?}");
    }

    #[tokio::test]
    async fn a_batch_stays_within_the_payload_limit() {
        let (bus, mem) = buffered(LINGER);
        let big = |c: char| Outgoing::new(c.to_string().repeat(100 * 1024));
        let r = send_all(&bus, Q, vec![big('a'), big('b'), big('c')]).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert!(mem.requests("send_batch") + mem.requests("send") >= 2);
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (1, 1), "a+b together, then c");
        let got: Vec<char> = mem.bodies(Q).iter().filter_map(|b| b.chars().next()).collect();
        assert_eq!(got, ['a', 'b', 'c']);

        // Attributes count too: 2 x (128 KiB - 100) of body plus attributes do not fit together.
        let (bus, mem) = buffered(LINGER);
        let with_attr = |c: char| Outgoing {
            attributes: vec![("k".into(), "v".repeat(100))],
            ..Outgoing::new(c.to_string().repeat(MAX_BATCH_BYTES / 2 - 100))
        };
        let r = send_all(&bus, Q, vec![with_attr('a'), with_attr('b')]).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (0, 2));
    }

    #[tokio::test]
    async fn a_dropped_caller_does_not_stop_the_others() {
        let (bus, mem) = buffered(LINGER);
        // The first caller opens the buffer, then stops waiting.
        assert!(bus.send(Q, Outgoing::new("m0".into())).now_or_never().is_none());
        let r = tokio::time::timeout(LINGER * 20, send_all(&bus, Q, msgs("n", 2)))
            .await
            .expect("the others are answered without the caller that opened the buffer");
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!(mem.bodies(Q), ["m0", "n0", "n1"], "the dropped caller's message was handed over and is sent too");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (1, 0));
    }

    #[tokio::test]
    async fn a_linger_of_zero_sends_each_message_on_its_own() {
        let (bus, mem) = buffered(Duration::ZERO);
        let r = send_all(&bus, Q, msgs("m", 10)).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (0, 10));
        assert_eq!(mem.bodies(Q), bodies("m", 10));
    }

    #[test]
    fn outside_a_runtime_sends_pass_straight_through() {
        let (bus, mem) = buffered(LINGER);
        futures::executor::block_on(bus.send(Q, Outgoing::new("m".into()))).unwrap();
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (0, 1));
    }

    #[tokio::test]
    async fn other_calls_pass_straight_through() {
        let (bus, mem) = buffered(LINGER);
        bus.send_batch(Q, msgs("m", 3)).await.unwrap();
        assert_eq!(mem.requests("send_batch"), 1);
        let got = bus.receive(Q, 10, Duration::ZERO, Duration::from_secs(30)).await.unwrap();
        assert_eq!(got.len(), 3);
        bus.delete(Q, got.into_iter().map(|m| m.receipt).collect()).await.unwrap();
        assert_eq!(mem.depth(Q), 0);
        let note = Publication { subject: "s".into(), message: "m".into(), attributes: vec![] };
        bus.publish("topic", note).await.unwrap();
        assert_eq!(mem.published().len(), 1);
    }

    /// A bus whose first batch request is slow: a later buffer would overtake it.
    #[derive(Debug)]
    struct SlowFirstBatch {
        inner: MemoryBus,
        slowed: AtomicBool,
    }

    impl Bus for SlowFirstBatch {
        fn send<'a>(&'a self, queue: &'a str, msg: Outgoing) -> BoxFuture<'a, Result<(), BusError>> {
            self.inner.send(queue, msg)
        }
        fn send_batch<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Result<(), BusError>> {
            self.inner.send_batch(queue, msgs)
        }
        fn send_entries<'a>(&'a self, queue: &'a str, msgs: Vec<Outgoing>) -> BoxFuture<'a, Vec<Result<(), BusError>>> {
            Box::pin(async move {
                if !self.slowed.swap(true, Ordering::SeqCst) {
                    tokio::time::sleep(LINGER * 4).await;
                }
                self.inner.send_entries(queue, msgs).await
            })
        }
        fn publish<'a>(&'a self, topic: &'a str, note: Publication) -> BoxFuture<'a, Result<(), BusError>> {
            self.inner.publish(topic, note)
        }
        fn receive<'a>(
            &'a self,
            queue: &'a str,
            max: usize,
            wait: Duration,
            visibility: Duration,
        ) -> BoxFuture<'a, Result<Vec<Received>, BusError>> {
            self.inner.receive(queue, max, wait, visibility)
        }
        fn delete<'a>(&'a self, queue: &'a str, receipts: Vec<String>) -> BoxFuture<'a, Result<(), BusError>> {
            self.inner.delete(queue, receipts)
        }
    }

    #[tokio::test]
    async fn fifo_messages_keep_their_order_across_buffers() {
        let (_, mem) = buffered(LINGER);
        let bus =
            BufferedBus::new(Arc::new(SlowFirstBatch { inner: mem.clone(), slowed: AtomicBool::new(false) }), LINGER);
        let fifo = |m: Outgoing| Outgoing { fifo: Some(Fifo { group: "task".into(), dedup: m.body.clone() }), ..m };
        // The first 10 fill a buffer whose request is slow; the 11th goes alone after the linger,
        // and must not overtake them.
        let r = send_all(&bus, Q, msgs("m", 11).into_iter().map(fifo).collect()).await;
        assert!(r.iter().all(Result::is_ok), "{r:?}");
        assert_eq!(mem.bodies(Q), bodies("m", 11));
        assert_eq!((mem.requests("send_batch"), mem.requests("send")), (1, 1));
    }
}
