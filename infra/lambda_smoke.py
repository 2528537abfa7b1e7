#!/usr/bin/env python3
"""Boot each Lambda binary under a Lambda Runtime API and invoke it.

The handlers' behaviour on every fixture in events/ is tested in Rust
(functions/tests/fixtures.rs, on the in-memory twins). This checks what only a real process can:
each binary starts, reads its configuration, polls the Runtime API, answers an invocation and
reports an error the way Lambda expects, and refuses to start without its configuration.

    python3 infra/lambda_smoke.py [TARGET_DIR]     # default target/debug; run `cargo build --workspace --bins` first

The Runtime API is the host Lambda executor's (infra/lambda-executor/sas_lambda_executor/runtime_api.py,
the server the functions talk to under LocalStack), fed by a queue here instead of LocalStack.
Prints one line per check (`  PASS ...` / `  FAIL ...`) and exits 1 if any failed. Standard library
and that package only; no AWS endpoint is contacted (the endpoint is a closed local port).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The Runtime API of the host Lambda executor (infra/lambda-executor), imported from the source tree.
sys.path.insert(0, str(ROOT / "infra" / "lambda-executor"))

from sas_lambda_executor.runtime_api import Event, RuntimeApiServer  # noqa: E402 - after the path

ROLES = ["submitter", "scheduler", "agent", "supervisor", "callback"]
FAILURES: list[str] = []


def check(ok: bool, what: str, why: str = "") -> bool:
    if ok:
        print(f"  PASS {what}", flush=True)
    else:
        print(f"  FAIL {what}: {why}", flush=True)
        FAILURES.append(what)
    return ok


class RuntimeApi:
    """One function's Runtime API: the host Lambda executor's server (`RuntimeApiServer`, the one
    LocalStack's functions talk to) with a backend that hands out the events `invoke` queues."""

    def __init__(self, name: str) -> None:
        self.name = name  # RuntimeBackend.name, in the server's debug log
        self.polled = threading.Event()  # the first GET /next: the runtime has initialised
        self.init_errors: list[bytes] = []  # documents the runtime posted to /init/error
        self._cond = threading.Condition()
        self._queue: deque[Event] = deque()
        self._inflight: dict[str, Event] = {}
        self._closed = False
        self.server = RuntimeApiServer(self)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    @property
    def address(self) -> str:
        return self.server.address

    # RuntimeBackend, called from the server's handler threads.
    def next_event(self) -> Event | None:
        self.polled.set()
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            event = self._queue.popleft()
            self._inflight[event.request_id] = event
        return event

    def event_done(self, request_id: str, body: bytes, is_error: bool) -> bool | None:
        with self._cond:
            event = self._inflight.pop(request_id, None)
        return None if event is None else event.finish(body, is_error)

    def init_error(self, body: bytes) -> None:
        with self._cond:
            self.init_errors.append(body)

    def invoke(self, event: object, timeout: float = 30.0) -> tuple[str, dict]:
        """Queue `event` for the runtime's GET /next and wait for its answer: ("response" or
        "error", the answer's JSON), or ("timeout", {}) when none came within `timeout`."""
        pending = Event(
            request_id=str(uuid.uuid4()),
            function_arn=f"arn:aws:lambda:us-east-1:000000000000:function:{self.name}",
            trace_id="Root=1-00000000-000000000000000000000000",
            body=json.dumps(event).encode(),
            deadline_ms=int((time.time() + timeout) * 1000),
        )
        with self._cond:
            self._queue.append(pending)
            self._cond.notify_all()
        try:
            body, is_error = pending.result.result(timeout=timeout)
        except FutureTimeout:
            with self._cond:
                if pending in self._queue:
                    self._queue.remove(pending)
                self._inflight.pop(pending.request_id, None)
            if pending.finish(b"", True):  # an answer from now on gets 400
                return "timeout", {}
            body, is_error = pending.result.result()  # it came in just now
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {"raw": body.decode(errors="replace")}
        return ("error" if is_error else "response"), payload if isinstance(payload, dict) else {"value": payload}

    def close(self) -> None:
        with self._cond:
            self._closed = True  # a waiting GET /next returns: the server hangs up
            self._cond.notify_all()
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def function_env(role: str, api: RuntimeApi | None) -> dict[str, str]:
    mem = "http://127.0.0.1:{}/000000000000/smoke-{}"
    port = closed_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_LAMBDA_FUNCTION_NAME": f"sas-{role}",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "RUST_LOG": "info",
        "TASK_TABLE": "smoke-tasks",
        "SUBMISSION_QUEUE_URL": mem.format(port, "submission"),
        "SUBMISSION_DLQ_URL": mem.format(port, "submission-dlq"),
        "SCHEDULER_QUEUE_URL": mem.format(port, "scheduler"),
        "AGENT_QUEUE_URL": mem.format(port, "agent"),
        "SUPERVISOR_QUEUE_URL": mem.format(port, "supervisor"),
        "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:000000000000:smoke-alerts",
        "SUPERVISOR_SHARDS": "2",
    }
    if api is not None:
        env["AWS_LAMBDA_RUNTIME_API"] = api.address
    return env


