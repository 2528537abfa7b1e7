//! The books: what has been reserved, charged and shipped, and the append-only ledger of every
//! effect applied. One lock covers both, so an effect and its ledger entry are atomic.

use std::collections::HashMap;

use rand::seq::IndexedRandom;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// One applied effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// 1, 2, 3, … in the order effects were applied, across all orders.
    pub seq: u64,
    /// The order id (the request's `task_id`).
    pub order: String,
    /// `reserve`, `release`, `charge`, `refund` or `ship`.
    pub op: String,
    pub idempotency_key: String,
    /// Wall-clock time of the effect, epoch milliseconds.
    pub at_ms: u64,
    /// Operation-specific: ids, items, amounts.
    pub detail: Value,
}

/// The effect endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Reserve,
    Release,
    Charge,
    Refund,
    Ship,
    /// A fraud check: changes nothing, books its verdict and score (so a summary can show it ran).
    Screen,
    /// A gift-wrap: books the wrapping (nothing undoes it: paper is not unwrapped).
    Wrap,
    /// A shipment's tracking: changes nothing, books the status it answered. A stand-in for a
    /// carrier: an order's shipment is `in_transit` at its first [`TRACKS_TO_DELIVERY`] - 1
    /// checks after it ships and `delivered` from then on (`not_shipped` before it ships).
    Track,
}

/// The check of a shipment's tracking at which it is delivered (see [`Op::Track`]).
pub const TRACKS_TO_DELIVERY: usize = 3;

impl Op {
    pub const ALL: [Op; 8] =
        [Op::Reserve, Op::Release, Op::Charge, Op::Refund, Op::Ship, Op::Screen, Op::Wrap, Op::Track];

    /// The ledger's name for the operation.
    pub fn name(self) -> &'static str {
        match self {
            Op::Reserve => "reserve",
            Op::Release => "release",
            Op::Charge => "charge",
            Op::Refund => "refund",
            Op::Ship => "ship",
            Op::Screen => "screen",
            Op::Wrap => "wrap",
            Op::Track => "track",
        }
    }

    /// The route, with its leading slash.
    pub fn path(self) -> &'static str {
        match self {
            Op::Reserve => "/inventory/reserve",
            Op::Release => "/inventory/release",
            Op::Charge => "/payment/charge",
            Op::Refund => "/payment/refund",
            Op::Ship => "/shipping/ship",
            Op::Screen => "/fraud/screen",
            Op::Wrap => "/gift/wrap",
            Op::Track => "/shipping/track",
        }
    }
}

/// The order fields an effect uses, read leniently from the request's `input.input`.
#[derive(Debug, Clone, Default)]
pub(crate) struct OrderInput {
    pub customer: Option<String>,
    pub items: Vec<Item>,
    pub amount_cents: Option<u64>,
    /// The risk the fraud check scores (0 to 100; 5 when absent): a stand-in for its model.
    pub risk: Option<u64>,
    /// A map element's request: about one line of its order.
    pub element: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Item {
    pub sku: String,
    pub qty: u64,
}

impl OrderInput {
    /// Missing or malformed fields get defaults: no items, no customer, the amount derived from the
    /// items; an item without `sku` is `"unknown"`, without `qty` is 1.
    pub fn from_json(order: &Value) -> Self {
        let items = order
            .get("items")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|item| Item {
                        sku: item.get("sku").and_then(Value::as_str).unwrap_or("unknown").to_owned(),
                        qty: item.get("qty").and_then(Value::as_u64).unwrap_or(1),
                    })
                    .collect()
            })
            .unwrap_or_default();
        OrderInput {
            customer: order.get("customer").and_then(Value::as_str).map(str::to_owned),
            items,
            amount_cents: order.get("amount_cents").and_then(Value::as_u64),
            risk: order.get("risk").and_then(Value::as_u64),
            element: false,
        }
    }

    /// `amount_cents` if given, else 1000 per unit.
    pub fn amount_cents(&self) -> u64 {
        self.amount_cents.unwrap_or_else(|| 1000 * self.items.iter().map(|i| i.qty).sum::<u64>())
    }
}

const CARRIERS: [&str; 3] = ["parcel-post", "swift-freight", "bike-courier"];

#[derive(Default)]
pub(crate) struct Books {
    entries: Vec<LedgerEntry>,
    /// Per order: reservations not yet released.
    reservations: HashMap<String, Vec<String>>,
    /// Per order: charges (id, amount) not yet refunded.
    charges: HashMap<String, Vec<(String, u64)>>,
    /// The effect being applied is a map element's (its line is booked with it).
    element: bool,
}

impl Books {
    pub fn entries(&self, order: Option<&str>) -> Vec<LedgerEntry> {
        self.entries.iter().filter(|e| order.is_none_or(|o| e.order == o)).cloned().collect()
    }

