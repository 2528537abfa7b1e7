#!/usr/bin/env python3
"""Checks of the `host` Lambda executor (infra/lambda-executor/) against a running LocalStack.

Run by infra/lambda-check.sh with the LocalStack venv's Python (it has boto3), after
`source infra/env.sh` (AWS_ENDPOINT_URL and the test credentials). It creates functions from zips
with a Python or shell `bootstrap` that speaks the Lambda Runtime API (no Rust build needed) and
checks what the project relies on:

    invoke, warm reuse, a function error, a timeout and the fresh runtime after it, a crash,
    two kinds of init failure, one runtime per concurrent invocation, CloudWatch Logs (text and
    JSON format), an SQS event source mapping with ReportBatchItemFailures, and a scheduled
    EventBridge rule.

Every check prints `  PASS <what>` or `  FAIL <what>: <why>`; the exit status is 1 when any check
failed. Everything created carries one random prefix and is deleted at the end, also on failure.
LocalStack's scheduler fires `rate(1 minute)` rules on a 59.9 s loop that started with LocalStack,
so the first fire comes 0-60 s after the rule is created: the rule is created first and the other
checks run meanwhile.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import contextlib
import io
import json
import os
import sys
import time
import urllib.request
import uuid
import zipfile

import boto3
from botocore.config import Config

ENDPOINT = os.environ.get("AWS_ENDPOINT_URL", "http://localhost:4566")
PREFIX = f"lambda-check-{uuid.uuid4().hex[:6]}"
T0 = time.monotonic()
PASSED: list[str] = []
FAILED: list[str] = []

# The Python bootstrap: a Lambda runtime in ~50 lines, driven by the event.
#   {"action": "echo"|"fail"|"sleep"|"crash", "seconds": N}; SQS batches (a record whose body
#   starts with "fail" is reported in batchItemFailures); EventBridge scheduled events.
#   CHECK_INIT=init-error makes it POST /runtime/init/error instead of initialising.
PY_BOOTSTRAP = r"""#!{python}
import json, os, sys, time, urllib.request

API = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"


def call(method, path, body=None, headers=None):
    req = urllib.request.Request(API + path, data=body, method=method, headers=headers or {{}})
    with urllib.request.urlopen(req) as resp:
        return resp.headers, resp.read()


print(f"init pid={{os.getpid()}}", flush=True)
if os.environ.get("CHECK_INIT") == "init-error":
    doc = {{"errorType": "Check.ConfigError", "errorMessage": "CHECK_INIT asked for an init error"}}
    call("POST", "/init/error", json.dumps(doc).encode(), {{"Lambda-Runtime-Function-Error-Type": "Check.ConfigError"}})
    sys.exit(1)
while True:
    headers, body = call("GET", "/invocation/next")
    rid = headers["Lambda-Runtime-Aws-Request-Id"]
    event = json.loads(body or b"null")
    action = event.get("action", "-") if isinstance(event, dict) else "-"
    print(f"handling {{rid}} action={{action}}", flush=True)
    if action == "fail":
        doc = {{"errorType": "Check.Failed", "errorMessage": "asked to fail"}}
        call("POST", f"/invocation/{{rid}}/error", json.dumps(doc).encode())
        continue
    if action == "sleep":
        time.sleep(float(event["seconds"]))
    if action == "crash":
        print("crashing on purpose", flush=True)
        os._exit(7)
    if isinstance(event, dict) and "Records" in event:
        failures = []
        for record in event["Records"]:
            print(f"record body={{record['body']}}", flush=True)
            if record["body"].startswith("fail"):
                failures.append({{"itemIdentifier": record["messageId"]}})
        result = {{"batchItemFailures": failures}}
    elif isinstance(event, dict) and event.get("detail-type") == "Scheduled Event":
        print(f"scheduled event from {{event.get('resources')}}", flush=True)
        result = {{"scheduled": True}}
    else:
        result = {{
            "echo": event,
            "pid": os.getpid(),
            "marker": os.environ.get("CHECK_MARKER"),
            "endpoint": os.environ.get("AWS_ENDPOINT_URL"),
        }}
    call("POST", f"/invocation/{{rid}}/response", json.dumps(result).encode())
