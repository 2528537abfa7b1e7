//! What every role needs, built once per process (the composition root), and the error a
//! handler reports for one message.

pub mod transition;

use std::sync::Arc;
use std::time::Duration;

use crate::bus::{AwsBus, BufferedBus, Bus, BusError, Outbox};
use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, Resources, Settings};
use crate::entropy::{Entropy, OsEntropy};
use crate::ids::Millis;
use crate::protocol::Ctx;
use crate::store::{DynamoStore, KeyStore, Limiter, Pacer, PauseStore, Pauses, ScheduleStore, StateStore, StoreError};
use crate::workflow::{WorkflowError, WorkflowRegistry};
use transition::Writer;

/// The ports and settings of a role. Cheap to clone (everything shared is behind an `Arc`).
#[derive(Debug, Clone)]
pub struct Deps {
    /// The task store's reads.
    pub store: Arc<dyn StateStore>,
    /// The task store's writes, which only [`crate::transition`] can make.
    pub writer: Writer,
    /// The agents' concurrency limits (leases in the task table; see [`crate::limit`]).
    pub limiter: Arc<dyn Limiter>,
    /// The agents' rates (items in the task table; see [`crate::limit`]).
    pub pacer: Arc<dyn Pacer>,
    /// The operators' pauses of workflows (one item in the task table), and what this process
    /// last read of it (see [`Deps::paused`]).
    pub pauses: Arc<dyn PauseStore>,
    pub pause_cache: Arc<std::sync::Mutex<Option<(Millis, Pauses)>>>,
    /// The schedules (one item in the task table; see [`crate::schedules`]).
    pub schedules: Arc<dyn ScheduleStore>,
    /// The workflows' concurrency keys (items in the task table; see [`crate::keys`]).
    pub keys: Arc<dyn KeyStore>,
    pub bus: Arc<dyn Bus>,
    pub resources: Resources,
    pub workflows: Arc<WorkflowRegistry>,
    pub settings: Settings,
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
}

impl Deps {
    /// The AWS adapters: DynamoDB for the store, SQS and SNS for the bus (sends to a queue
    /// batched for `settings.send_linger_ms`), the wall clock.
    pub fn aws(sdk: &aws_config::SdkConfig, res: Resources, workflows: WorkflowRegistry, settings: Settings) -> Self {
        let store = DynamoStore::new(
            crate::aws::dynamodb_client(sdk),
            res.task_table.clone(),
            res.shards,
            settings.retention_days,
        )
        .knowing(workflows.all());
        let store = Arc::new(store);
        Deps {
            store: store.clone(),
            writer: Writer::new(store.clone()),
            limiter: store.clone(),
            pacer: store.clone(),
            pauses: store.clone(),
            schedules: store.clone(),
            pause_cache: Arc::default(),
            keys: store,
            bus: Arc::new(BufferedBus::new(
                Arc::new(AwsBus::from_sdk(sdk)),
                Duration::from_millis(settings.send_linger_ms),
            )),
            resources: res,
            workflows: Arc::new(workflows),
            settings,
            clock: Arc::new(SystemClock),
            entropy: Arc::new(OsEntropy),
        }
    }

    /// The Lambda composition root: resources and settings from the environment.
    pub async fn from_env() -> Result<Self, SetupError> {
        let sdk = crate::aws::load_sdk_config_with(&crate::aws::SdkTimeouts::from_env()?).await;
        Ok(Self::aws(&sdk, Resources::from_env()?, WorkflowRegistry::from_env()?, Settings::from_env()?))
    }

    /// The typed sends onto this stack's queues and topic.
    pub fn outbox(&self) -> Outbox<'_> {
        Outbox { bus: self.bus.as_ref(), res: &self.resources }
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// What a transition needs from the world: the time, a fresh token, a jitter.
    /// Whether `workflow`, or the concurrency key `key` (a key item's id) a task holds, is paused
    /// by an operator, as this process last read the pauses item: read again once
    /// [`PAUSE_CACHE_MS`] old (one `GetItem` per process every 5 s at most, while it works), so a
    /// pause or a resume reaches every function within that.
    pub async fn paused(&self, workflow: &str, key: Option<&str>) -> Result<bool, StoreError> {
        let now = self.now();
        let hit = |p: &Pauses| p.workflows.contains_key(workflow) || key.is_some_and(|k| p.keys.contains_key(k));
        {
            let cache = self.pause_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((at, pauses)) = cache.as_ref().filter(|(at, _)| now.0 < at.0.saturating_add(PAUSE_CACHE_MS)) {
                let _ = at;
                return Ok(hit(pauses));
            }
        }
        let pauses = self.pauses.load_pauses().await?.unwrap_or_default();
        let hit = hit(&pauses);
        *self.pause_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((now, pauses));
        Ok(hit)
    }

    pub fn ctx(&self) -> Ctx {
        Ctx { paused: false, now: self.now(), fresh_token: self.entropy.token(), jitter: self.entropy.jitter() }
    }
}

/// How long a process keeps what it read of the paused workflows.
pub const PAUSE_CACHE_MS: u64 = 5_000;

/// Why a message could not be handled. Every error makes the record fail, so SQS delivers it
/// again (and, after maxReceiveCount, moves it to the DLQ).
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error(transparent)]
    Store(StoreError),
    /// The task cannot be stored as this message would change it (see
    /// [`StoreError::is_permanent`]): every delivery fails the same way, so the message is
    /// dead-lettered at once, like a malformed one.
    #[error("the task cannot be stored: {0}")]
    Unstorable(#[source] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("the task kept changing under us ({0} conflicting writes)")]
    Contended(u32),
    /// A record handled with others of its batch (the ends of one parent), which failed together.
    #[error("handled with the other ends of its batch, which failed: {0}")]
    WithRun(String),
}

impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        if e.is_permanent() {
            HandlerError::Unstorable(e)
        } else {
            HandlerError::Store(e)
        }
    }
}
