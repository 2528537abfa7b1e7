#!/usr/bin/env python3
"""The driver of `make bench-cost` (stdlib only); bench/cost.sh starts what it needs first.

  cost_bench.py workloads ...   the workloads (WORKLOADS) through the counting proxy: per-task requests,
                                read/write units, $ per million tasks; idle polling; one idle sweep
  cost_bench.py sweep ...       100,000 finished tasks + K expired in-flight ones, one sweep each K

See bench/README.md for what is counted and how to read the tables.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import asl_bench
from cost_proxy import FAKE_AUTH, Upstream, item_size

# us-east-1 list prices, $ per million.
PRICE = {"sqs": 0.40, "sqs_fifo": 0.50, "wcu": 0.625, "rcu": 0.125, "lambda": 0.20, "sns": 0.50,
         # S3 Standard: PUT, COPY, POST, LIST $0.005 per 1,000; GET and the others $0.0004 per 1,000
         "s3_put": 5.0, "s3_get": 0.40}
S3_PUT_CLASS = {"PutObject", "CreateBucket", "ListObjectsV2", "ListObjects", "PostObject"}
# CloudWatch Logs ingestion (us-east-1, standard class): $0.50 per GB, counted here as each line's
# bytes plus the 26 bytes PutLogEvents counts per event. EMF records are log lines: no PutMetricData.
LOGS_USD_PER_GB = 0.50
LOG_EVENT_OVERHEAD = 26


def log_slice(path: str, start: int) -> dict:
    """What the runner wrote to stdout (its JSON log lines and EMF records, as a function writes
    them to CloudWatch Logs) from byte `start` on, by kind and level."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    out = {"emf_lines": 0, "emf_bytes": 0, "log_lines": 0, "log_bytes": 0, "by_level": {}, "by_message": {}}
    for line in data.splitlines():
        if not line.strip():
            continue
        size = len(line) + 1 + LOG_EVENT_OVERHEAD
        if b'"_aws"' in line:
            out["emf_lines"] += 1
            out["emf_bytes"] += size
            continue
        out["log_lines"] += 1
        out["log_bytes"] += size
        try:
            rec = json.loads(line)
        except ValueError:
            rec = {}
        level = str(rec.get("level", "?"))
        out["by_level"][level] = out["by_level"].get(level, 0) + 1
        msg = str(rec.get("message", "?"))[:60]
        out["by_message"][msg] = out["by_message"].get(msg, 0) + size
    return out


def file_size(path: str) -> int:
    return os.path.getsize(path) if path and os.path.exists(path) else 0
TERMINAL = {"Processed", "Compensated", "Error", "Cancelled", "Rejected"}
ROLES = {
    "SubmissionQueueUrl": "submission",
    "SchedulerQueueUrl": "scheduler",
    "AgentQueueUrl": "agent",
    "SupervisorQueueUrl": "supervisor",
    "CallbackQueueUrl": "callback",
    "EndsQueueUrl": "ends",
}


def log(msg: str):
    print(f"bench-cost: {msg}", file=sys.stderr, flush=True)