"""

# A shell bootstrap that fails its init the way a misconfigured binary does.
SH_INIT_EXIT = """#!/bin/sh
echo "init: required setting CHECK_TABLE is missing" >&2
exit 3
"""


def client(service: str):
    return boto3.client(
        service,
        endpoint_url=ENDPOINT,
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        config=Config(read_timeout=60, retries={"max_attempts": 2, "mode": "standard"}),
    )


lam, sqs, events, iam, logs = (client(s) for s in ("lambda", "sqs", "events", "iam", "logs"))


def note(text: str) -> None:
    print(f"  note [{time.monotonic() - T0:5.1f}s] {text}", flush=True)


def check(ok: bool, what: str, why: str = "") -> bool:
    if ok:
        print(f"  PASS {what}", flush=True)
        PASSED.append(what)
    else:
        print(f"  FAIL {what}: {why or 'no reason given'}", flush=True)
        FAILED.append(what)
    return ok


def zip_of(bootstrap: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("bootstrap")
        info.external_attr = 0o100755 << 16  # regular file, rwxr-xr-x
        info.create_system = 3  # Unix, so that the mode counts
        zf.writestr(info, bootstrap)
    return buf.getvalue()


class Resources:
    """Everything the checks create, deleted by cleanup() in reverse order of kind."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.mappings: list[str] = []
        self.queues: list[str] = []
        self.rules: list[str] = []
        self.roles: list[str] = []

    def cleanup(self) -> None:
        problems = []

        def attempt(what, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - keep cleaning up
                if "NotFound" not in type(exc).__name__ and "NonExistent" not in str(exc):
                    problems.append(f"{what}: {exc}")

        for rule in self.rules:
            attempt(f"rule {rule} targets", events.remove_targets, Rule=rule, Ids=["fn"])
            attempt(f"rule {rule}", events.delete_rule, Name=rule)
        for uuid_ in self.mappings:
            attempt(f"mapping {uuid_}", lam.delete_event_source_mapping, UUID=uuid_)
        for name in self.functions:
            attempt(f"function {name}", lam.delete_function, FunctionName=name)
            attempt(f"log group of {name}", logs.delete_log_group, logGroupName=f"/aws/lambda/{name}")
        for url in self.queues:
            attempt(f"queue {url}", sqs.delete_queue, QueueUrl=url)
        for role in self.roles:
            attempt(f"role {role}", iam.delete_role, RoleName=role)
        if problems:
            print("  cleanup problems:\n    " + "\n    ".join(problems), flush=True)
        else:
            note(
                f"cleaned up: {len(self.functions)} functions, {len(self.mappings)} mapping, "
                f"{len(self.queues)} queues, {len(self.rules)} rule, {len(self.roles)} role"
            )


R = Resources()


def create_role() -> str:
    name = f"{PREFIX}-role"
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    R.roles.append(name)
    return arn


def create_function(role: str, suffix: str, code: bytes, timeout: int = 3, env=None, json_logs=False) -> str:
    name = f"{PREFIX}-{suffix}"
    kwargs = {}
    if json_logs:
        kwargs["LoggingConfig"] = {"LogFormat": "JSON", "ApplicationLogLevel": "INFO", "SystemLogLevel": "INFO"}
    lam.create_function(
        FunctionName=name,
        Runtime="provided.al2023",
        Handler="bootstrap",
        Role=role,
        Code={"ZipFile": code},
        Timeout=timeout,
        MemorySize=128,
        Architectures=["x86_64" if os.uname().machine == "x86_64" else "arm64"],
        Environment={"Variables": env or {}},
        **kwargs,
    )
    R.functions.append(name)
    lam.get_waiter("function_active_v2").wait(FunctionName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60})
    return name


def invoke(name: str, event, tail: bool = False) -> dict:
    started = time.monotonic()
    resp = lam.invoke(FunctionName=name, Payload=json.dumps(event).encode(), LogType="Tail" if tail else "None")
    body = resp["Payload"].read().decode()
    out = {
        "seconds": time.monotonic() - started,
        "error": resp.get("FunctionError"),
        "body": body,
        "log": base64.b64decode(resp["LogResult"]).decode() if tail and resp.get("LogResult") else "",
    }
    try:
        out["json"] = json.loads(body)
    except ValueError:
        out["json"] = None
    return out


def log_messages(name: str, since_ms: int) -> list[str]:
    try:
        pages = logs.get_paginator("filter_log_events").paginate(logGroupName=f"/aws/lambda/{name}", startTime=since_ms)
        return [e["message"].rstrip("\n") for page in pages for e in page["events"]]
    except logs.exceptions.ResourceNotFoundException:
        return []


