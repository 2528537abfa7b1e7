"""Tests of `make lambda-smoke`'s harness (lambda_smoke.py) without the Rust binaries: its Runtime API
(the host executor's server with a queue as backend) driven by a runtime over real HTTP, and its
checks run on stand-in function binaries (Python scripts) that behave well or badly:

    make test-python        (or: python3 -m unittest discover -s infra -p 'test_lambda_smoke.py')
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import shutil
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lambda_smoke
from lambda_smoke import RuntimeApi

NEXT = "/2018-06-01/runtime/invocation/next"


class Runtime:
    """A runtime's side of the Runtime API, one kept-alive connection as the Rust runtime keeps."""

    def __init__(self, api: RuntimeApi) -> None:
        host, port = api.address.split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def next(self) -> tuple[str, dict[str, str], bytes]:
        self.conn.request("GET", NEXT)
        resp = self.conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return headers["lambda-runtime-aws-request-id"], headers, resp.read()

    def post(self, path: str, body: bytes) -> int:
        self.conn.request("POST", "/2018-06-01/runtime" + path, body=body)
        resp = self.conn.getresponse()
        resp.read()
        return resp.status

    def close(self) -> None:
        self.conn.close()


class SmokeRuntimeApi(unittest.TestCase):
    def setUp(self) -> None:
        self.api = RuntimeApi("sas-test")
        self.runtime = Runtime(self.api)
        # Cleanups run last first: the runtime threads (serve_one) are joined before these close.
        self.addCleanup(self.api.close)
        self.addCleanup(self.runtime.close)

    def serve_one(self, kind: str, body: bytes) -> Callable[[], dict]:
        """In a thread: take the next event, answer it with `kind` (response/error). Returns a
        function that waits for the thread and gives what it saw."""
        seen: dict = {}

        def run() -> None:
            rid, headers, event = self.runtime.next()
            seen.update(rid=rid, headers=headers, event=json.loads(event))
            seen["status"] = self.runtime.post(f"/invocation/{rid}/{kind}", body)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()

        def result() -> dict:
            thread.join(5)
            self.assertFalse(thread.is_alive(), "the runtime did not finish")
            return seen

        self.addCleanup(thread.join, 5)
        return result

    def test_a_response(self) -> None:
        runtime = self.serve_one("response", b'{"batchItemFailures": []}')
        self.assertEqual(self.api.invoke({"Records": [1]}, timeout=5), ("response", {"batchItemFailures": []}))
        self.assertTrue(self.api.polled.is_set())
        seen = runtime()
        self.assertEqual(seen["event"], {"Records": [1]})
        self.assertEqual(seen["status"], 202)
        arn = seen["headers"]["lambda-runtime-invoked-function-arn"]
        self.assertEqual(arn, "arn:aws:lambda:us-east-1:000000000000:function:sas-test")
        self.assertTrue(seen["headers"]["lambda-runtime-trace-id"].startswith("Root=1-"))
        left_ms = int(seen["headers"]["lambda-runtime-deadline-ms"]) - time.time() * 1000
        self.assertTrue(0 < left_ms <= 5000, left_ms)

    def test_a_function_error(self) -> None:
        self.serve_one("error", b'{"errorType": "FunctionError", "errorMessage": "the agent function does not handle"}')
        kind, payload = self.api.invoke({"unexpected": True}, timeout=5)
        self.assertEqual(kind, "error")
        self.assertEqual(payload["errorMessage"], "the agent function does not handle")

    def test_answers_that_are_not_json_objects(self) -> None:
        runtime = self.serve_one("response", b"not json")
        self.assertEqual(self.api.invoke({}, timeout=5), ("response", {"raw": "not json"}))
        runtime()
        self.serve_one("response", b"[1, 2]")
        self.assertEqual(self.api.invoke({}, timeout=5), ("response", {"value": [1, 2]}))

    def test_no_answer_in_time(self) -> None:
        got: dict = {}

        def slow() -> None:
            got["rid"], _, _ = self.runtime.next()
            time.sleep(0.5)
            got["late"] = self.runtime.post(f"/invocation/{got['rid']}/response", b"{}")

        thread = threading.Thread(target=slow, daemon=True)
        thread.start()
        self.assertEqual(self.api.invoke({}, timeout=0.2), ("timeout", {}))
        thread.join(5)
        self.assertEqual(got["late"], 400, "an answer after the timeout is refused")

    def test_an_unqueued_event_is_not_delivered_after_a_timeout(self) -> None:
        self.assertEqual(self.api.invoke({"first": 1}, timeout=0.1), ("timeout", {}), "nobody polled")
        runtime = self.serve_one("response", b'"second"')
        self.assertEqual(self.api.invoke({"second": 2}, timeout=5), ("response", {"value": "second"}))
        self.assertEqual(runtime()["event"], {"second": 2}, "the timed-out event was taken off the queue")

    def test_an_init_error_is_recorded(self) -> None:
        doc = b'{"errorType": "Runtime.ConfigError", "errorMessage": "TASK_TABLE is not set"}'
        self.assertEqual(self.runtime.post("/init/error", doc), 202)
        self.assertEqual(self.api.init_errors, [doc])
        self.assertFalse(self.api.polled.is_set())

    def test_close_hangs_up_on_a_waiting_runtime(self) -> None:
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                self.runtime.next()
            except (http.client.HTTPException, OSError) as exc:
                errors.append(exc)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        self.assertTrue(self.api.polled.wait(5))
        self.api.close()
        thread.join(5)
        self.assertFalse(thread.is_alive(), "the runtime is still waiting")
        self.assertEqual(len(errors), 1)


