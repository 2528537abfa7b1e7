//! Time as a port: the roles read the time from a [`Clock`], so tests and the simulator can run
//! them on a clock they move by hand. The protocol itself is pure and takes `now` as an argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::ids::Millis;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Millis;
}

/// The machine's wall clock (epoch milliseconds).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        Millis::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn at(now: Millis) -> Self {
        ManualClock(Arc::new(AtomicU64::new(now.0)))
    }

    pub fn set(&self, now: Millis) {
        self.0.store(now.0, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) -> Millis {
        Millis(self.0.fetch_add(ms, Ordering::SeqCst) + ms)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        Millis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::at(Millis(5));
        let shared = c.clone();
        assert_eq!(c.now(), Millis(5));
        assert_eq!(shared.advance(10), Millis(15));
        assert_eq!(c.now(), Millis(15));
        c.set(Millis(1));
        assert_eq!(shared.now(), Millis(1));
        assert!(SystemClock.now() > Millis(1_600_000_000_000));
    }
}
