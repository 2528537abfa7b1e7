#!/usr/bin/env python3
"""Boot each Lambda binary under a minimal Lambda Runtime API and invoke it.

The handlers' behaviour on every fixture in events/ is tested in Rust
(functions/tests/fixtures.rs, on the in-memory twins). This checks what only a real process can:
each binary starts, reads its configuration, polls the Runtime API, answers an invocation and
reports an error the way Lambda expects, and refuses to start without its configuration.

    python3 infra/lambda_smoke.py [TARGET_DIR]     # default target/debug; run `cargo build --workspace --bins` first

Prints one line per check (`  PASS ...` / `  FAIL ...`) and exits 1 if any failed. Standard library only;
no AWS endpoint is contacted (the endpoint is a closed local port).
"""

from __future__ import annotations

import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
    """One function's Runtime API: hands out queued events, collects responses and errors."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.results: queue.Queue[tuple[str, str, dict]] = queue.Queue()
        self.polled = threading.Event()
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path != "/2018-06-01/runtime/invocation/next":
                    self.send_error(404)
                    return
                api.polled.set()
                request_id, body = api.events.get()
                self.send_response(200)
                self.send_header("Lambda-Runtime-Aws-Request-Id", request_id)
                self.send_header("Lambda-Runtime-Deadline-Ms", str(int(time.time() * 1000) + 30_000))
                self.send_header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:000000000000:function:smoke")
                self.send_header("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                data = self.rfile.read(length) if length else b"{}"
                parts = self.path.strip("/").split("/")
                kind = parts[-1]  # response | error (invocation or init)
                request_id = parts[-2] if kind in ("response", "error") and "invocation" in parts else "init"
                try:
                    payload = json.loads(data or b"{}")
                except ValueError:
                    payload = {"raw": data.decode(errors="replace")}
                api.results.put((request_id, kind, payload))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def invoke(self, event: object, timeout: float = 30.0) -> tuple[str, dict]:
        request_id = str(uuid.uuid4())
        self.events.put((request_id, json.dumps(event).encode()))
        rid, kind, payload = self.results.get(timeout=timeout)
        assert rid == request_id, f"answer for {rid}, expected {request_id}"
        return kind, payload

    def close(self) -> None:
        self.server.shutdown()


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


def smoke(target: Path, role: str) -> None:
    binary = target / f"sas-{role}"
    if not check(binary.is_file() and os.access(binary, os.X_OK), f"sas-{role}: binary built", str(binary)):
        return
    api = RuntimeApi()
    log = open(ROOT / ".local" / f"lambda-smoke-{role}.log", "w")
    proc = subprocess.Popen([str(binary)], env=function_env(role, api), stdout=log, stderr=subprocess.STDOUT)
    try:
        booted = api.polled.wait(timeout=20)
        if not check(booted, f"sas-{role}: boots and polls the Runtime API", f"no poll in 20 s (exit {proc.poll()})"):
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
    finally:
        proc.kill()
        proc.wait()
        api.close()
        log.close()


def refuses_without_configuration(target: Path) -> None:
    env = function_env("scheduler", None)
    del env["TASK_TABLE"]
    binary = target / "sas-scheduler"
    if not binary.is_file():
        return
    r = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=20)
    check(
        r.returncode != 0 and "TASK_TABLE" in (r.stdout + r.stderr),
        "sas-scheduler: refuses to start without TASK_TABLE and says so",
        f"exit {r.returncode}: {(r.stdout + r.stderr)[-300:]}",
    )


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "debug"
    (ROOT / ".local").mkdir(exist_ok=True)
    started = time.monotonic()
    print(f"Lambda binaries under a minimal Runtime API ({target})")
    for role in ROLES:
        smoke(target, role)
    refuses_without_configuration(target)
    print(f"{len(FAILURES)} failed in {time.monotonic() - started:.1f} s (function output: .local/lambda-smoke-*.log)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