    /// Applies one effect and returns the 200 response body.
    pub fn apply(&mut self, op: Op, order: &str, key: &str, input: &OrderInput) -> Value {
        self.element = input.element;
        match op {
            Op::Reserve => {
                let reservation_id = format!("res-{}", uuid::Uuid::new_v4().simple());
                self.reservations.entry(order.to_owned()).or_default().push(reservation_id.clone());
                self.append(order, op, key, json!({"reservation_id": reservation_id, "items": input.items}));
                json!({"reservation_id": reservation_id, "items": input.items})
            }
            Op::Release => {
                let released = self.reservations.remove(order).unwrap_or_default();
                if released.is_empty() {
                    return json!({"released": false});
                }
                self.append(order, op, key, json!({"reservation_ids": released}));
                json!({"released": true})
            }
            Op::Charge => {
                let charge_id = format!("ch-{}", uuid::Uuid::new_v4().simple());
                let amount_cents = input.amount_cents();
                self.charges.entry(order.to_owned()).or_default().push((charge_id.clone(), amount_cents));
                let detail = json!({"charge_id": charge_id, "amount_cents": amount_cents, "customer": input.customer});
                self.append(order, op, key, detail);
                json!({"charge_id": charge_id, "amount_cents": amount_cents})
            }
            Op::Refund => {
                let refunded = self.charges.remove(order).unwrap_or_default();
                if refunded.is_empty() {
                    return json!({"refunded": false});
                }
                let amount_cents: u64 = refunded.iter().map(|c| c.1).sum();
                let charge_ids: Vec<&str> = refunded.iter().map(|c| c.0.as_str()).collect();
                self.append(order, op, key, json!({"charge_ids": charge_ids, "amount_cents": amount_cents}));
                json!({"refunded": true})
            }
            Op::Ship => {
                let shipment_id = format!("shp-{}", uuid::Uuid::new_v4().simple());
                let carrier = *CARRIERS.choose(&mut rand::rng()).unwrap_or(&CARRIERS[0]);
                let detail = json!({"shipment_id": shipment_id, "carrier": carrier, "items": input.items});
                self.append(order, op, key, detail);
                json!({"shipment_id": shipment_id, "carrier": carrier})
            }
            Op::Screen => {
                let score = input.risk.unwrap_or(5).min(100);
                let verdict = if score > 80 { "review" } else { "clear" };
                let detail = json!({"verdict": verdict, "score": score, "amount_cents": input.amount_cents(),
                                    "customer": input.customer});
                self.append(order, op, key, detail.clone());
                detail
            }
            Op::Wrap => {
                let detail = json!({"wrapped": input.items.len(), "customer": input.customer});
                self.append(order, op, key, detail.clone());
                detail
            }
            Op::Track => {
                // a loop's iteration (`{order}~{step}~{i}`) tracks its order's shipment
                let parent = order.split_once('~').map_or(order, |(p, _)| p);
                let entries = &self.entries;
                let of_order = |name: &'static str| entries.iter().filter(move |e| e.order == parent && e.op == name);
                let shipped = of_order("ship").next_back().map(|e| (e.seq, e.detail["shipment_id"].clone()));
                // this check's number since the shipment
                let checks =
                    shipped.as_ref().map_or(0, |(at, _)| of_order("track").filter(|e| e.seq > *at).count() + 1);
                let status = match checks {
                    0 => "not_shipped",
                    n if n >= TRACKS_TO_DELIVERY => "delivered",
                    _ => "in_transit",
                };
                let shipment = shipped.map(|(_, id)| id);
                let detail = json!({"shipment_id": shipment, "status": status, "checks": checks});
                self.append(order, op, key, detail.clone());
                detail
            }
        }
    }

    /// A map element's effect (`order` is `{order}~{step}~{line}`) is booked on its order, with
    /// the line in its detail; so is a parallel branch's (`{order}~{region}~{branch}`), as itself.
    fn append(&mut self, order: &str, op: Op, key: &str, mut detail: Value) {
        let at_ms = crate::now_ms();
        let order = match order.split_once('~') {
            Some((parent, rest)) => {
                if let (true, Some(line), Some(d)) =
                    (self.element, rest.rsplit('~').next().and_then(|l| l.parse::<u64>().ok()), detail.as_object_mut())
                {
                    d.insert("line".into(), json!(line));
                }
                parent
            }
            None => order,
        };
        self.entries.push(LedgerEntry {
            seq: self.entries.len() as u64 + 1,
            order: order.to_owned(),
            op: op.name().to_owned(),
            idempotency_key: key.to_owned(),
            at_ms,
            detail,
        });
    }
}
