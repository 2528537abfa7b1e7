"""Tests of the host executor's sandbox (sandbox.py): one `bootstrap` process and its Runtime API.

The bootstrap here is a small Python runtime (RUNTIME below) that speaks the Runtime API like a
`provided` runtime does, so the whole path runs for real: spawn, init (the first GET /next),
invocations, function errors, exits, timeouts, kill. No LocalStack:

    make test-python        (or: python3 -m unittest discover -s infra/lambda-executor -p 'test_*.py')
"""

from __future__ import annotations

import json
import os
import platform
import signal
import stat
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sas_lambda_executor import sandbox, settings
from sas_lambda_executor.runtime_api import Event
from sas_lambda_executor.sandbox import InitResult, Sandbox, bootstrap_problem, exit_text, host_architecture

# A `provided` runtime in Python: MODE picks its init; each event's "action" what it does.
RUNTIME = """#!{python}
import json, os, sys, time, urllib.error, urllib.request

api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"
mode = os.environ.get("MODE", "")


def post(path, doc):
    req = urllib.request.Request(api + path, data=json.dumps(doc).encode(), method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


if mode == "exit-in-init":
    print("init: giving up", flush=True)
    sys.stdout.write("no newline at the end")
    sys.exit(3)
if mode == "init-error":
    post("/init/error", {{"errorType": "Runtime.ConfigError", "errorMessage": "TASK_TABLE is not set"}})
    time.sleep(30)
if mode == "slow-init":
    time.sleep(30)
print("init: ready", flush=True)
while True:
    with urllib.request.urlopen(api + "/invocation/next") as r:
        rid = r.headers["Lambda-Runtime-Aws-Request-Id"]
        event = json.loads(r.read())
    print("handling " + rid, flush=True)
    action = event.get("action")
    if action == "echo":
        post(f"/invocation/{{rid}}/response", {{
            "event": event,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "argv0": sys.argv[0],
            "deadline": r.headers["Lambda-Runtime-Deadline-Ms"],
        }})
    elif action == "fail":
        post(f"/invocation/{{rid}}/error", {{"errorType": "Handler.Failed", "errorMessage": "as asked"}})
    elif action == "sleep":
        time.sleep(event["seconds"])
        print("late answer: " + str(post(f"/invocation/{{rid}}/response", "late")), flush=True)
    elif action == "exit":
        print("exiting", flush=True)
        os._exit(event["code"])
"""


def deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def new_event(request_id: str, payload: object, seconds: float = 10.0) -> Event:
    return Event(
        request_id=request_id,
        function_arn="arn:aws:lambda:us-east-1:000000000000:function:f",
        trace_id="",
        body=json.dumps(payload).encode(),
        deadline_ms=int((time.time() + seconds) * 1000),
    )