def wait_for(predicate, timeout_s: float, every_s: float = 0.5):
    """Poll predicate() until it returns something truthy or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every_s)


def short(text: str, limit: int = 160) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "..."


# -- checks --------------------------------------------------------------------------------------


def check_invoke(fn: str) -> None:
    r = invoke(fn, {"action": "echo", "hello": "world"})
    body = r["json"] or {}
    check(
        r["error"] is None and body.get("echo") == {"action": "echo", "hello": "world"},
        "invoke returns the function's result",
        short(r["body"]),
    )
    check(body.get("marker") == "from-function-env", "the function's Environment reaches the process", short(r["body"]))
    expected = ENDPOINT.replace("localhost", "127.0.0.1").rstrip("/")
    check(
        (body.get("endpoint") or "").rstrip("/") == expected,
        "AWS_ENDPOINT_URL points the function at this LocalStack",
        f"{body.get('endpoint')} (expected {expected})",
    )
    r2 = invoke(fn, {"action": "echo", "n": 2})
    check(
        (r2["json"] or {}).get("pid") == body.get("pid"), "a warm invoke reuses the runtime process", short(r2["body"])
    )


def check_function_error(fn: str) -> None:
    r = invoke(fn, {"action": "fail"})
    doc = r["json"] or {}
    check(
        r["error"] == "Unhandled"
        and doc.get("errorType") == "Check.Failed"
        and doc.get("errorMessage") == "asked to fail",
        "a function error -> FunctionError Unhandled with the runtime's error document",
        f"FunctionError={r['error']} body={short(r['body'])}",
    )


def check_timeout(fn: str) -> None:
    pid_before = (invoke(fn, {"action": "echo"})["json"] or {}).get("pid")
    r = invoke(fn, {"action": "sleep", "seconds": 10}, tail=True)  # the function's Timeout is 2 s
    message = (r["json"] or {}).get("errorMessage", "")
    check(
        r["error"] == "Unhandled" and "Task timed out after 2.00 seconds" in message and r["seconds"] < 5,
        "the function's Timeout is enforced (Task timed out after 2.00 seconds)",
        f"after {r['seconds']:.1f} s: FunctionError={r['error']} body={short(r['body'])}",
    )
    check(
        "Task timed out after 2.00 seconds" in r["log"] and "Status: timeout" in r["log"],
        "the timeout is in the function's log (timed-out line, REPORT Status: timeout)",
        short(r["log"][-400:], 400),
    )
    r2 = invoke(fn, {"action": "echo", "after": "timeout"})
    pid_after = (r2["json"] or {}).get("pid")
    check(
        r2["error"] is None and pid_after and pid_after != pid_before,
        "the next invoke gets a fresh runtime after a timeout",
        f"pid before {pid_before}, after {pid_after}; body={short(r2['body'])}",
    )


def check_crash(fn: str) -> None:
    r = invoke(fn, {"action": "crash"}, tail=True)
    doc = r["json"] or {}
    check(
        r["error"] == "Unhandled"
        and doc.get("errorType") == "Runtime.ExitError"
        and "exit status 7" in doc.get("errorMessage", ""),
        "a crash during an invocation -> Runtime.ExitError (exit status 7)",
        f"FunctionError={r['error']} body={short(r['body'])}",
    )
    check(
        "crashing on purpose" in r["log"] and "Error Type: Runtime.ExitError" in r["log"],
        "the crash's output and REPORT Status: error are in the function's log",
        short(r["log"][-400:], 400),
    )
    r2 = invoke(fn, {"action": "echo", "after": "crash"})
    check(r2["error"] is None, "the next invoke gets a fresh runtime after a crash", short(r2["body"]))


def check_init_exit(fn: str) -> None:
    r = invoke(fn, {"action": "echo"}, tail=True)
    doc = r["json"] or {}
    check(
        r["error"] == "Unhandled"
        and doc.get("errorType") == "Runtime.ExitError"
        and "exit status 3" in doc.get("errorMessage", ""),
        "init failure (bootstrap exits) -> Runtime.ExitError (exit status 3)",
        f"FunctionError={r['error']} body={short(r['body'])}",
    )
    check(
        "CHECK_TABLE is missing" in r["log"] and "INIT_REPORT" in r["log"],
        "the init failure's output and INIT_REPORT are in the function's log",
        short(r["log"][-400:], 400),
    )


def check_init_error(fn: str) -> None:
    r = invoke(fn, {"action": "echo"})
    doc = r["json"] or {}
    check(
        r["error"] == "Unhandled" and doc.get("errorType") == "Check.ConfigError",
        "init failure (POST /runtime/init/error) -> the runtime's error document",
        f"FunctionError={r['error']} body={short(r['body'])}",
    )


def check_concurrency(fn: str) -> None:
    with cf.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: invoke(fn, {"action": "sleep", "seconds": 1, "i": i}), range(3)))
    pids = {(r["json"] or {}).get("pid") for r in results}
    check(
        all(r["error"] is None for r in results) and len(pids) == 3,
        "3 concurrent invokes run in 3 runtime processes",
        f"pids {sorted(map(str, pids))}, errors {[r['error'] for r in results]}",
    )


def check_logs(fn: str, since_ms: int) -> None:
    r = invoke(fn, {"action": "echo", "logs": True})

    def found():
        messages = log_messages(fn, since_ms)
        handled = [m for m in messages if m.startswith("handling ")]
        if not handled:
            return None
        rid = handled[-1].split()[1]  # the last invocation: this one
        wanted = [f"START RequestId: {rid}", f"handling {rid}", f"END RequestId: {rid}", f"REPORT RequestId: {rid}"]
        positions = [next((i for i, m in enumerate(messages) if m.startswith(w)), -1) for w in wanted]
        return positions if all(p >= 0 for p in positions) else None

    positions = wait_for(found, 10)
    check(
        r["error"] is None and bool(positions) and positions == sorted(positions),
        "output and START/END/REPORT lines are in CloudWatch Logs /aws/lambda/<fn>, in order",
        f"positions {positions}; group has {len(log_messages(fn, since_ms))} events",
    )


def check_json_logs(fn: str) -> None:
    r = invoke(fn, {"action": "echo"}, tail=True)
    kinds = []
    for line in r["log"].splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            kinds.append(json.loads(line).get("type"))
    check(
        r["error"] is None and "platform.start" in kinds and "platform.report" in kinds,
        "LoggingConfig LogFormat JSON -> platform.start/platform.report JSON records",
        f"types {kinds}; log {short(r['log'][-300:], 300)}",
    )


def check_sqs(role_fn: str) -> None:
    dlq = sqs.create_queue(QueueName=f"{PREFIX}-dlq")["QueueUrl"]
    R.queues.append(dlq)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue = sqs.create_queue(
        QueueName=f"{PREFIX}-q",
        Attributes={
            "VisibilityTimeout": "2",  # a failed record comes back after 2 s
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"}),
        },
    )["QueueUrl"]
    R.queues.append(queue)
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    mapping = lam.create_event_source_mapping(
        EventSourceArn=queue_arn,
        FunctionName=role_fn,
        BatchSize=10,
        FunctionResponseTypes=["ReportBatchItemFailures"],
    )["UUID"]
    R.mappings.append(mapping)
    wait_for(lambda: lam.get_event_source_mapping(UUID=mapping)["State"] == "Enabled", 15)
    since_ms = int(time.time() * 1000) - 1000
    tag = uuid.uuid4().hex[:6]
    bodies = [f"ok-1-{tag}", f"ok-2-{tag}", f"fail-3-{tag}"]
    sqs.send_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)])
    started = time.monotonic()

    def dead_lettered():
        msgs = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=1, VisibilityTimeout=60).get("Messages", [])
        return [m["Body"] for m in msgs]

    in_dlq = wait_for(dead_lettered, 40, every_s=0)
    note(f"SQS: the failing record reached the DLQ after {time.monotonic() - started:.1f} s")

    def deliveries():
        messages = log_messages(role_fn, since_ms)
        return {b: sum(1 for m in messages if m == f"record body={b}") for b in bodies}

    counts = wait_for(lambda: (lambda c: c if c[bodies[2]] >= 2 and c[bodies[0]] >= 1 else None)(deliveries()), 10)
    counts = counts or deliveries()
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    left = int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])
    check(
        counts[bodies[0]] == 1
        and counts[bodies[1]] == 1
        and counts[bodies[2]] == 2
        and in_dlq == [bodies[2]]
        and left == 0,
        "SQS event source with ReportBatchItemFailures: only the failed record is redelivered (then dead-lettered)",
        f"deliveries {counts}, DLQ {in_dlq}, left in queue {left}",
    )


def start_schedule(fn: str) -> tuple[str, float, int]:
    arn = lam.get_function(FunctionName=fn)["Configuration"]["FunctionArn"]
    rule = f"{PREFIX}-tick"
    rule_arn = events.put_rule(Name=rule, ScheduleExpression="rate(1 minute)", State="ENABLED")["RuleArn"]
    R.rules.append(rule)
    lam.add_permission(
        FunctionName=fn,
        StatementId="events",
        Action="lambda:InvokeFunction",
        Principal="events.amazonaws.com",
        SourceArn=rule_arn,
    )
    events.put_targets(Rule=rule, Targets=[{"Id": "fn", "Arn": arn}])
    try:  # LocalStack's scheduler loop ticks every 59.9 s from (about) its start
        with urllib.request.urlopen(f"{ENDPOINT}/_localstack/info", timeout=5) as resp:
            uptime = float(json.load(resp)["uptime"])
        note(f"scheduled rule created; LocalStack up {uptime:.0f} s: its next tick in ~{59.9 - uptime % 59.9:.0f} s")
    except (OSError, ValueError, KeyError):
        pass
    return rule, time.monotonic(), int(time.time() * 1000) - 1000


def check_schedule(fn: str, created: float, since_ms: int) -> None:
    def fired():
        return [m for m in log_messages(fn, since_ms) if m.startswith("scheduled event from")]

    left = 75 - (time.monotonic() - created)
    note(f"waiting up to {max(0, left):.0f} s more for the scheduled rule (LocalStack fires it 0-60 s after creation)")
    seen = wait_for(fired, max(0.0, left), every_s=1)
    took = time.monotonic() - created
    check(
        bool(seen),
        "a scheduled EventBridge rule (rate(1 minute)) invokes the function",
        f"no Scheduled Event in /aws/lambda/{fn} {took:.0f} s after the rule was created",
    )
    if seen:
        note(f"scheduled rule: first invocation seen {took:.1f} s after the rule was created")


def main() -> int:
    print(f"Lambda checks against {ENDPOINT} (prefix {PREFIX})", flush=True)
    try:
        role = create_role()
        py = zip_of(PY_BOOTSTRAP.format(python=sys.executable))
        specs = {
            "tick": {"code": py},
            "fn": {"code": py, "timeout": 2, "env": {"CHECK_MARKER": "from-function-env"}},
            "json": {"code": py, "json_logs": True},
            "initexit": {"code": zip_of(SH_INIT_EXIT)},
            "initerr": {"code": py, "env": {"CHECK_INIT": "init-error"}},
            "sqs": {"code": py, "timeout": 5},
        }
        with cf.ThreadPoolExecutor(len(specs)) as pool:
            futures = {k: pool.submit(create_function, role, k, **v) for k, v in specs.items()}
            names = {k: f.result() for k, f in futures.items()}
        note(f"{len(names)} functions Active")
        _, created, tick_since = start_schedule(names["tick"])
        since_ms = int(time.time() * 1000) - 1000
    except Exception as exc:  # noqa: BLE001 - report, clean up what exists, fail
        check(False, "set-up (role, functions, rule)", f"{type(exc).__name__}: {exc}")
        R.cleanup()
        return 1

    steps = [
        ("invoke", lambda: check_invoke(names["fn"])),
        ("function error", lambda: check_function_error(names["fn"])),
        ("timeout", lambda: check_timeout(names["fn"])),
        ("crash", lambda: check_crash(names["fn"])),
        ("init exit", lambda: check_init_exit(names["initexit"])),
        ("init error", lambda: check_init_error(names["initerr"])),
        ("concurrency", lambda: check_concurrency(names["fn"])),
        ("logs", lambda: check_logs(names["fn"], since_ms)),
        ("json logs", lambda: check_json_logs(names["json"])),
        ("sqs", lambda: check_sqs(names["sqs"])),
        ("schedule", lambda: check_schedule(names["tick"], created, tick_since)),
    ]
    try:
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - one broken step must not hide the others
                check(False, f"{what} (step raised)", f"{type(exc).__name__}: {exc}")
    finally:
        R.cleanup()
    print(f"  note [{time.monotonic() - T0:5.1f}s] done", flush=True)
    print(f"lambda-check: {len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
