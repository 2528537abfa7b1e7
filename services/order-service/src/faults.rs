//! Fault injection: rules registered through `POST /faults` (or [`crate::OrderService::add_fault`])
//! and rules carried by a request body at `input.input.faults`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// A fault to inject. Every field is optional in JSON; unknown fields are rejected so that a typo
/// (`fail_time`) is an error rather than a silently ignored rule.
///
/// When several rules match one request they combine: the largest `latency_ms` is slept first,
/// then any `hang`, then the first `permanent`, then `fail_times` / `error_rate`; an accepted
/// asynchronous request then never answers if any rule says `callback_never`, else answers after
/// the largest `callback_late_ms`.
/// Injected failures never apply the effect.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultRule {
    /// Only requests for this order (`task_id`); `None` matches every order.
    pub order: Option<String>,
    /// Only this endpoint, e.g. `"/payment/charge"` (the leading slash is optional);
    /// `None` matches every effect endpoint.
    pub endpoint: Option<String>,
    /// Probability in `0..=1` of answering 503 (or 429, see `retry_after_s`).
    pub error_rate: f64,
    /// The first `fail_times` matching requests answer 503 (or 429). Counted per rule; for rules
    /// carried in a request body, per (order, endpoint).
    pub fail_times: u32,
    /// When set, the failures above answer 429 with `Retry-After: <retry_after_s>` instead of 503.
    pub retry_after_s: Option<u64>,
    /// Sleep this long before handling the request.
    pub latency_ms: u64,
    /// Never answer: the request stays open until the client gives up (or the service shuts down).
    pub hang: bool,
    /// Answer 422 `{"error": <message>}`. Saved under the idempotency key like a success.
    pub permanent: Option<String>,
    /// Asynchronous requests (with a `callback`): accept, send no heartbeat, and confirm only
    /// after this many milliseconds (later than the step's deadline: the answer comes late).
    pub callback_late_ms: Option<u64>,
    /// Asynchronous requests: accept and never answer (the step's deadline ends the wait).
    pub callback_never: bool,
}

impl FaultRule {
    fn matches(&self, order: &str, endpoint: &str) -> bool {
        self.order.as_deref().is_none_or(|o| o == order)
            && self.endpoint.as_deref().is_none_or(|e| normalize_endpoint(e) == endpoint)
    }
}

/// A registered rule as listed by `GET /faults`: the rule's fields, its id, and how many requests
/// reached its failure stage so far (the counter behind `fail_times`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultEntry {
    pub id: u64,
    #[serde(flatten)]
    pub rule: FaultRule,
    pub matched: u32,
}

/// `"/payment/charge"`, `"payment/charge"` and `"payment/charge/"` all name the same endpoint.
pub(crate) fn normalize_endpoint(endpoint: &str) -> &str {
    endpoint.trim_matches('/')
}

/// What to do with one request, decided under a single lock.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub latency_ms: u64,
    pub hang: bool,
    pub permanent: Option<String>,
    pub transient: Option<Transient>,
    pub callback_late_ms: Option<u64>,
    pub callback_never: bool,
}

#[derive(Debug)]
pub(crate) struct Transient {
    /// `Some` → 429 with Retry-After; `None` → 503.
    pub retry_after_s: Option<u64>,
    pub reason: String,
}

#[derive(Default)]
pub(crate) struct Faults {
    next_id: u64,
    rules: Vec<FaultEntry>,
    /// Requests that reached the failure stage, per (order, endpoint), for rules carried in bodies.
    body_counts: HashMap<(String, String), u32>,
}

impl Faults {
    pub fn add(&mut self, rule: FaultRule) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.rules.push(FaultEntry { id, rule, matched: 0 });
        id
    }

    pub fn list(&self) -> Vec<FaultEntry> {
        self.rules.clone()
    }

    /// Removes every rule (`None`) or the rules whose `order` is exactly the given one.
    /// Returns how many were removed. Counters of body-carried rules are kept.
    pub fn clear(&mut self, order: Option<&str>) -> usize {
        let before = self.rules.len();
        match order {
            None => self.rules.clear(),
            Some(order) => self.rules.retain(|r| r.rule.order.as_deref() != Some(order)),
        }
        before - self.rules.len()
    }

    /// Decides the fate of one (non-replayed) request. `body_rule` is the rule the request carried
    /// for this endpoint, if any (its `order` / `endpoint` fields are ignored).
    pub fn plan(&mut self, order: &str, endpoint: &str, body_rule: Option<&FaultRule>) -> Plan {
        let endpoint = normalize_endpoint(endpoint);
        let global: Vec<usize> =
            (0..self.rules.len()).filter(|&i| self.rules[i].rule.matches(order, endpoint)).collect();

        let mut plan = Plan::default();
        for rule in global.iter().map(|&i| &self.rules[i].rule).chain(body_rule) {
            plan.latency_ms = plan.latency_ms.max(rule.latency_ms);
            plan.hang |= rule.hang;
            plan.callback_never |= rule.callback_never;
            plan.callback_late_ms = plan.callback_late_ms.max(rule.callback_late_ms);
            if plan.permanent.is_none() {
                plan.permanent.clone_from(&rule.permanent);
            }
        }
        if plan.hang || plan.permanent.is_some() {
            return plan;
        }

        // The failure stage: count the request against every matching rule, then roll the dice.
        let mut failures: Vec<(Option<u64>, String)> = Vec::new();
        for i in global {
            let entry = &mut self.rules[i];
            entry.matched += 1;
            if let Some(reason) = failure(&entry.rule, entry.matched, &format!("fault rule {}", entry.id)) {
                failures.push((entry.rule.retry_after_s, reason));
            }
        }
        if let Some(rule) = body_rule {
            let count = self.body_counts.entry((order.to_owned(), endpoint.to_owned())).or_default();
            *count += 1;
            if let Some(reason) = failure(rule, *count, "request-body fault") {
                failures.push((rule.retry_after_s, reason));
            }
        }
        if !failures.is_empty() {
            plan.transient = Some(Transient {
                retry_after_s: failures.iter().filter_map(|f| f.0).max(),
                reason: failures.into_iter().map(|f| f.1).collect::<Vec<_>>().join("; "),
            });
        }
        plan
    }
}