class Lifecycle(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.code = Path(self._tmp.name) / "code"
        self.code.mkdir()
        (self.code / "bootstrap").write_text(RUNTIME.format(python=sys.executable))
        self.sandboxes: list[Sandbox] = []

    def tearDown(self) -> None:
        for sb in self.sandboxes:
            sb.kill(grace_s=0)
        self._tmp.cleanup()

    def sandbox(self, mode: str = "", log_file: Path | None = None, **env: str) -> Sandbox:
        sb = Sandbox("test:fn", self.code, {"MODE": mode, **env}, log_file)
        self.sandboxes.append(sb)
        return sb

    def test_init_then_a_response(self) -> None:
        env = {"MARKER": "from-the-function-env"}
        sb = self.sandbox(**env)
        init = sb.start(deadline())
        self.assertTrue(init.ok, init)
        self.assertIsNotNone(sb.init_ms)
        self.assertTrue(sb.alive)
        self.assertEqual(sb.bootstrap_mtime, (self.code / "bootstrap").stat().st_mtime)

        ev = new_event("req-1", {"action": "echo", "n": 7})
        body, is_error = sb.run(ev, deadline())
        self.assertFalse(is_error)
        answer = json.loads(body)
        self.assertEqual(answer["event"], {"action": "echo", "n": 7})
        self.assertEqual(answer["deadline"], str(ev.deadline_ms))
        self.assertEqual(Path(answer["cwd"]), self.code, "the process runs in its code directory")
        self.assertEqual(Path(answer["argv0"]), self.code / "bootstrap")
        # Its environment is the one given plus the Runtime API's address, nothing of ours.
        got_env = answer["env"]
        got_env.pop("LC_CTYPE", None)  # Python's own C-locale coercion
        host, _, port = got_env.pop("AWS_LAMBDA_RUNTIME_API").partition(":")
        self.assertEqual(host, "127.0.0.1")
        self.assertTrue(port.isdigit())
        self.assertEqual(got_env, {"MODE": "", **env})
        self.assertNotIn("AWS_LAMBDA_RUNTIME_API", sb._env, "the caller's variables are left alone")

        sb.collect_output()
        self.assertEqual(sb.take_output(), "init: ready\nhandling req-1\n")
        self.assertEqual(sb.take_output(), "", "taken once")
        self.assertEqual(sb.history(), "init: ready\nhandling req-1\n", "the history keeps it")

    def test_a_function_error(self) -> None:
        sb = self.sandbox()
        self.assertTrue(sb.start(deadline()).ok)
        body, is_error = sb.run(new_event("req-1", {"action": "fail"}), deadline())
        self.assertTrue(is_error)
        self.assertEqual(json.loads(body), {"errorType": "Handler.Failed", "errorMessage": "as asked"})
        self.assertTrue(sb.alive, "a function error leaves the runtime running")
        body, is_error = sb.run(new_event("req-2", {"action": "echo"}), deadline())
        self.assertFalse(is_error, body)

    def test_an_exit_during_init(self) -> None:
        log_file = Path(self._tmp.name) / "logs" / "fn.log"
        sb = self.sandbox("exit-in-init", log_file=log_file)
        init = sb.start(deadline())
        self.assertFalse(init.ok)
        self.assertFalse(init.timed_out or init.stopped)
        self.assertEqual(init.error_type, "Runtime.ExitError")
        self.assertEqual(init.message, "Runtime exited with error: exit status 3")
        self.assertEqual(
            json.loads(init.payload("r1")),
            {"errorType": "Runtime.ExitError", "errorMessage": f"RequestId: r1 Error: {init.message}"},
        )
        self.assertFalse(sb.alive)
        self.assertEqual(sb.take_output(), "init: giving up\nno newline at the end\n", "its last words, a line each")
        self.assertEqual(log_file.read_text(), "init: giving up\nno newline at the end\n")

    def test_an_init_error_the_runtime_posts(self) -> None:
        sb = self.sandbox("init-error")
        init = sb.start(deadline())
        self.assertFalse(init.ok)
        self.assertEqual(init.error_type, "Runtime.ConfigError")
        doc = {"errorType": "Runtime.ConfigError", "errorMessage": "TASK_TABLE is not set"}
        self.assertEqual(json.loads(init.document), doc)
        self.assertEqual(json.loads(init.payload("r1")), doc, "the posted document is the answer as it is")
        self.assertFalse(sb.alive, "a failed sandbox is already killed")

    def test_an_init_past_the_deadline(self) -> None:
        sb = self.sandbox("slow-init")
        started = time.monotonic()
        init = sb.start(deadline(0.5))
        self.assertLess(time.monotonic() - started, 5)
        self.assertFalse(init.ok)
        self.assertTrue(init.timed_out)
        self.assertEqual(init.error_type, "Sandbox.Timedout")
        self.assertIsNotNone(sb.proc.poll(), "the process is gone")

    def test_a_missing_bootstrap(self) -> None:
        (self.code / "bootstrap").unlink()
        init = self.sandbox().start(deadline())
        self.assertFalse(init.ok)
        self.assertEqual(init.error_type, "Runtime.InvalidEntrypoint")
        self.assertIn("Couldn't find valid bootstrap(s)", init.message)

    def test_an_invocation_past_its_deadline(self) -> None:
        sb = self.sandbox()
        self.assertTrue(sb.start(deadline()).ok)
        ev = new_event("req-1", {"action": "sleep", "seconds": 1.0})
        started = time.monotonic()
        self.assertIsNone(sb.run(ev, deadline(0.3)), "no answer in time")
        self.assertLess(time.monotonic() - started, 0.9)
        self.assertFalse(ev.finish(b"too late", False), "the event is closed: a late POST is refused")
        sb.kill(grace_s=0)

    def test_a_crash_during_an_invocation(self) -> None:
        sb = self.sandbox()
        self.assertTrue(sb.start(deadline()).ok)
        body, is_error = sb.run(new_event("req-1", {"action": "exit", "code": 2}), deadline())
        self.assertTrue(is_error)
        exited = "Runtime exited with error: exit status 2"
        self.assertEqual(json.loads(body)["errorType"], "Runtime.ExitError")
        self.assertEqual(json.loads(body)["errorMessage"], f"RequestId: req-1 Error: {exited}")
        sb.wait_for_output_end()
        self.assertFalse(sb.alive)
        self.assertIn("exiting\n", sb.take_output())
        # The next event on the dead sandbox fails at once.
        body, is_error = sb.run(new_event("req-2", {"action": "echo"}), deadline())
        self.assertTrue(is_error)
        self.assertEqual(json.loads(body)["errorMessage"], f"RequestId: req-2 Error: {exited}")

    def test_kill_ends_the_process_with_sigterm_first(self) -> None:
        sb = self.sandbox()
        self.assertTrue(sb.start(deadline()).ok)
        sb.kill(grace_s=2)
        self.assertFalse(sb.alive)
        self.assertEqual(sb.proc.returncode, -signal.SIGTERM)
        body, is_error = sb.run(new_event("req-1", {"action": "echo"}), deadline())
        self.assertTrue(is_error)
        doc = json.loads(body)
        self.assertEqual(doc["errorType"], "Runtime.ExitError")
        # Which words depends on whether the reaper has recorded the exit yet.
        self.assertIn(
            doc["errorMessage"],
            (
                "RequestId: req-1 Error: environment stopped",
                "RequestId: req-1 Error: Runtime exited with error: signal: terminated",
            ),
        )

    def test_a_kill_before_start_stops_the_start(self) -> None:
        # LocalStack's stop() can come between the executor making a sandbox and starting it.
        sb = Sandbox("test:fn", self.code, {}, None)  # not self.sandbox(): no kill in tearDown
        sb.kill(grace_s=0)
        results: list[InitResult] = []
        starter = threading.Thread(target=lambda: results.append(sb.start(deadline())), daemon=True)
        starter.start()
        starter.join(5)
        self.assertFalse(starter.is_alive(), "start() hangs (it once deadlocked on its own lock here)")
        self.assertFalse(results[0].ok)
        self.assertTrue(results[0].stopped)
        self.assertIsNone(sb.proc, "no process was spawned")

    def test_bootstrap_changed(self) -> None:
        sb = self.sandbox()
        self.assertTrue(sb.start(deadline()).ok)
        self.assertFalse(sb.bootstrap_changed())
        later = sb.bootstrap_mtime + 5
        os.utime(self.code / "bootstrap", (later, later))
        self.assertTrue(sb.bootstrap_changed())

    def test_the_history_is_bounded(self) -> None:
        sb = self.sandbox()
        with mock.patch.object(settings, "MAX_HISTORY_CHARS", 21), mock.patch.object(settings, "ECHO", False):
            for i in range(10):
                sb._emit(f"line {i}\n")  # 7 characters each
        self.assertEqual(sb.history(), "line 7\nline 8\nline 9\n")
        self.assertEqual(sb.take_output(), "".join(f"line {i}\n" for i in range(10)), "the output is all there")


def elf_header(machine: int, little_endian: bool = True) -> bytes:
    order = "little" if little_endian else "big"
    return b"\x7fELF\x02" + (b"\x01" if little_endian else b"\x02") + b"\x01" + bytes(11) + machine.to_bytes(2, order)


class Bootstrap(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.path = Path(self._tmp.name) / "bootstrap"

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def test_missing(self) -> None:
        self.assertEqual(bootstrap_problem(self.path), f"Couldn't find valid bootstrap(s): [{self.path}]")

    def test_a_script_is_made_executable(self) -> None:
        self.path.write_text("#!/bin/sh\nexit 0\n")
        self.path.chmod(0o644)
        self.assertIsNone(bootstrap_problem(self.path))
        self.assertTrue(self.path.stat().st_mode & stat.S_IXUSR)

    def test_a_binary_for_this_host(self) -> None:
        machine = {"x86_64": 0x3E, "arm64": 0xB7}.get(host_architecture())
        if machine is None:
            self.skipTest(f"no ELF machine number here for {platform.machine()}")
        self.path.write_bytes(elf_header(machine) + bytes(100))
        self.assertIsNone(bootstrap_problem(self.path))

    def test_a_binary_for_the_other_architecture(self) -> None:
        other, machine = ("arm64", 0xB7) if host_architecture() != "arm64" else ("x86_64", 0x3E)
        self.path.write_bytes(elf_header(machine) + bytes(100))
        problem = bootstrap_problem(self.path)
        self.assertIn("exec format error", problem)
        self.assertIn(f"built for {other}, this host is {host_architecture()}", problem)
        self.assertIn(f"Architecture={host_architecture()}", problem)

    def test_a_big_endian_header_is_read_big_endian(self) -> None:
        self.path.write_bytes(elf_header(0x28, little_endian=False) + bytes(100))  # 32-bit arm
        self.assertIn("built for arm,", bootstrap_problem(self.path))

    def test_an_unknown_machine_is_named_by_number(self) -> None:
        self.path.write_bytes(elf_header(0xF3) + bytes(100))  # RISC-V
        self.assertIn("built for machine f300,", bootstrap_problem(self.path))

    def test_neither_elf_nor_script(self) -> None:
        self.path.write_text("echo hello\n")
        self.assertIn("neither an ELF binary nor a #! script", bootstrap_problem(self.path))


class Words(unittest.TestCase):
    def test_exit_text(self) -> None:
        self.assertEqual(exit_text(0), "exit status 0")
        self.assertEqual(exit_text(3), "exit status 3")
        self.assertEqual(exit_text(-signal.SIGKILL), "signal: killed")
        self.assertEqual(exit_text(-signal.SIGTERM), "signal: terminated")
        self.assertEqual(exit_text(-1000), "signal: signal 1000")

    def test_exit_documents(self) -> None:
        def message(code: int | None) -> str:
            return json.loads(sandbox._exit_document("r", code))["errorMessage"]

        self.assertEqual(message(None), "RequestId: r Error: environment stopped")
        self.assertEqual(message(0), "RequestId: r Error: Runtime exited without providing a reason")
        self.assertEqual(message(-signal.SIGKILL), "RequestId: r Error: Runtime exited with error: signal: killed")

    def test_init_result_payload(self) -> None:
        result = InitResult(False, 1.0, "Runtime.InvalidEntrypoint", "no bootstrap")
        self.assertEqual(
            json.loads(result.payload("r")),
            {"errorType": "Runtime.InvalidEntrypoint", "errorMessage": "RequestId: r Error: no bootstrap"},
        )


class SpawnPrefix(unittest.TestCase):
    """The argv prefix that makes a bootstrap die with LocalStack: `setpriv --pdeathsig KILL --`."""

    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self.bin = Path(self._tmp.name)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def setpriv(self, help_text: str) -> Path:
        path = self.bin / "setpriv"
        path.write_text(f"#!/bin/sh\necho '{help_text}'\n")
        path.chmod(0o755)
        return path

    def prefix(self, spawner: sandbox._Spawner, pdeathsig: bool = True) -> list[str]:
        with mock.patch.dict(os.environ, {"PATH": str(self.bin)}), mock.patch.object(settings, "PDEATHSIG", pdeathsig):
            return spawner._prefix()

    def test_setpriv_with_pdeathsig(self) -> None:
        path = self.setpriv("  --pdeathsig <signal>  set parent death signal")
        spawner = sandbox._Spawner()
        self.assertEqual(self.prefix(spawner), [str(path), "--pdeathsig", "KILL", "--"])
        path.unlink()
        self.assertEqual(self.prefix(spawner), [str(path), "--pdeathsig", "KILL", "--"], "looked up once")

    def test_a_setpriv_without_pdeathsig_is_not_used(self) -> None:
        self.setpriv("  --reuid <uid>  set real uid")
        with self.assertLogs(sandbox.LOG, "WARNING"):
            self.assertEqual(self.prefix(sandbox._Spawner()), [])

    def test_no_setpriv(self) -> None:
        with self.assertLogs(sandbox.LOG, "WARNING"):
            self.assertEqual(self.prefix(sandbox._Spawner()), [])

    def test_switched_off(self) -> None:
        self.setpriv("--pdeathsig")
        self.assertEqual(self.prefix(sandbox._Spawner(), pdeathsig=False), [])


if __name__ == "__main__":
    unittest.main()
