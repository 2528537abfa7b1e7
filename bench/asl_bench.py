#!/usr/bin/env python3
"""Three Step Functions state machines of the collection, translated, for `make bench-cost` (stdlib only).

  asl_bench.py serve ...    what a sim agent cannot stand for: the recommendation the Choice of
                            lambda-orchestration reads ("buy", an HTTP stub) and the human who
                            approves (reads the approval queue, answers each token on the stack's
                            callback queue); writes its URL and the approval queue's to --info
  asl_bench.py config ...   `sasctl import-asl` of the three, every imported agent a `sim` agent
                            (but the two above), merged into the runner's workflows and agents
                            files (SAS_WORKFLOWS_FILE, SAS_AGENTS_FILE), then `sasctl validate`

bench/cost.sh runs both before it starts the runner. See bench/README.md ("The translated state
machines").
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cost_proxy import Upstream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTION = os.path.join(ROOT, "crates/cli/tests/data/asl-collection")

# workflow name -> the collection's file (the workflow is named after the file it is imported from)
MACHINES = {
    "asl-chain": "chain-of-responsibility_statemachine_atm_dispenser_chained.asl.json",
    "asl-saga": "saga-pattern-sam_statemachine_statemachine.asl.json",
    "asl-orchestration": "lambda-orchestration-sam_statemachine_statemachine.asl.json",
    # a Distributed Map over a CSV in S3 (ItemReader), each row put to DynamoDB by a processor
    # of one task (a workflow of its own per row: its ResultPath)
    "asl-s3map": "distributed-map-csv-iterator-tf_statemachines_statemachine.asl.json",
}
# The bucket the s3_items agent writes its pages to (the agents' ${MAP_BUCKET}), and the one the
# benchmark puts the CSV in; both made by cost_bench.py, the runner given MAP_BUCKET.
MAP_BUCKET = "sas-bench-map-pages"
SOURCE_BUCKET = "sas-bench-map-source"
# lambda-orchestration: the step whose answer the Choice "Buy or Sell?" compares with "buy" and
# "sell" (a sim agent answers an object: no rule would hold, the task would fail), and the
# approval (sqs:sendMessage.waitForTaskToken: a sim agent would hand over to no one).
RECOMMEND_STEP = ("asl-orchestration", "Generate_Buy_Sell_recommendation")
APPROVAL_STATE = "Request Human Approval"
APPROVAL_STEP = ("asl-orchestration", "Request_Human_Approval")
# The approval has no TimeoutSeconds (365 days here): its deadline timer would fire 15 minutes
# (SQS's longest delay) after the task ended. Its cost is the same whenever it fires; with 60 s
# it fires within the benchmark's wait, as every other timer does.
APPROVAL_TIMEOUT_S = 60
# Kinds that call nothing outside the stack: kept as imported.
OWN_KINDS = {"fail"}


def reads_s3(spec: dict) -> bool:
    """An agent of the map over S3 (its reader, its pages' reads): kept as imported, S3 counted."""
    return spec.get("kind") == "s3_items" or (spec.get("kind") == "aws" and spec.get("service") == "s3")


def log(msg: str):
    print(f"asl-bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------


def definitions(approval_timeout_s: int = APPROVAL_TIMEOUT_S) -> dict[str, dict]:
    """The three definitions as the benchmark imports them (the approval given a timeout)."""
    out = {}
    for name, file in MACHINES.items():
        with open(os.path.join(COLLECTION, file)) as f:
            d = json.load(f)
        state = d["States"].get(APPROVAL_STATE)
        if state is not None and "TimeoutSeconds" not in state:
            state["TimeoutSeconds"] = approval_timeout_s
        out[name] = d
    return out


def import_asl(sasctl: str, defs: dict[str, dict], tmp: str) -> tuple[list[dict], dict]:
    """`sasctl import-asl` of the definitions: (workflows, agents file)."""
    files = []
    for name, d in defs.items():
        path = os.path.join(tmp, f"{name}.asl.json")
        with open(path, "w") as f:
            json.dump(d, f)
        files.append(path)
    wf, ag = os.path.join(tmp, "imported-workflows.json"), os.path.join(tmp, "imported-agents.json")
    # Exits 1 since the definitions' ${...} variables are not set: the agents that need them are
    # replaced below, and the merged files are checked by `sasctl validate`.
    p = subprocess.run([sasctl, "import-asl", *files, "--workflows", wf, "--agents", ag],
                       check=False, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if not (os.path.exists(wf) and os.path.exists(ag)):
        raise SystemExit(f"sasctl import-asl wrote nothing (exit {p.returncode}):\n{out}")
    with open(wf) as f:
        workflows = json.load(f)["workflows"]
    with open(ag) as f:
        agents = json.load(f)
    missing = sorted(set(defs) - {w["name"] for w in workflows})
    if missing:
        raise SystemExit(f"not translated: {', '.join(missing)}:\n{out}")
    unset = re.compile(r"variable \S+ is not set")
    problems = [ln for ln in out.splitlines() if ln.startswith("problem:") and not unset.search(ln)]
    if problems:
        raise SystemExit("sasctl import-asl: " + "\n".join(problems))
    return workflows, agents


def step_agent(workflows: list[dict], where: tuple[str, str]) -> str:
    wf, step = where
    for w in workflows:
        if w["name"] == wf:
            for s in w["steps"]:
                if s["name"] == step:
                    return s["agent"]
    raise SystemExit(f"workflow {wf} has no step {step} (has the translation changed?)")


def bench_agents(imported: dict, workflows: list[dict], stub_url: str, approval_queue_url: str) -> dict[str, dict]:
    """Every imported agent a sim agent, but the recommendation (the stub) and the approval (the queue)."""
    recommend = step_agent(workflows, RECOMMEND_STEP)
    approval = step_agent(workflows, APPROVAL_STEP)
    out = {}
    for name, spec in imported["agents"].items():
        if name == recommend:
            out[name] = {"kind": "http", "url": f"{stub_url}/recommend", "payload": "input"}
        elif name == approval:
            out[name] = {**spec, "queue_url": approval_queue_url}
        elif spec.get("kind") in OWN_KINDS or reads_s3(spec):
            out[name] = spec
        else:
            out[name] = {"kind": "sim"}
    return out


def merge(base_workflows: dict, base_agents: dict, workflows: list[dict], agents: dict[str, dict]) -> tuple[dict, dict]:
    names = {w["name"] for w in base_workflows["workflows"]}
    clash = sorted(names & {w["name"] for w in workflows}) + sorted(set(base_agents["agents"]) & set(agents))
    if clash:
        raise SystemExit(f"already in the base configuration: {', '.join(clash)}")
    wf = dict(base_workflows, workflows=base_workflows["workflows"] + workflows)
    ag = dict(base_agents, agents={**base_agents["agents"], **agents})
    return wf, ag


def cmd_config(a) -> int:
    with open(a.info) as f:
        info = json.load(f)
    with open(a.base_workflows) as f:
        base_wf = json.load(f)
    with open(a.base_agents) as f:
        base_ag = json.load(f)
    with tempfile.TemporaryDirectory(prefix="asl-bench-") as tmp:
        workflows, imported = import_asl(a.sasctl, definitions(a.approval_timeout), tmp)
    agents = bench_agents(imported, workflows, info["stub_url"], info["approval_queue_url"])
    wf, ag = merge(base_wf, base_ag, workflows, agents)
    for path, doc in ((a.workflows, wf), (a.agents, ag)):
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
    # As the runner will load them (the approval queue granted, as AgentQueueArns would on AWS).
    queue = info["approval_queue_url"].rstrip("/").rsplit("/", 1)[-1]
    check = subprocess.run(
        [a.sasctl, "validate", "--workflows", a.workflows, "--agents", a.agents,
         "--param", f"AgentQueueArns=arn:aws:sqs:us-east-1:000000000000:{queue}",
         "--var", f"MAP_BUCKET={MAP_BUCKET}",
         # the S3 map's reads and pages (the translation reads its source's bucket from the data)
         "--param", "AgentAwsActions=s3:GetObject,s3:PutObject,s3:ListBucket",
         "--param", "AgentAwsResources=arn:aws:s3:::*,arn:aws:s3:::*/*"],
        check=False, capture_output=True, text=True,
    )
    # The base configuration's own agents whose variables the runner lacks (ORDER_SERVICE_URL...)
    # are registered unconfigured, as without this file; the benchmark calls none of them.
    unset = re.compile(r"problem: agent (\S+): variable \S+ is not set")
    report = check.stdout + check.stderr
    problems = [ln for ln in report.splitlines() if ln.startswith("problem:")
                and not ((m := unset.match(ln)) and m.group(1) in base_ag["agents"])]
    if problems or (check.returncode != 0 and not any(ln.startswith("problem:") for ln in report.splitlines())):
        raise SystemExit(f"sasctl validate refused the benchmark's configuration:\n{report}")
    log(f"wrote {a.workflows} (+ {', '.join(w['name'] for w in workflows)}) and {a.agents} "
        f"(+ {len(agents)} agents: {sum(1 for s in agents.values() if s['kind'] == 'sim')} sim)")
    return 0


# ---------------------------------------------------------------------------------------------
# serve
# ---------------------------------------------------------------------------------------------


class Stub(http.server.BaseHTTPRequestHandler):
    """The recommendation function: answers "buy" to any POST."""

    calls = 0
    answer = b'"buy"'

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        type(self).calls += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        pass


def answer_message(body: str, output: dict) -> str | None:
    """The callback queue's message that approves one handed-over request (None: no token)."""
    try:
        token = json.loads(body)["callback"]["token"]
    except (ValueError, KeyError, TypeError):
        return None
    return json.dumps({"v": 1, "token": token, "status": "succeeded", "output": output})


def approver(direct: Upstream, proxy: Upstream, queue_url: str, callback_url: str, stop: threading.Event, stats: dict):
    """The human: reads the approval queue (not counted: the approver's side, as the functions'
    own cost), answers each request with its own SendMessage to the callback queue (through the
    proxy: counted, the callback message is the task's)."""
    while not stop.is_set():
        try:
            status, out = direct.call("sqs", "AmazonSQS.ReceiveMessage",
                                      {"QueueUrl": queue_url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1})
            msgs = out.get("Messages", []) if status == 200 else []
            for m in msgs:
                msg = answer_message(m["Body"], {"approved": True})
                if msg is None:
                    stats["malformed"] += 1
                else:
                    s, o = proxy.call("sqs", "AmazonSQS.SendMessage", {"QueueUrl": callback_url, "MessageBody": msg})
                    if s != 200:
                        raise RuntimeError(f"SendMessage to the callback queue: HTTP {s}: {o}")
                    stats["answered"] += 1
            if msgs:
                entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)]
                direct.call("sqs", "AmazonSQS.DeleteMessageBatch", {"QueueUrl": queue_url, "Entries": entries})
            elif status != 200:
                time.sleep(1)
        except (OSError, RuntimeError, ValueError, KeyError) as e:  # logged; the approver goes on
            log(f"approver: {e}")
            stats["errors"] += 1
            time.sleep(1)


def cmd_serve(a) -> int:
    with open(a.outputs) as f:
        outputs = json.load(f)
    direct, proxy = Upstream(a.upstream), Upstream(a.proxy)
    queue_name = f"{outputs.get('StackName', 'sas-bench')}-approval-bench"
    status, out = direct.call("sqs", "AmazonSQS.CreateQueue", {"QueueName": queue_name})
    if status != 200:
        raise SystemExit(f"CreateQueue {queue_name}: HTTP {status}: {out}")
    queue_url = out["QueueUrl"]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    stop = threading.Event()
    stats = {"answered": 0, "malformed": 0, "errors": 0}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Thread(target=approver, args=(direct, proxy, queue_url, outputs["CallbackQueueUrl"], stop, stats),
                     daemon=True).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    tmp = a.info + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"stub_url": f"http://127.0.0.1:{server.server_address[1]}", "approval_queue_url": queue_url}, f)
    os.replace(tmp, a.info)
    log(f"stub on port {server.server_address[1]}, approving from {queue_name}")
    done.wait()
    stop.set()
    server.shutdown()
    direct.call("sqs", "AmazonSQS.DeleteQueue", {"QueueUrl": queue_url})
    log(f"stopped: {Stub.calls} recommendation(s), {stats['answered']} approval(s), "
        f"{stats['malformed']} malformed request(s), {stats['errors']} error(s); queue {queue_name} deleted")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--outputs", required=True)
    s.add_argument("--upstream", required=True)
    s.add_argument("--proxy", required=True)
    s.add_argument("--info", required=True, help="where the stub's URL and the approval queue's are written")
    c = sub.add_parser("config")
    c.add_argument("--sasctl", required=True)
    c.add_argument("--info", required=True, help="serve's --info")
    c.add_argument("--base-workflows", default=os.path.join(ROOT, "config/workflows.json"))
    c.add_argument("--base-agents", default=os.path.join(ROOT, "config/agents.json"))
    c.add_argument("--workflows", required=True)
    c.add_argument("--agents", required=True)
    c.add_argument("--approval-timeout", type=int, default=APPROVAL_TIMEOUT_S)
    a = p.parse_args(argv)
    return cmd_serve(a) if a.cmd == "serve" else cmd_config(a)


if __name__ == "__main__":
    sys.exit(main())