def wait_for_poll(api: RuntimeApi, proc: subprocess.Popen, timeout: float) -> bool:
    """Until the runtime's first GET /next; False when it exits or posts /init/error first, or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.polled.wait(0.05):
            return True
        if proc.poll() is not None or api.init_errors:
            return api.polled.is_set()
    return False


def smoke(target: Path, role: str) -> None:
    binary = target / f"sas-{role}"
    if not check(binary.is_file() and os.access(binary, os.X_OK), f"sas-{role}: binary built", str(binary)):
        return
    api = RuntimeApi(f"sas-{role}")
    with open(ROOT / ".local" / f"lambda-smoke-{role}.log", "w") as log:
        proc = subprocess.Popen([str(binary)], env=function_env(role, api), stdout=log, stderr=subprocess.STDOUT)
        try:
            smoke_running(api, proc, role)
        finally:
            proc.kill()
            proc.wait()
            api.close()


def smoke_running(api: RuntimeApi, proc: subprocess.Popen, role: str) -> None:
    booted = wait_for_poll(api, proc, timeout=20)
    why = f"init error {api.init_errors[0].decode(errors='replace')}" if api.init_errors else "no poll in 20 s"
    if not check(booted, f"sas-{role}: boots and polls the Runtime API", f"{why} (exit {proc.poll()})"):
        return
    kind, payload = api.invoke({"unexpected": True})
    check(
        kind == "error" and "does not handle this event" in payload.get("errorMessage", ""),
        f"sas-{role}: an unrecognised event is answered with a function error",
        f"{kind}: {payload}",
    )
    if role == "agent":
        event = json.loads((ROOT / "events" / "agent-sqs.json").read_text())
        kind, payload = api.invoke(event)
        check(
            kind == "response" and payload == {"batchItemFailures": []},
            "sas-agent: answers events/agent-sqs.json with an empty batchItemFailures",
            f"{kind}: {payload}",
        )
    check(proc.poll() is None, f"sas-{role}: still running after its invocations", f"exit {proc.poll()}")


def refuses_without_configuration(target: Path) -> None:
    env = function_env("scheduler", None)
    del env["TASK_TABLE"]
    binary = target / "sas-scheduler"
    if not binary.is_file():
        return
    r = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=20, check=False)
    check(
        r.returncode != 0 and "TASK_TABLE" in (r.stdout + r.stderr),
        "sas-scheduler: refuses to start without TASK_TABLE and says so",
        f"exit {r.returncode}: {(r.stdout + r.stderr)[-300:]}",
    )


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "debug"
    (ROOT / ".local").mkdir(exist_ok=True)
    started = time.monotonic()
    print(f"Lambda binaries under the host executor's Runtime API ({target})")
    for role in ROLES:
        smoke(target, role)
    refuses_without_configuration(target)
    print(f"{len(FAILURES)} failed in {time.monotonic() - started:.1f} s (function output: .local/lambda-smoke-*.log)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