/// Whether the `count`-th request reaching `rule`'s failure stage fails, and why.
fn failure(rule: &FaultRule, count: u32, source: &str) -> Option<String> {
    if count <= rule.fail_times {
        Some(format!("{source}: injected failure {count} of {}", rule.fail_times))
    } else if rule.error_rate > 0.0 && rand::random::<f64>() < rule.error_rate {
        Some(format!("{source}: injected random failure (error_rate {})", rule.error_rate))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(f: impl FnOnce(&mut FaultRule)) -> FaultRule {
        let mut rule = FaultRule::default();
        f(&mut rule);
        rule
    }

    #[test]
    fn rules_match_by_order_and_endpoint() {
        let mut faults = Faults::default();
        faults.add(rule(|r| {
            r.order = Some("o1".into());
            r.endpoint = Some("/payment/charge".into());
            r.fail_times = 10;
        }));
        assert!(faults.plan("o1", "/payment/charge", None).transient.is_some());
        assert!(faults.plan("o1", "payment/charge", None).transient.is_some());
        assert!(faults.plan("o2", "/payment/charge", None).transient.is_none());
        assert!(faults.plan("o1", "/inventory/reserve", None).transient.is_none());
    }

    #[test]
    fn precedence_latency_hang_permanent_then_failures() {
        let mut faults = Faults::default();
        faults.add(rule(|r| r.latency_ms = 50));
        faults.add(rule(|r| {
            r.latency_ms = 20;
            r.permanent = Some("no".into());
        }));
        let counting = faults.add(rule(|r| r.fail_times = 1));
        let body = rule(|r| r.hang = true);

        let plan = faults.plan("o1", "/shipping/ship", Some(&body));
        assert_eq!((plan.latency_ms, plan.hang), (50, true));
        let plan = faults.plan("o1", "/shipping/ship", None);
        assert_eq!((plan.latency_ms, plan.hang, plan.permanent.as_deref()), (50, false, Some("no")));
        assert!(plan.transient.is_none());
        // Neither request reached the failure stage, so fail_times is still unspent.
        let counter = |f: &Faults| f.list().iter().find(|e| e.id == counting).unwrap().matched;
        assert_eq!(counter(&faults), 0);

        faults.clear(None);
        faults.add(rule(|r| r.fail_times = 1));
        assert!(faults.plan("o1", "/shipping/ship", None).transient.is_some());
        assert!(faults.plan("o1", "/shipping/ship", None).transient.is_none());
    }

    #[test]
    fn retry_after_takes_the_largest_of_the_failing_rules() {
        let mut faults = Faults::default();
        faults.add(rule(|r| {
            r.fail_times = 1;
            r.retry_after_s = Some(2);
        }));
        faults.add(rule(|r| r.fail_times = 1));
        let body = rule(|r| {
            r.fail_times = 1;
            r.retry_after_s = Some(5);
        });
        let plan = faults.plan("o1", "/payment/refund", Some(&body));
        assert_eq!(plan.transient.unwrap().retry_after_s, Some(5));
        faults.clear(None);
        faults.add(rule(|r| r.fail_times = 1));
        assert_eq!(faults.plan("o1", "/payment/refund", None).transient.unwrap().retry_after_s, None);
    }

    #[test]
    fn body_rule_counts_per_order_and_endpoint() {
        let mut faults = Faults::default();
        let body = rule(|r| r.fail_times = 1);
        assert!(faults.plan("o1", "/payment/charge", Some(&body)).transient.is_some());
        assert!(faults.plan("o1", "/payment/charge", Some(&body)).transient.is_none());
        assert!(faults.plan("o1", "/shipping/ship", Some(&body)).transient.is_some());
        assert!(faults.plan("o2", "/payment/charge", Some(&body)).transient.is_some());
    }

    #[test]
    fn clear_by_order_keeps_other_rules() {
        let mut faults = Faults::default();
        faults.add(rule(|r| r.order = Some("o1".into())));
        faults.add(rule(|r| r.order = Some("o2".into())));
        faults.add(FaultRule::default());
        assert_eq!(faults.clear(Some("o1")), 1);
        assert_eq!(faults.list().len(), 2);
        assert_eq!(faults.clear(None), 2);
    }

    #[test]
    fn json_defaults_and_unknown_fields() {
        let rule: FaultRule = serde_json::from_str(r#"{"fail_times": 2}"#).unwrap();
        assert_eq!(rule, FaultRule { fail_times: 2, ..FaultRule::default() });
        assert!(serde_json::from_str::<FaultRule>(r#"{"fail_time": 2}"#).is_err());
    }
}
