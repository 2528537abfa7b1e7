#!/usr/bin/env python3
"""`sam local invoke` of the five functions against a stack on LocalStack, each fed a real message.

Run by infra/sam-local-invoke.sh (make sam-local-invoke), which starts the Docker engine, LocalStack
on the bridge address, the order service, and deploys the stack's resources first. Every event is a
message another role really sent, received from its queue and wrapped as Lambda's SQS event; every
function runs in a Lambda container by SAM CLI (the stand-in base image, infra/docker.sh), built by
`sam build` (.aws-sam/build). After each invocation the script checks what the function did in
LocalStack (the table, the queues, the order service's ledger) and says so.

  Task A (order-approval): Submitter (the submission; it claims the first step) -> Agent (approval:
  publishes the token to ApprovalTopic) -> the approver's answer on the callback queue -> Callback
  (applies it, dispatches reserve) -> Agent (inventory over HTTP) -> Scheduler (the result; dispatches
  charge) -> Agent -> Scheduler -> Agent (shipping) -> Scheduler: Processed, and the order service's
  ledger holds each effect once.
  Task B (sim-order): Submitter (claimed with no queue budget: CompleteBy in 5 s), its agent request
  never delivered -> after CompleteBy the Supervisor's scheduled event sweeps it and hands it to its
  timer queue -> Supervisor (that timer and the claim's own, in one batch): FailureCount 1, once
  -> Scheduler (the retry's delayed run message): attempt 2 on the agent queue.

Exit 0 when every check passed. Uses the tools venv's boto3 (SAM CLI's own dependency).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
from boto3.dynamodb.types import TypeDeserializer

IMAGE = "public.ecr.aws/lambda/provided:al2023"  # the stand-in (infra/docker.sh image)
DESERIALIZE = TypeDeserializer()  # numbers come back as Decimal
FUNCTIONS = ["SubmitterFunction", "SchedulerFunction", "AgentFunction", "SupervisorFunction", "CallbackFunction"]


class Check:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def __call__(self, ok: bool, what: str) -> bool:
        print(f"  {'PASS' if ok else 'FAIL'} {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
        return ok


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = json.loads(Path(args.outputs).read_text())
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.sqs = boto3.client("sqs")
        self.ddb = boto3.client("dynamodb")
        self.sns = boto3.client("sns")
        self.check = Check()
        self.n = 0
        self.invoked: dict[str, int] = {}
        self.env_file = self.work / "env.json"
        self.env_file.write_text(json.dumps({"Parameters": self.environment()}, indent=2) + "\n")

    # -- the functions' environment -------------------------------------------------------------
    def environment(self, **extra: str) -> dict[str, str]:
        """What the template's Globals (and the Agent's own variables) resolve to on this stack.

        SAM resolves a `!Ref` to a resource as its logical id locally; --env-vars gives the real
        names. Only variables the template declares are passed to the container."""
        o = self.out
        env = {
            "TASK_TABLE": o["TaskTableName"],
            "SUBMISSION_QUEUE_URL": o["SubmissionQueueUrl"],
            "SUBMISSION_DLQ_URL": o["SubmissionDlqUrl"],
            "SCHEDULER_QUEUE_URL": o["SchedulerQueueUrl"],
            "AGENT_QUEUE_URL": o["AgentQueueUrl"],
            "SUPERVISOR_QUEUE_URL": o["SupervisorQueueUrl"],
            "SCHEDULER_DLQ_URL": o["SchedulerDlqUrl"],
            "AGENT_DLQ_URL": o["AgentDlqUrl"],
            "SUPERVISOR_DLQ_URL": o["SupervisorDlqUrl"],
            "CALLBACK_QUEUE_URL": o["CallbackQueueUrl"],
            "CALLBACK_DLQ_URL": o["CallbackDlqUrl"],
            "ENDS_QUEUE_URL": o["EndsQueueUrl"],
            "REPLY_QUEUE_ARN_PATTERN": o["ReplyQueueArnPattern"],
            "ALERT_TOPIC_ARN": o["AlertTopicArn"],
            "APPROVAL_TOPIC_ARN": o["ApprovalTopicArn"],
            # No function URL on a stack without functions: approvers answer on the callback queue.
            "CALLBACK_URL": "",
            # LocalStack as the container reaches it (the template's EndpointUrl parameter).
            "AWS_ENDPOINT_URL": self.args.endpoint,
        }
        env.update(extra)
        return env

    # -- queues -----------------------------------------------------------------------------------
    def take(self, queue: str, want, what: str, timeout: float = 60.0, count: int = 1) -> list[dict]:
        """Receive (and delete) `count` messages of `queue` that `want(body)` accepts; the others
        are made visible again. Waits up to `timeout` for them."""
        url = self.out[queue]
        deadline = time.monotonic() + timeout
        got: list[dict] = []
        while True:
            r = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30,
                AttributeNames=["All"], MessageAttributeNames=["All"],
            )
            for m in r.get("Messages", []):
                if want(m["Body"]) and len(got) < count:
                    got.append(m)
                    self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                else:
                    self.sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                    )
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(got)} of {count} {what} on {queue} within {timeout:.0f} s")

    def event(self, queue: str, messages: list[dict]) -> dict:
        """Lambda's SQS event for these messages, as the event source mapping builds it."""
        arn = self.out[queue.replace("Url", "Arn")]
        return {"Records": [{
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": m.get("Attributes", {}),
            "messageAttributes": {},
            "md5OfBody": hashlib.md5(m["Body"].encode()).hexdigest(),
            "eventSource": "aws:sqs",
            "eventSourceARN": arn,
            "awsRegion": os.environ.get("AWS_REGION", "us-east-1"),
        } for m in messages]}

    # -- sam local invoke -------------------------------------------------------------------------
    def invoke(self, function: str, event: dict, env_file: Path | None = None) -> dict:
        self.n += 1
        self.invoked[function] = self.invoked.get(function, 0) + 1
        path = self.work / f"{self.n:02d}-{function}.json"
        path.write_text(json.dumps(event, indent=2) + "\n")
        cmd = [
            "sam", "local", "invoke", function,
            "--event", str(path.relative_to(self.args.root)),
            "--env-vars", str((env_file or self.env_file).relative_to(self.args.root)),
            "--parameter-overrides", f"EndpointUrl={self.args.endpoint} OrderServiceUrl={self.args.order_service_url}",
            "--invoke-image", IMAGE, "--skip-pull-image",
        ]
        print(f"\n[{self.n:02d}] $ {shlex.join(cmd)}", flush=True)
        start = time.monotonic()
        p = subprocess.run(cmd, cwd=self.args.root, capture_output=True, text=True, timeout=300, check=False)
        took = time.monotonic() - start
        log = self.work / f"{self.n:02d}-{function}.log"
        log.write_text(p.stderr + "\n--- stdout ---\n" + p.stdout)
        answer = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        print(f"     {took:.1f} s; answer {answer or '(none)'}  (log {log.relative_to(self.args.root)})", flush=True)
        if p.returncode != 0 or not answer:
            print(p.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"sam local invoke {function} failed (exit {p.returncode})")
        try:
            resp = json.loads(answer)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{function} answered something that is not JSON: {answer[:300]}") from exc
        if isinstance(resp, dict) and "errorType" in resp:
            raise SystemExit(f"{function} failed: {resp}")
        return resp

    # -- the table --------------------------------------------------------------------------------
    def task(self, task_id: str) -> dict:
        key = {"TaskId": {"S": task_id}}
        item = self.ddb.get_item(TableName=self.out["TaskTableName"], Key=key, ConsistentRead=True).get("Item")
        if not item:
            return {}
        return {k: DESERIALIZE.deserialize(v) for k, v in item.items()}

    def ledger(self, order: str) -> list[str]:
        """The operations the order service applied for this order, in order."""
        with urllib.request.urlopen(f"{self.args.order_service_local_url}/ledger?order={order}", timeout=5) as r:
            return [e["op"] for e in json.loads(r.read())["entries"]]