def n_tasks(base: int) -> int:
    scale = os.environ.get("BENCH_N")
    if not scale or base == 1:
        return base
    # BENCH_N sets the 1-step count; the 3-step workloads get half of it.
    return max(1, int(scale) * base // 200)


WORKLOADS = [
    # name, workflow, input, tasks, expected attempts per step
    ("sim-step", "sim-step", {}, 200, {"reserve": 1}),
    ("sim-step, 1 retry", "sim-step", {"sim": {"reserve": {"fail_attempts": 1}}}, 200, {"reserve": 2}),
    ("sim-order", "sim-order", {}, 100, {"reserve": 1, "charge": 1, "ship": 1}),
    (
        "sim-order, 1 retry",
        "sim-order",
        {"sim": {"charge": {"fail_attempts": 1}}},
        100,
        {"reserve": 1, "charge": 2, "ship": 1},
    ),
    # one task whose map step reserves 1,000 lines (each an element task), then charges: the
    # figures per task are per map; print_report adds them per element
    ("sim-map, 1,000 elements", "sim-map", {"lines": [{"sku": f"s{i}"} for i in range(1000)]}, 1,
     {"reserve": 1, "charge": 1}),
    # sim-order with a fraud check beside the charge: two branches, each a task of its own (the
    # task's own record counts the region's start on its first step, charge; fraud ran elsewhere)
    ("sim-branches", "sim-branches", {}, 100, {"reserve": 1, "charge": 1, "fraud": 0, "ship": 1}),
    # guards, templates and a handled failure: approve and apologize are skipped (their guards are
    # false), the charge gets only its parameters; four steps run, as in sim-order plus one
    ("sim-decide, 2 skipped", "sim-decide", {"amount": 10}, 100,
     {"reserve": 1, "approve": 0, "charge": 1, "giftwrap": 1, "apologize": 0, "ship": 1}),
    # a workflow step: ship runs sim-shipping (pack, dispatch) as a child task of its own
    ("sim-child", "sim-child", {}, 100, {"reserve": 1, "ship": 1, "charge": 1}),
    # Three state machines of the Step Functions collection, translated by `sasctl import-asl`
    # (bench/asl_bench.py): their functions and notifications are sim agents. The ATM dispenser:
    # four Lambda tasks in sequence.
    ("asl-chain (import-asl)", "asl-chain", {"amount": 186}, 100,
     {"Dispense50": 1, "Dispense20": 1, "Dispense10": 1, "Dispense1": 1}),
    # the saga, the trip booked: five Lambda tasks (three with their undoing task as compensation,
    # not run) and the SNS notification
    ("asl-saga (import-asl), booked", "asl-saga",
     {"trip_id": "t-0001", "depart_city": "Detroit", "arrive_city": "Frankfurt", "rental": "BMW"}, 100,
     {"ReserveFlight": 1, "ReserveCarRental": 1, "ProcessPayment": 1, "ConfirmFlight": 1, "ConfirmCarRental": 1,
      "SendingSMSSuccess": 1}),
    # buy or sell: the recommendation is "buy" (asl_bench.py's stub: a sim agent's answer matches no
    # Choice rule), the approval a callback step answered by asl_bench.py's approver. The Choice's
    # three ways (no match, sell, buy) follow each other in the task (the importer puts the ways
    # out of one Choice in sequence), their guards deciding which run: buy, then the report; sell
    # and the no-match step skipped
    ("asl-orchestration (import-asl), buy", "asl-orchestration", {"ticker": "AMZN"}, 100,
     {"Check_Stock_Price": 1, "Generate_Buy_Sell_recommendation": 1, "Request_Human_Approval": 1,
      "Buy_or_Sell__no_choice_matched": 0, "Sell_Stock": 0, "Buy_Stock": 1, "Report_Result": 1}),
    # a loop: reserve, then 100 iterations of a one-step body (each a child task), then ship: the
    # figures per task are per loop; print_report adds them per iteration
    ("sim-loop, 100 iterations", "sim-loop", {"polls": 100}, 5, {"reserve": 1, "poll": 1, "ship": 1}),
    # a Distributed Map over a CSV of 10,000 rows in S3 (the collection's distributed-map-csv-iterator,
    # translated): the s3_items agent reads it and writes its pages, a child task per page reads its
    # page and maps its rows, each row a child workflow of one step (a sim agent for its putItem).
    # The figures per task are per map; print_report adds them per row
    ("asl-s3map (import-asl), 10,000 rows", "asl-s3map",
     {"BucketName": asl_bench.SOURCE_BUCKET, "FileKey": "rows.csv"}, 1, {"Map_items": 1, "Map": 1}),
]

# Workloads whose task is a map or a loop: how many elements or iterations it has (for the figures per
# element or iteration).
ELEMENTS = {"sim-map, 1,000 elements": 1000, "sim-loop, 100 iterations": 100,
            "asl-s3map (import-asl), 10,000 rows": 10000}


def s3_rows(env: Env, rows: int = 10000) -> None:
    """The map's buckets and its CSV (straight to LocalStack: not counted)."""
    auth = FAKE_AUTH.format(region="us-east-1", service="s3")
    csv = "Content,VideoPublishTime,VideoTitle,Views\n" + "".join(
        f"video-{i:05d},2024-01-{i % 28 + 1:02d},Title {i},{i * 7}\n" for i in range(rows)
    )
    for method, path, body in (
        ("PUT", f"/{asl_bench.MAP_BUCKET}", b""),
        ("PUT", f"/{asl_bench.SOURCE_BUCKET}", b""),
        ("PUT", f"/{asl_bench.SOURCE_BUCKET}/rows.csv", csv.encode()),
    ):
        headers = [("Host", f"{env.direct.host}:{env.direct.port}"), ("Authorization", auth),
                   ("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"), ("Content-Length", str(len(body)))]
        status, _, _, out = env.direct.request(method, path, headers, body)
        if status >= 300 and b"BucketAlreadyOwnedByYou" not in out:
            raise RuntimeError(f"S3 {method} {path}: HTTP {status}: {out[:300]!r}")


# What a workload needs before its tasks are sent.
SETUP = {"asl-s3map (import-asl), 10,000 rows": s3_rows}

# Workloads whose way through a Choice is checked too: the status of these steps on the task's record.
STATUSES = {
    "asl-orchestration (import-asl), buy": {
        "Buy_or_Sell__no_choice_matched": "skipped", "Sell_Stock": "skipped", "Buy_Stock": "succeeded",
        "Report_Result": "succeeded",
    },
}


class Env:
    def __init__(self, a):
        with open(a.outputs) as f:
            self.outputs = json.load(f)
        self.direct = Upstream(a.upstream)
        self.proxy_url = a.proxy.rstrip("/")
        self.via_proxy = Upstream(self.proxy_url)
        self.table = self.outputs["TaskTableName"]
        self.queues = {role: self.outputs[k] for k, role in ROLES.items() if k in self.outputs}
        self.queue_role = {url.rstrip("/").rsplit("/", 1)[-1]: role for role, url in self.queues.items()}
        self.sasctl = a.sasctl

    # -- proxy control ---------------------------------------------------------------------
    def reset(self):
        request = urllib.request.Request(self.proxy_url + "/_cost/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).read()

    def counters(self) -> dict:
        with urllib.request.urlopen(self.proxy_url + "/_cost/counters", timeout=10) as r:
            return json.load(r)

    # -- AWS, straight to the upstream (not counted) ----------------------------------------
    def sqs(self, op: str, payload: dict, up: Upstream | None = None) -> dict:
        status, out = (up or self.direct).call("sqs", f"AmazonSQS.{op}", payload)
        if status != 200:
            raise RuntimeError(f"SQS {op}: HTTP {status}: {out}")
        return out

    def queue_depth(self) -> int:
        total = 0
        for url in self.queues.values():
            attrs = self.sqs(
                "GetQueueAttributes",
                {
                    "QueueUrl": url,
                    "AttributeNames": [
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed",
                    ],
                },
            )["Attributes"]
            total += sum(int(v) for v in attrs.values())
        return total

    def wait_quiet(self, limit: float, what: str) -> float:
        """Until the stack's queues hold no message (visible, in flight or delayed) twice in a row."""
        start, calm = time.time(), 0
        while calm < 2:
            depth = self.queue_depth()
            calm = calm + 1 if depth == 0 else 0
            if time.time() - start > limit:
                raise RuntimeError(f"{what}: the queues still hold {depth} message(s) after {limit:.0f} s")
            time.sleep(1)
        return time.time() - start

    def get_items(self, ids: list[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for i in range(0, len(ids), 100):
            keys = [{"TaskId": {"S": t}} for t in ids[i:i + 100]]
            while keys:
                r = self.direct.ddb("BatchGetItem", {"RequestItems": {self.table: {"Keys": keys}}})
                for item in r.get("Responses", {}).get(self.table, []):
                    out[item["TaskId"]["S"]] = item
                keys = r.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])
        return out

    def batch_write(self, requests: list[dict]):
        """BatchWriteItem of up to 25, unprocessed items sent again."""
        for lo in range(0, len(requests), 25):
            todo = requests[lo:lo + 25]
            while todo:
                r = self.direct.ddb("BatchWriteItem", {"RequestItems": {self.table: todo}})
                todo = r.get("UnprocessedItems", {}).get(self.table, [])
                if todo:
                    time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def plain(v):
    """DynamoDB JSON to plain values."""
    (k, x), = v.items()
    if k == "M":
        return {n: plain(e) for n, e in x.items()}
    if k == "L":
        return [plain(e) for e in x]
    if k == "N":
        return float(x) if "." in x else int(x)
    if k == "NULL":
        return None
    return x


def summarize(rows: list[dict], tasks: int, env_roles: dict[str, str], reply_queue: str) -> dict:
    """Per-task figures of one window of counters."""
    s = {
        "sqs_requests": 0, "sqs_billed": 0, "submit_requests": 0, "submit_billed": 0,
        "ddb_requests": 0, "rcu": 0.0, "wcu": {}, "invocations": {}, "empty_receives": 0,
        "reply_requests": 0, "reply_billed": 0, "alert_requests": 0, "alert_billed": 0,
        "other_requests": 0, "query_items": 0, "query_bytes": 0, "failed_conditions": 0, "errors": 0,
        "fifo_billed": 0, "s3_put_requests": 0, "s3_get_requests": 0,
    }
    for r in rows:
        s["errors"] += r["errors"]
        if r["service"] == "sqs":
            if r["resource"] == reply_queue:
                s["reply_requests"] += r["requests"]
                s["reply_billed"] += r["billed"]
                continue
            role = env_roles.get(r["resource"], r["resource"])
            if r["resource"].endswith(".fifo"):
                # FIFO requests cost more (the empty receives of idle polling are not counted here)
                s["fifo_billed"] += r["billed"] - (r["empty"] if r["op"] == "ReceiveMessage" else 0)
            if r["op"] == "ReceiveMessage":
                nonempty = r["requests"] - r["empty"]
                s["empty_receives"] += r["empty"]
                s["invocations"][role] = s["invocations"].get(role, 0) + nonempty
                s["sqs_requests"] += nonempty
                s["sqs_billed"] += r["billed"] - r["empty"]
            elif r["op"].startswith("SendMessage") and role == "submission":
                s["submit_requests"] += r["requests"]
                s["submit_billed"] += r["billed"]
            else:
                s["sqs_requests"] += r["requests"]
                s["sqs_billed"] += r["billed"]
        elif r["service"] == "dynamodb":
            s["ddb_requests"] += r["requests"]
            s["rcu"] += r["rcu"]
            for k, v in r["wcu"].items():
                s["wcu"][k] = s["wcu"].get(k, 0) + v
            s["failed_conditions"] += r["failed_conditions"]
            if r["op"] in ("Query", "Scan"):
                s["query_items"] += r["items"]
                s["query_bytes"] += r["bytes"]
        elif r["service"] == "sns":
            s["alert_requests"] += r["requests"]
            s["alert_billed"] += r["billed"]
        elif r["service"] == "s3":
            s["s3_put_requests" if r["op"] in S3_PUT_CLASS else "s3_get_requests"] += r["requests"]
        else:
            s["other_requests"] += r["requests"]
    per = {}
    t = max(tasks, 1)
    inv = sum(s["invocations"].values())
    wcu = sum(s["wcu"].values())
    sqs_billed = s["sqs_billed"] + s["submit_billed"]
    s3 = s["s3_put_requests"] + s["s3_get_requests"]
    s3_usd = s["s3_put_requests"] * PRICE["s3_put"] + s["s3_get_requests"] * PRICE["s3_get"]
    per["requests"] = (s["sqs_requests"] + s["submit_requests"] + s["ddb_requests"] + s3) / t
    per["s3"] = s3 / t
    per["sqs"] = (s["sqs_requests"] + s["submit_requests"]) / t
    per["submit"] = s["submit_requests"] / t
    per["dynamodb"] = s["ddb_requests"] / t
    per["lambda"] = inv / t
    per["invocations_by_role"] = {k: v / t for k, v in sorted(s["invocations"].items())}
    per["rcu"] = s["rcu"] / t
    per["wcu"] = wcu / t
    per["wcu_by"] = {k: v / t for k, v in s["wcu"].items()}
    sqs_usd = sqs_billed * PRICE["sqs"] + s["fifo_billed"] * (PRICE["sqs_fifo"] - PRICE["sqs"])
    per["usd_per_million"] = (
        sqs_usd + wcu * PRICE["wcu"] + s["rcu"] * PRICE["rcu"] + inv * PRICE["lambda"] + s3_usd
    ) / t
    per["fifo"] = s["fifo_billed"] / t
    per["usd_parts"] = {
        "sqs": sqs_usd / t,
        "dynamodb_write": wcu * PRICE["wcu"] / t,
        "dynamodb_read": s["rcu"] * PRICE["rcu"] / t,
        "lambda": inv * PRICE["lambda"] / t,
        "s3": s3_usd / t,
    }
    per["replies"] = s["reply_requests"] / t
    per["replies_usd_per_million"] = s["reply_billed"] * PRICE["sqs"] / t
    per["alerts"] = s["alert_requests"] / t
    per["alerts_usd_per_million"] = s["alert_billed"] * PRICE["sns"] / t
    return {"totals": s, "per_task": per}


def fmt(x: float, digits: int = 2) -> str:
    if x == 0:
        return "0"
    return f"{x:.{digits}f}".rstrip("0").rstrip(".") if abs(x - round(x)) > 1e-9 else str(round(x))


def index_names(results: list[dict]) -> list[str]:
    names: list[str] = []
    for r in results:
        for k in r["summary"]["per_task"]["wcu_by"]:
            if k != "table" and k not in names:
                names.append(k)
    return sorted(names)


def main_table(results: list[dict]) -> str:
    ixs = index_names(results)
    head = ["workload", "tasks", "requests", "SQS", "(submit)", "DynamoDB", "S3", "Lambda inv.", "RCU", "WCU",
            "WCU table"]
    head += [f"WCU {i}" for i in ixs]
    head += ["$/M tasks", "replies", "$/M replies", "alerts", "$/M alerts"]
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    for r in results:
        p = r["summary"]["per_task"]
        cells = [r["name"], str(r["tasks"]), fmt(p["requests"]), fmt(p["sqs"]), fmt(p["submit"]), fmt(p["dynamodb"]),
                 fmt(p.get("s3", 0)), fmt(p["lambda"]), fmt(p["rcu"]), fmt(p["wcu"]),
                 fmt(p["wcu_by"].get("table", 0))]
        cells += [fmt(p["wcu_by"].get(i, 0)) for i in ixs]
        cells += [f"{p['usd_per_million']:.2f}", fmt(p["replies"]), f"{p['replies_usd_per_million']:.2f}",
                  fmt(p["alerts"]), f"{p['alerts_usd_per_million']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(results: list[dict], roles: dict[str, str], reply_queue: str, table: str) -> str:
    """Requests (and units) per task by operation and resource, one column per workload."""
    def label(row):
        res = row["resource"]
        if row["service"] == "sqs":
            res = "replies" if res == reply_queue else roles.get(res, res)
            if row["op"] == "ReceiveMessage":
                return [(f"sqs ReceiveMessage {res} (non-empty)", row["requests"] - row["empty"]),
                        (f"sqs ReceiveMessage {res} (empty, idle)", row["empty"])]
        elif row["service"] == "dynamodb":
            res = res.replace(table + "/", "").replace(table, "table")
        return [(f"{row['service']} {row['op']} {res}", row["requests"])]

    keys: list[str] = []
    cols = []
    for r in results:
        col: dict[str, float] = {}
        for row in r["rows"]:
            for k, v in label(row):
                col[k] = col.get(k, 0) + v / max(r["tasks"], 1)
                if k not in keys:
                    keys.append(k)
        cols.append(col)
    keys.sort()
    head = ["requests per task, by operation"] + [r["name"] for r in results]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "|".join("---:" for _ in results) + "|"]
    for k in keys:
        if all(abs(c.get(k, 0)) < 1e-12 for c in cols):
            continue
        lines.append("| " + " | ".join([k] + [fmt(c.get(k, 0), 3) for c in cols]) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------


def submit(env: Env, workflow: str, inp: dict, ids: list[str], reply_url: str) -> None:
    """SendMessageBatch of ten through the proxy, four in flight: what an application does."""
    url = env.queues["submission"]

    def one(chunk):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(
                    {"v": 1, "task_id": t, "workflow": workflow, "input": inp, "reply_to": reply_url}
                ),
            }
            for i, t in enumerate(chunk)
        ]
        out = env.sqs("SendMessageBatch", {"QueueUrl": url, "Entries": entries}, up=env.via_proxy)
        if out.get("Failed"):
            raise RuntimeError(f"SendMessageBatch failed: {out['Failed'][:2]}")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, [ids[i:i + 10] for i in range(0, len(ids), 10)]))