# A stand-in for a function binary: MODE says how it behaves.
FUNCTION = """#!{python}
import json, os, sys, urllib.error, urllib.request

mode = {mode!r}
if "TASK_TABLE" not in os.environ:
    sys.exit("configuration: TASK_TABLE is not set")
if mode == "exit":
    sys.exit("crashed at start-up")
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"


def post(path, doc):
    req = urllib.request.Request(api + path, data=json.dumps(doc).encode(), method="POST")
    urllib.request.urlopen(req).read()


if mode == "init-error":
    post("/init/error", {{"errorType": "Runtime.ConfigError", "errorMessage": "bad config"}})
    sys.exit(1)
while True:
    with urllib.request.urlopen(api + "/invocation/next") as r:
        rid = r.headers["Lambda-Runtime-Aws-Request-Id"]
        event = json.loads(r.read())
    if "Records" in event:
        post(f"/invocation/{{rid}}/response", {{"batchItemFailures": []}})
    elif mode == "accepts-anything":
        post(f"/invocation/{{rid}}/response", {{}})
    else:
        name = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
        why = f"the {{name}} function does not handle this event: unknown shape"
        post(f"/invocation/{{rid}}/error", {{"errorType": "FunctionError", "errorMessage": why}})
"""


class SmokeChecks(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        root = Path(self._tmp.name)
        (root / ".local").mkdir()
        (root / "events").mkdir()
        shutil.copy(lambda_smoke.ROOT / "events" / "agent-sqs.json", root / "events")
        self.target = root / "target"
        self.target.mkdir()
        patches = (mock.patch.object(lambda_smoke, "ROOT", root), mock.patch.object(lambda_smoke, "FAILURES", []))
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def function(self, role: str, mode: str = "") -> None:
        path = self.target / f"sas-{role}"
        path.write_text(FUNCTION.format(python=sys.executable, mode=mode))
        path.chmod(0o755)

    def smoke(self, role: str) -> tuple[list[str], list[str]]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            lambda_smoke.smoke(self.target, role)
        lines = out.getvalue().splitlines()
        return [line[7:] for line in lines if line.startswith("  PASS ")], list(lambda_smoke.FAILURES)

    def test_a_well_behaved_function_passes(self) -> None:
        self.function("submitter")
        passed, failed = self.smoke("submitter")
        self.assertEqual(failed, [])
        self.assertEqual(
            passed,
            [
                "sas-submitter: binary built",
                "sas-submitter: boots and polls the Runtime API",
                "sas-submitter: an unrecognised event is answered with a function error",
                "sas-submitter: still running after its invocations",
            ],
        )
        self.assertTrue((lambda_smoke.ROOT / ".local" / "lambda-smoke-submitter.log").is_file())

    def test_the_agent_answers_its_fixture(self) -> None:
        self.function("agent")
        passed, failed = self.smoke("agent")
        self.assertEqual(failed, [])
        self.assertIn("sas-agent: answers events/agent-sqs.json with an empty batchItemFailures", passed)

    def test_a_missing_binary_fails(self) -> None:
        self.assertEqual(self.smoke("callback"), ([], ["sas-callback: binary built"]))

    def test_a_function_that_dies_at_start_fails_at_once(self) -> None:
        self.function("scheduler", "exit")
        started = time.monotonic()
        _, failed = self.smoke("scheduler")
        self.assertEqual(failed, ["sas-scheduler: boots and polls the Runtime API"])
        self.assertLess(time.monotonic() - started, 10, "not the whole 20 s boot timeout")
        log = (lambda_smoke.ROOT / ".local" / "lambda-smoke-scheduler.log").read_text()
        self.assertIn("crashed at start-up", log)

    def test_an_init_error_is_reported(self) -> None:
        self.function("scheduler", "init-error")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            lambda_smoke.smoke(self.target, "scheduler")
        self.assertEqual(lambda_smoke.FAILURES, ["sas-scheduler: boots and polls the Runtime API"])
        self.assertIn("bad config", out.getvalue())

    def test_a_function_that_accepts_anything_fails(self) -> None:
        self.function("supervisor", "accepts-anything")
        _, failed = self.smoke("supervisor")
        self.assertEqual(failed, ["sas-supervisor: an unrecognised event is answered with a function error"])

    def test_the_refusal_without_configuration(self) -> None:
        self.function("scheduler")
        with contextlib.redirect_stdout(io.StringIO()):
            lambda_smoke.refuses_without_configuration(self.target)
        self.assertEqual(lambda_smoke.FAILURES, [])


if __name__ == "__main__":
    unittest.main()