def of_task(task_id: str, *types: str):
    def want(body: str) -> bool:
        try:
            m = json.loads(body)
        except json.JSONDecodeError:
            return False
        return m.get("task_id") == task_id and (not types or m.get("type") in types)
    return want


def steps(task: dict) -> list[str]:
    return [s.get("status", "?") for s in task.get("Steps", [])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--outputs", required=True, help="the stack's outputs (sasctl deploy-local)")
    ap.add_argument("--endpoint", required=True, help="LocalStack as the containers reach it")
    ap.add_argument("--order-service-url", required=True, help="the order service as the containers reach it")
    ap.add_argument("--order-service-local-url", required=True, help="the order service as this script reaches it")
    ap.add_argument("--work", required=True, help="where events, env files and logs go")
    args = ap.parse_args()
    r = Run(args)
    c = r.check
    run_id = uuid.uuid4().hex[:6]

    # The approver's inbox: a queue subscribed to ApprovalTopic (on AWS, an email subscription).
    inbox = r.sqs.create_queue(QueueName=f"sam-local-approvals-{run_id}")["QueueUrl"]
    inbox_arn = r.sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    r.sns.subscribe(TopicArn=r.out["ApprovalTopicArn"], Protocol="sqs", Endpoint=inbox_arn)
    r.out["InboxUrl"], r.out["InboxArn"] = inbox, inbox_arn

    a, b = f"samlocal-{run_id}-approval", f"samlocal-{run_id}-lost"
    print(f"task A {a} (order-approval), task B {b} (sim-order)")

    # 1. Submitter: A's submission, as a caller sends it. It creates the task, claims the first
    # step and dispatches it to the agent queue itself (with its deadline timer).
    r.sqs.send_message(QueueUrl=r.out["SubmissionQueueUrl"], MessageBody=json.dumps(
        {"v": 1, "task_id": a, "workflow": "order-approval", "input": {"order": a, "amount": 1250}}))
    sub = r.take("SubmissionQueueUrl", lambda body: a in body, "A's submission")
    resp = r.invoke("SubmitterFunction", r.event("SubmissionQueueUrl", sub))
    c(resp == {"batchItemFailures": []}, f"Submitter answered {resp}")
    ta = r.task(a)
    c([s.get("name") for s in ta.get("Steps", [])] == ["approve", "reserve", "charge", "ship"],
      f"Submitter created task A with order-approval's four steps (steps {steps(ta)})")
    c(bool(ta.get("LockedBy")) and steps(ta)[0] == "running",
      f"Submitter claimed the approve step (LockedBy set, steps {steps(ta)})")
    req = r.take("AgentQueueUrl", of_task(a), "agent request of A's approve")
    c(json.loads(req[0]["Body"]).get("callback") is not None,
      "Submitter sent the approve step to the agent queue, with its callback token")

    # 2. Agent: the approval kind publishes the token to ApprovalTopic (the approver's inbox).
    resp = r.invoke("AgentFunction", r.event("AgentQueueUrl", req))
    c(resp == {"batchItemFailures": []}, f"Agent answered {resp}")
    note = r.take("InboxUrl", lambda body: a in body, "approval request in the approver's inbox")
    message = json.loads(note[0]["Body"]).get("Message", "")
    approve = next(
        (line.split("approve:", 1)[1].strip() for line in message.splitlines() if line.strip().startswith("approve:")),
        None,
    )
    c(approve is not None, "Agent published the approval request, with the answer to send, to ApprovalTopic")

    # 3. Callback: the approver's answer, sent to the callback queue as the message says. The
    # Callback function applies it and dispatches the next step.
    r.sqs.send_message(QueueUrl=r.out["CallbackQueueUrl"], MessageBody=approve)
    answer = r.take("CallbackQueueUrl", lambda body: True, "the approver's answer")
    resp = r.invoke("CallbackFunction", r.event("CallbackQueueUrl", answer))
    c(resp == {"batchItemFailures": []}, f"Callback answered {resp}")
    ta = r.task(a)
    c(steps(ta)[:2] == ["succeeded", "running"],
      f"Callback applied the approval and claimed reserve (steps {steps(ta)})")

    # 4..9. Agent and Scheduler in turn: reserve, charge, ship over HTTP to the order service;
    # the Scheduler applies each result and dispatches the next step.
    for i, step in enumerate(["reserve", "charge", "ship"], start=1):
        req = r.take("AgentQueueUrl", of_task(a), f"agent request of {step}")
        resp = r.invoke("AgentFunction", r.event("AgentQueueUrl", req))
        c(resp == {"batchItemFailures": []}, f"Agent answered {resp} for {step}")
        result = r.take("SchedulerQueueUrl", of_task(a), f"{step}'s result")
        c(json.loads(result[0]["Body"]).get("type") == "result", f"Agent sent {step}'s result to the scheduler queue")
        resp = r.invoke("SchedulerFunction", r.event("SchedulerQueueUrl", result))
        c(resp == {"batchItemFailures": []}, f"Scheduler answered {resp}")
        ta = r.task(a)
        c(steps(ta)[i] == "succeeded", f"Scheduler applied {step}'s result (steps {steps(ta)})")
    c(ta.get("ProcessState") == "Processed", f"task A is {ta.get('ProcessState')}")
    ops = r.ledger(a)
    c(ops == ["reserve", "charge", "ship"], f"the order service applied each of A's effects once: {ops}")

    # 10. Supervisor: B submitted with no queue budget (CompleteBy = claim + 5 s); its agent
    # request is never delivered. After CompleteBy the scheduled sweep (no grace, no lag) finds it.
    no_budget = r.work / "env-no-queue-budget.json"
    no_budget.write_text(json.dumps({"Parameters": r.environment(QUEUE_BUDGET_MS="0")}, indent=2) + "\n")
    r.sqs.send_message(QueueUrl=r.out["SubmissionQueueUrl"], MessageBody=json.dumps(
        {"v": 1, "task_id": b, "workflow": "sim-order", "input": {}}))
    sub = r.take("SubmissionQueueUrl", lambda body: b in body, "B's submission")
    r.invoke("SubmitterFunction", r.event("SubmissionQueueUrl", sub), no_budget)
    tb = r.task(b)
    c(steps(tb)[:1] == ["running"] and bool(tb.get("CompleteBy")),
      f"Submitter claimed B's reserve (CompleteBy {tb.get('CompleteBy')})")
    r.take("AgentQueueUrl", of_task(b), "agent request of B (dropped: the lost attempt)")
    wait = max(0.0, int(tb.get("CompleteBy", 0)) / 1000 - time.time()) + 1.0
    print(f"     waiting {wait:.1f} s for B's CompleteBy to pass", flush=True)
    time.sleep(wait)
    sweep_now = r.work / "env-sweep-now.json"
    parameters = r.environment(RESULT_GRACE_MS="0", SWEEP_LAG_MS="0")
    sweep_now.write_text(json.dumps({"Parameters": parameters}, indent=2) + "\n")
    scheduled = json.loads((args.root / "events/supervisor-scheduled.json").read_text())
    resp = r.invoke("SupervisorFunction", scheduled, sweep_now)
    c(isinstance(resp, dict) and resp.get("expired", 0) >= 1 and resp.get("errors") == 0,
      f"the Supervisor's scheduled sweep found B's expired attempt: {resp}")
    # The sweep handed B to the timer queue: beside the deadline timer the Submitter sent with
    # the claim, a second timer for B. Both in one batch, as SQS may deliver them: the Supervisor
    # applies the expiry once.
    timers = r.take("SupervisorQueueUrl", of_task(b), "timers of B (the claim's and the sweep's)", count=2)
    c(len(timers) == 2,
      f"the supervisor queue holds B's two timers, the claim's and the sweep's: {[t['Body'] for t in timers]}")
    resp = r.invoke("SupervisorFunction", r.event("SupervisorQueueUrl", timers))
    c(resp == {"batchItemFailures": []}, f"Supervisor answered {resp}")
    tb = r.task(b)
    c(tb.get("FailureCount") == 1,
      f"task B's FailureCount is {tb.get('FailureCount')}: the expired attempt counted once (steps {steps(tb)})")
    # The retry waits out its backoff as a delayed run message; the Scheduler claims attempt 2.
    run = r.take("SchedulerQueueUrl", of_task(b, "run"), "B's retry (a delayed run message)", timeout=30)
    resp = r.invoke("SchedulerFunction", r.event("SchedulerQueueUrl", run))
    c(resp == {"batchItemFailures": []}, f"Scheduler answered {resp}")
    retry = r.take("AgentQueueUrl", of_task(b), "B's retry of reserve", timeout=30)
    attempt = json.loads(retry[0]["Body"]).get("attempt_no")
    c(attempt == 2, f"B's reserve is retried: attempt {attempt} on the agent queue")

    c(all(r.invoked.get(f, 0) >= 1 for f in FUNCTIONS), f"every function ran under sam local invoke: {r.invoked}")
    print(f"\nsam local invoke: {c.passed} checks passed, {len(c.failed)} failed, {r.n} invocations")
    for f in c.failed:
        print(f"  failed: {f}")
    return 0 if not c.failed else 1


if __name__ == "__main__":
    sys.exit(main())