def drain(env: Env, url: str) -> int:
    n = 0
    while True:
        received = env.sqs("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0})
        msgs = received.get("Messages", [])
        if not msgs:
            return n
        n += len(msgs)
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)]
        env.sqs("DeleteMessageBatch", {"QueueUrl": url, "Entries": entries})


def check(items: dict[str, dict], ids: list[str], expected: dict[str, int],
          statuses: dict[str, str] | None = None) -> list[str]:
    problems = []
    for t in ids:
        item = items.get(t)
        if item is None:
            problems.append(f"{t}: no item")
            continue
        task = {k: plain(v) for k, v in item.items()}
        if task.get("ProcessState") != "Processed":
            problems.append(f"{t}: {task.get('ProcessState')} ({task.get('Reason')})")
            continue
        got = {s.get("name", s.get("Name")): s.get("attempts", s.get("Attempts")) for s in task.get("Steps", [])}
        if got != expected:
            problems.append(f"{t}: attempts {got}, expected {expected}")
            continue
        status = {s.get("name"): s.get("status") for s in task.get("Steps", []) if s.get("name") in (statuses or {})}
        if statuses and status != statuses:
            problems.append(f"{t}: steps {status}, expected {statuses}")
    return problems


def run_workload(env: Env, a, reply_url: str, reply_queue: str, spec) -> dict:
    name, workflow, inp, base_n, expected = spec
    n = n_tasks(base_n)
    env.wait_quiet(a.quiet_timeout, f"before {name}")
    drain(env, reply_url)
    run = uuid.uuid4().hex[:6]
    ids = [f"bench-{run}-{i:05d}" for i in range(n)]
    if name in SETUP:
        SETUP[name](env)
    env.reset()
    log_start = file_size(a.runner_out)
    t0 = time.time()
    submit(env, workflow, inp, ids, reply_url)
    log(f"{name}: {n} tasks sent")
    last = 0.0
    while True:
        items = env.get_items(ids)
        terminal = sum(1 for i in items.values() if i.get("ProcessState", {}).get("S") in TERMINAL)
        if a.in_flight and workflow == "sim-order" and not os.path.exists(a.in_flight):
            # Keep one in-flight sim-order item (for the sweep benchmark's expired copies).
            live = [
                i
                for i in items.values()
                if "CompleteBy" in i and "Shard" in i and i["ProcessState"]["S"] == "Processing"
            ]
            if live:
                with open(a.in_flight, "w") as f:
                    json.dump(live[0], f)
        if terminal == n:
            break
        # a map of 10,000 elements takes longer than the other workloads
        limit = a.timeout * max(1, ELEMENTS.get(name, 0) // 2000)
        if time.time() - t0 > limit:
            raise RuntimeError(f"{name}: {n - terminal} of {n} tasks not terminal after {limit} s")
        if time.time() - last > 10:
            log(f"{name}: {terminal}/{n} terminal after {time.time() - t0:.0f} s")
            last = time.time()
        time.sleep(0.5)
    done = time.time() - t0
    log(f"{name}: all terminal in {done:.1f} s; waiting for the deadline timers to fire and the queues to empty")
    waited = env.wait_quiet(a.quiet_timeout, f"after {name}")
    time.sleep(a.settle)
    snap = env.counters()
    seen = log_slice(a.runner_out, log_start)
    if seen:
        seen["per_task"] = {k: seen[k] / n for k in ("emf_lines", "emf_bytes", "log_lines", "log_bytes")}
        seen["usd_per_million"] = (seen["emf_bytes"] + seen["log_bytes"]) / n * 1e6 / 1e9 * LOGS_USD_PER_GB
        seen["by_message"] = dict(sorted(seen["by_message"].items(), key=lambda kv: -kv[1])[:8])
    replies = drain(env, reply_url)
    final = env.get_items(ids)
    problems = check(final, ids, expected, STATUSES.get(name))
    latency = latencies(final, t0)
    summary = summarize(snap["rows"], n, env.queue_role, reply_queue)
    log(f"{name}: {summary['per_task']['requests']:.2f} requests/task, WCU {summary['per_task']['wcu']:.2f}, "
        f"${summary['per_task']['usd_per_million']:.2f}/M; window {snap['until'] - snap['since']:.0f} s "
        f"(drained in {done:.0f} s, timers {waited:.0f} s)")
    return {
        "name": name, "workflow": workflow, "input": inp, "tasks": n, "expected_attempts": expected,
        "drain_secs": round(done, 1), "timers_secs": round(waited, 1),
        "window_secs": round(snap["until"] - snap["since"], 1), "window": [snap["since"], snap["until"]],
        "replies_received": replies,
        "problems": problems[:20], "problem_count": len(problems), "rows": snap["rows"], "summary": summary,
        "sample_task": ids[0], "seeing": seen, "latency": latency,
    }


def seconds(latency: dict, span: str) -> dict[str, str]:
    """One span's percentiles of `latencies`, in seconds with one decimal, for the tables."""
    figures = latency.get(span, {})
    return {q: f"{figures.get(q, 0) / 1000:.1f}" for q in ("p50", "p90", "max")}


def latencies(items: dict[str, dict], t0: float) -> dict:
    """Percentiles (ms) over the tasks of a burst sent from `t0` on: from the burst's first send to the
    task's terminal write (`UpdatedAt`), from its creation (`CreatedAt`) to that write, and from the send
    to the creation (the submission queue and the Submitter). Host clocks on both sides (the runner and
    this script run on the same machine)."""
    sent = t0 * 1000
    spans = {"send_to_end": [], "created_to_end": [], "send_to_created": []}
    for item in items.values():
        try:
            created, updated = float(item["CreatedAt"]["N"]), float(item["UpdatedAt"]["N"])
        except (KeyError, ValueError):
            continue
        spans["send_to_end"].append(updated - sent)
        spans["created_to_end"].append(updated - created)
        spans["send_to_created"].append(created - sent)

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    return {k: {"p50": round(pct(v, 0.5)), "p90": round(pct(v, 0.9)), "max": round(max(v, default=0))}
            for k, v in spans.items()}


def sasctl_sweep(env: Env) -> dict:
    e = dict(os.environ, AWS_ENDPOINT_URL=env.proxy_url, SAS_OUTPUTS=env.outputs_path)
    out = subprocess.run([env.sasctl, "sweep"], env=e, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cmd_workloads(a):
    env = Env(a)
    env.outputs_path = a.outputs
    env.json_out = a.json_out
    # on the stack's default reply allow-list (<stack>-reply-*): any other reply_to is Rejected
    reply_queue = f"{env.outputs.get('StackName', 'sas-bench')}-reply-bench"
    reply_url = env.sqs("CreateQueue", {"QueueName": reply_queue})["QueueUrl"]
    results = []
    started = time.time()
    try:
        only = set(a.only.split(",")) if a.only else None
        for i, spec in enumerate(WORKLOADS):
            if only and str(i + 1) not in only:
                continue
            results.append(run_workload(env, a, reply_url, reply_queue, spec))
        # Idle: what the pollers cost with nothing to do (scheduled, not per task).
        env.wait_quiet(a.quiet_timeout, "before the idle window")
        env.reset()
        time.sleep(a.idle_secs)
        idle_rows = env.counters()["rows"]
        idle = {"secs": a.idle_secs, "rows": idle_rows}
        empty = sum(r["empty"] for r in idle_rows if r["op"] == "ReceiveMessage")
        idle["empty_receives_per_hour"] = empty * 3600 / a.idle_secs
        idle["usd_per_hour"] = idle["empty_receives_per_hour"] * PRICE["sqs"] / 1e6
        # One sweep on the quiet stack (the scheduled rule runs it every minute on AWS).
        env.reset()
        report = sasctl_sweep(env)
        # The runner's pollers keep receiving meanwhile: not the sweep's.
        sweep_rows = [r for r in env.counters()["rows"] if r["op"] != "ReceiveMessage"]
        sweep = {"report": report, "rows": sweep_rows,
                 "requests": sum(r["requests"] for r in sweep_rows), "rcu": sum(r["rcu"] for r in sweep_rows)}
        sweep["usd_per_hour_at_1_per_min"] = 60 * (sweep["rcu"] * PRICE["rcu"] + 1 * PRICE["lambda"]) / 1e6
    finally:
        env.sqs("DeleteQueue", {"QueueUrl": reply_url})
    out = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stack": env.outputs.get("StackName"), "table": env.table, "prices_usd_per_million": PRICE,
        "queue_budget_ms": os.environ.get("QUEUE_BUDGET_MS"), "elapsed_secs": round(time.time() - started, 1),
        "log_level": os.environ.get("BENCH_LOG_LEVEL", "info"),
        "workloads": results, "idle": idle, "idle_sweep": sweep,
    }
    with open(a.json_out, "w") as f:
        json.dump(out, f, indent=1)
    print_report(out, env)
    bad = [r for r in results if r["problem_count"] or r["summary"]["totals"]["errors"]]
    for r in bad:
        log(
            f"FAILED {r['name']}: {r['problem_count']} task(s) not as expected, "
            f"{r['summary']['totals']['errors']} request error(s): {r['problems'][:5]}"
        )
    return 1 if bad else 0


def print_report(out: dict, env: Env):
    results = out["workloads"]
    reply_queue = f"{out['stack']}-reply-bench"
    p = print
    p(f"\n## Cost per task ({out['stack']}, {time.strftime('%Y-%m-%d')}; figures are per completed task)\n")
    p(main_table(results))
    budget = out["queue_budget_ms"]
    p(f"""
- requests = SQS + DynamoDB requests per task; SQS includes the submission (the `(submit)` column:
  SendMessageBatch of 10) and the non-empty ReceiveMessage calls; empty receives (idle polling) are not
  per task and are excluded (see below). Lambda inv. = one invocation per non-empty receive (one batch).
- RCU/WCU: DynamoDB read/write request units, from item sizes (see bench/README.md); WCU split into the
  base table and each global secondary index.
- $/M tasks = SQS billed requests x $0.40 (x $0.50 on a FIFO queue: the ends queue) + WCU x $0.625 + RCU x
  $0.125 + invocations x $0.20 + S3 PUT and LIST x $5 + S3 GET x $0.40 (per million);
  Lambda duration (GB-s) is NOT counted.
- replies = sends to the caller's reply queue (SQS, $0.40/M); alerts = SNS publishes ($0.50/M); both
  priced separately from the task cost.
- Deadline timers are included: the runner uses a short queue budget (QUEUE_BUDGET_MS={budget}), so every
  timer fired (receive + GetItem + delete) before the counters were read.""")
    if any(r.get("seeing") for r in results):
        p(f"\n### What seeing costs: log lines and EMF records per task (RUST_LOG={out.get('log_level')})\n")
        p(
            "| workload | log lines | log bytes | EMF records | EMF bytes | $/M tasks (CloudWatch Logs, $0.50/GB) "
            "| lines by level |"
        )
        p("|---|---:|---:|---:|---:|---:|---|")
        for r in results:
            s = r.get("seeing")
            if not s:
                continue
            pt = s["per_task"]
            levels = ", ".join(f"{k} {fmt(v / r['tasks'])}" for k, v in sorted(s["by_level"].items()))
            p(f"| {r['name']} | {fmt(pt['log_lines'])} | {pt['log_bytes']:.0f} | {fmt(pt['emf_lines'])} | "
              f"{pt['emf_bytes']:.0f} | ${s['usd_per_million']:.2f} | {levels} |")
        p("""
- Bytes as CloudWatch Logs counts them: each line plus 26 bytes per event. The local runner writes what
  the functions write (the same JSON lines; one EMF flush per batch, as a function flushes per
  invocation). Lambda's own START/END/REPORT lines are not counted: the template keeps them out
  (PlatformLogLevel WARN); at INFO each invocation adds three more events.""")
    p("\n### Requests per task by operation\n")
    p(detail_table(results, env.queue_role, reply_queue, out["table"]))
    p("\n### Other figures per workload\n")
    p("| workload | drained in s | latency p50 / p90 (s) | created to end p50 (s) | send to created p50 (s) "
      "| invocations by role | replies received/task | failed conditional writes/task |")
    p("|---|---:|---:|---:|---:|---|---:|---:|")
    for r in results:
        per = r["summary"]["per_task"]
        inv = ", ".join(f"{k} {fmt(v)}" for k, v in per["invocations_by_role"].items())
        lat = r.get("latency") or {}
        e2e, c2e, s2c = (seconds(lat, k) for k in ("send_to_end", "created_to_end", "send_to_created"))
        conflicts = fmt(r["summary"]["totals"]["failed_conditions"] / r["tasks"], 3)
        p(f"| {r['name']} | {r['drain_secs']} | {e2e['p50']} / {e2e['p90']} | {c2e['p50']} | {s2c['p50']} | {inv} | "
          f"{fmt(r['replies_received'] / r['tasks'])} | {conflicts} |")
    p("- latency: from the burst's first send to each task's terminal write (`UpdatedAt`); created to end: "
      "from `CreatedAt`; send to created: the submission queue and the Submitter. A burst: the later tasks "
      "wait behind the earlier ones.")
    maps = [r for r in results if r["name"] in ELEMENTS]
    if maps:
        p("\n### Per map element or loop iteration\n")
        p(
            "| workload | elements or iterations | requests/each | S3/each | Lambda inv./each | WCU/each | RCU/each "
            "| $/M each | failed conditional writes/element | drained in s |"
        )
        p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in maps:
            k = ELEMENTS[r["name"]] * r["tasks"]
            per, tot = r["summary"]["per_task"], r["summary"]["totals"]
            s3 = fmt(per.get("s3", 0) * r["tasks"] / k, 3)
            p(f"| {r['name']} | {k} | {fmt(per['requests'] * r['tasks'] / k)} | {s3} | "
              f"{fmt(per['lambda'] * r['tasks'] / k)} | {fmt(per['wcu'] * r['tasks'] / k)} | "
              f"{fmt(per['rcu'] * r['tasks'] / k)} | ${per['usd_per_million'] * r['tasks'] / k:.2f} | "
              f"{fmt(tot['failed_conditions'] / k, 3)} | {r['drain_secs']} |")
        p("- The parent's own steps (charge) and its submission are spread over the elements; a map element "
          "is created, claimed, run and ended as a task of its own, and the ends one batch brings to the parent "
          "are one write on it. A loop's iteration likewise, one at a time, its end one write on the loop's task.")
    idle, sw = out["idle"], out["idle_sweep"]
    p("\n### Scheduled costs (not per task)\n")
    polled = len({r["resource"] for r in idle["rows"] if r["op"] == "ReceiveMessage"})
    p(f"- Idle polling (local runner: one long poll of 2 s at a time per queue, {polled} queues): "
      f"{idle['empty_receives_per_hour']:.0f} empty ReceiveMessage per hour = ${idle['usd_per_hour']:.4f}/hour "
      f"(measured over {idle['secs']} s). This is the local runner's rate: on AWS an SQS event source mapping "
      f"polls with its own pollers (long polls, several per queue), at another rate; those are SQS requests too.")
    p(f"- One supervisor sweep of the quiet stack: {sw['requests']} requests, {fmt(sw['rcu'])} RCU "
      f"(report {json.dumps(sw['report'])}); at one sweep per minute (the scheduled rule): "
      f"${sw['usd_per_hour_at_1_per_min']:.6f}/hour incl. one Lambda invocation each.")
    p(f"\nRaw figures: {os.path.relpath(env.json_out) if hasattr(env, 'json_out') else 'the JSON file'}")


# ---------------------------------------------------------------------------------------------
# The sweep benchmark
# ---------------------------------------------------------------------------------------------


def cmd_sweep(a):
    env = Env(a)
    env.outputs_path = a.outputs
    with open(a.json_out) as f:
        out = json.load(f)
    finished = env.get_items([out["workloads"][-1]["sample_task"]])
    if not finished:
        raise SystemExit("no finished task to copy (run the workloads first)")
    finished = next(iter(finished.values()))
    if not a.in_flight or not os.path.exists(a.in_flight):
        raise SystemExit("no in-flight task item was captured during the workloads (--in-flight)")
    with open(a.in_flight) as f:
        in_flight = json.load(f)
    shards = int(env.outputs.get("SupervisorShards", "4"))
    # 1. 100,000 finished tasks (no Shard/CompleteBy: not in the sparse index).
    total = a.finished
    t0 = time.time()

    def load(lo):
        reqs = []
        for i in range(lo, min(lo + 25, total)):
            item = dict(finished, TaskId={"S": f"done-{i:06d}"})
            reqs.append({"PutRequest": {"Item": item}})
        env.batch_write(reqs)

    with concurrent.futures.ThreadPoolExecutor(a.threads) as pool:
        list(pool.map(load, range(0, total, 25)))
    load_secs = time.time() - t0
    log(f"sweep: {total} finished task items loaded in {load_secs:.0f} s ({a.threads} threads, BatchWriteItem of 25)")
    runs = []
    previous: list[str] = []
    for k in (int(x) for x in a.expired.split(",")):
        if previous:
            env.batch_write([{"DeleteRequest": {"Key": {"TaskId": {"S": t}}}} for t in previous])
        now_ms = int(time.time() * 1000)
        ids = [f"expired-{k}-{i:04d}" for i in range(k)]
        env.batch_write([
            {"PutRequest": {"Item": dict(in_flight, TaskId={"S": t}, Shard={"S": str(j % shards)},
                                         CompleteBy={"N": str(now_ms - 600_000)})}}
            for j, t in enumerate(ids)
        ])
        previous = ids
        env.reset()
        t1 = time.time()
        report = sasctl_sweep(env)
        secs = time.time() - t1
        rows = env.counters()["rows"]
        q = [r for r in rows if r["op"] == "Query"]
        run = {
            "expired": k, "report": report, "secs": round(secs, 2), "rows": rows,
            "requests": sum(r["requests"] for r in rows),
            "query_requests": sum(r["requests"] for r in q), "query_rcu": sum(r["rcu"] for r in q),
            "query_items": sum(r["items"] for r in q), "query_bytes": sum(r["bytes"] for r in q),
            "rcu": sum(r["rcu"] for r in rows), "wcu": sum(sum(r["wcu"].values()) for r in rows),
            "by_op": {f"{r['service']} {r['op']}": r["requests"] for r in rows},
        }
        runs.append(run)
        log(f"sweep with {k} expired: {run['requests']} requests, query RCU {run['query_rcu']}, report {report}")
    if previous:
        env.batch_write([{"DeleteRequest": {"Key": {"TaskId": {"S": t}}}} for t in previous])
    out["sweep_bench"] = {"finished_items": total, "load_secs": round(load_secs, 1), "threads": a.threads,
                          "finished_item_bytes": item_size(finished), "in_flight_item_bytes": item_size(in_flight),
                          "runs": runs}
    with open(a.json_out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n## Sweep with {total:,} finished tasks in the table (loaded in {load_secs:.0f} s)\n")
    print("| expired in-flight tasks | requests | Query requests | Query RCU | items read | bytes read | RCU total "
          "| WCU total | sweep report | secs |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in runs:
        print(f"| {r['expired']} | {r['requests']} | {r['query_requests']} | {fmt(r['query_rcu'])} "
              f"| {r['query_items']} | "
              f"{r['query_bytes']} | {fmt(r['rcu'])} | {r['wcu']} | {json.dumps(r['report'])} | {r['secs']} |")
    by_op = (f"K={r['expired']}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["by_op"].items())) for r in runs)
    print("\nRequests by operation: " + "; ".join(by_op))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["workloads", "sweep"])
    p.add_argument("--outputs", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--proxy", required=True)
    p.add_argument("--sasctl", required=True)
    p.add_argument("--json-out", default=".local/bench-cost.json")
    p.add_argument("--only", help="workloads to run, e.g. 1,3")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--quiet-timeout", type=float, default=240)
    p.add_argument("--settle", type=float, default=5)
    p.add_argument("--idle-secs", type=float, default=20)
    p.add_argument(
        "--runner-out", help="the local runner's stdout (JSON logs and EMF records), to count what seeing costs"
    )
    p.add_argument("--in-flight", help="sweep: a JSON file with an in-flight task item (DynamoDB JSON)")
    p.add_argument("--finished", type=int, default=100_000)
    p.add_argument("--expired", default="0,10,100")
    p.add_argument("--threads", type=int, default=8)
    a = p.parse_args(argv)
    return cmd_workloads(a) if a.cmd == "workloads" else cmd_sweep(a)


if __name__ == "__main__":
    sys.exit(main())
