"""One function process: `bootstrap`, its Runtime API server and its output.

A `Sandbox` is one generation of an execution environment's runtime. When the runtime is reset
(timeout, crash, failed init, hot reload), the executor throws the sandbox away and starts a new
one. Life of a sandbox:

    start(deadline)      check the bootstrap, serve the Runtime API, spawn the process, wait for
                         its first GET /next (= initialised), POST /init/error, exit or stop
    run(event, deadline) hand the event to the waiting GET /next, wait for its POST
    kill(grace)          SIGTERM the process group, SIGKILL after `grace` seconds

The process runs in its own session and process group (a kill reaches its children too) with
stdout and stderr on one pipe (their order is kept). It is started through
`setpriv --pdeathsig KILL` from one long-lived thread, so it dies with LocalStack even when
LocalStack itself is SIGKILLed (the parent-death signal follows the thread that forked).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import platform
import queue
import select
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import settings
from .runtime_api import Event, RuntimeApiServer, error_document, error_type_of

LOG = logging.getLogger(__name__)

# ELF e_machine values -> Lambda architecture names.
_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "arm64", 0x03: "x86", 0x28: "arm"}
_HOST_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


def host_architecture() -> str:
    machine = platform.machine().lower()
    return _HOST_ARCH.get(machine, machine)


def bootstrap_problem(bootstrap: Path) -> str | None:
    """Why `bootstrap` cannot be executed here, or None. Makes it executable if needed.

    Checked before spawning, so that the error names the real cause (missing file, a binary for
    the other architecture, a script without #!) instead of a bare exec failure."""
    if not bootstrap.is_file():
        return f"Couldn't find valid bootstrap(s): [{bootstrap}]"
    try:
        with bootstrap.open("rb") as f:
            head = f.read(20)
        if not os.access(bootstrap, os.X_OK):
            bootstrap.chmod(bootstrap.stat().st_mode | 0o755)
    except OSError as exc:
        return f"{bootstrap}: {exc.strerror or exc}"
    if head.startswith(b"#!"):
        return None
    if head.startswith(b"\x7fELF") and len(head) >= 20:
        order = "little" if head[5] == 1 else "big"
        arch = _ELF_MACHINES.get(int.from_bytes(head[18:20], order), f"machine {head[18:20].hex()}")
        if arch != host_architecture():
            return (
                f"fork/exec {bootstrap}: exec format error (the binary is built for {arch}, this "
                f"host is {host_architecture()}: build and deploy with Architecture={host_architecture()})"
            )
        return None
    return f"fork/exec {bootstrap}: exec format error (neither an ELF binary nor a #! script)"


def exit_text(code: int) -> str:
    """A process status as Lambda words it (Go's ProcessState: "exit status 3", "signal: killed")."""
    if code >= 0:
        return f"exit status {code}"
    try:
        name = signal.strsignal(-code) or f"signal {-code}"
    except ValueError:
        name = f"signal {-code}"
    return f"signal: {name.lower()}"


def _exit_document(request_id: str, code: int | None) -> bytes:
    """The Runtime.ExitError an invocation gets when the process is gone (None: it was stopped)."""
    if code is None:
        why = "environment stopped"
    elif code == 0:
        why = "Runtime exited without providing a reason"
    else:
        why = f"Runtime exited with error: {exit_text(code)}"
    return error_document("Runtime.ExitError", f"RequestId: {request_id} Error: {why}")


# -- spawning ----------------------------------------------------------------------------------


class _Spawner:
    """Starts processes from one long-lived thread.

    A parent-death signal (prctl PR_SET_PDEATHSIG, here through `setpriv --pdeathsig KILL`) fires
    when the *thread* that forked the child ends, not the process. LocalStack starts environments
    from short-lived threads, so every bootstrap is forked by this one daemon thread instead,
    which lives as long as LocalStack.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._setpriv: str | bool | None = False  # False: not looked up yet

    def _prefix(self) -> list[str]:
        if not settings.PDEATHSIG:
            return []
        if self._setpriv is False:
            path = shutil.which("setpriv")
            if path:
                probe = subprocess.run([path, "--help"], capture_output=True, text=True, check=False)
                path = path if "--pdeathsig" in probe.stdout else None
            if not path:
                LOG.warning(
                    "host executor: setpriv with --pdeathsig not found (util-linux); functions are "
                    "stopped with LocalStack, but not if LocalStack is killed with SIGKILL"
                )
            self._setpriv = path
        return [self._setpriv, "--pdeathsig", "KILL", "--"] if self._setpriv else []

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            argv = self._prefix() + argv
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="host-lambda-spawner", daemon=True)
                self._thread.start()
        done: Future = Future()
        self._queue.put((argv, kwargs, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            argv, kwargs, done = self._queue.get()
            try:
                done.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
                done.set_exception(exc)


_SPAWNER = _Spawner()

# Every sandbox with a live process; killed at interpreter exit as a last resort.
_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()


# -- results -----------------------------------------------------------------------------------


@dataclass
class InitResult:
    """How an initialisation ended. `ok`, or an error: `document` is a JSON error document the
    runtime posted to /init/error; otherwise `error_type` and `message` describe it."""

    ok: bool
    duration_ms: float
    error_type: str = ""
    message: str = ""
    document: bytes | None = None
    stopped: bool = False  # the environment was stopped meanwhile
    timed_out: bool = False  # the deadline passed first

    def payload(self, request_id: str) -> bytes:
        if self.document is not None:
            return self.document
        return error_document(self.error_type, f"RequestId: {request_id} Error: {self.message}")


class Sandbox:
    """One `bootstrap` process and its Runtime API (see the module docstring)."""

    def __init__(self, name: str, code_dir: Path, env: dict[str, str], log_file: Path | None):
        self.name = name
        self.code_dir = code_dir
        self.bootstrap = code_dir / "bootstrap"
        self._env = env
        self._log_file_path = log_file
        self._log_file: IO[str] | None = None

        self._cond = threading.Condition()
        self._ready = False
        self._closed = False  # no more events: killed, or the process exited
        self._posted_init_error: bytes | None = None
        self._exit_code: int | None = None
        self._pending: Event | None = None
        self._inflight: dict[str, Event] = {}

        self.proc: subprocess.Popen | None = None
        self.bootstrap_mtime = 0.0
        self._spawned_at = 0.0
        self.init_ms: float | None = None
        self._max_rss_mb: int | None = None

        self._out_lock = threading.Lock()
        self._out_fd: int | None = None
        self._out_eof = threading.Event()
        self._partial = b""
        self._output: list[str] = []  # since the last take_output()
        self._history: deque[str] = deque()
        self._history_chars = 0

        self._server = RuntimeApiServer(self)
        self._server_thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"host-lambda-api-{name}",
            daemon=True,
        )
        self._server_started = False
        self._server_closed = False
        self._server_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, deadline: float) -> InitResult:
        """Start the process and wait until it is initialised (its first GET /next), it failed,
        it was stopped, or the monotonic `deadline` passed. A failed sandbox is already killed."""
        begun = time.perf_counter()

        def failed(error_type: str, message: str, **extra) -> InitResult:
            self.kill(grace_s=0)
            self.wait_for_output_end(0.5)  # its last words belong in the log
            return InitResult(False, (time.perf_counter() - begun) * 1000, error_type, message, **extra)

        problem = bootstrap_problem(self.bootstrap)
        if problem:
            return failed("Runtime.InvalidEntrypoint", problem)
        self.bootstrap_mtime = self.bootstrap.stat().st_mtime
        with self._server_lock:
            stopped = self._server_closed
            if not stopped:
                self._server_thread.start()
                self._server_started = True
        if stopped:  # kill() ran first; failed() kills again, which takes _server_lock: not under it
            return failed("Runtime.ExitError", "environment stopped", stopped=True)
        env = dict(self._env)
        env["AWS_LAMBDA_RUNTIME_API"] = self._server.address
        self._spawned_at = time.perf_counter()
        try:
            proc = _SPAWNER.popen(
                [str(self.bootstrap)],
                cwd=str(self.code_dir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return failed("Runtime.InvalidEntrypoint", f"fork/exec {self.bootstrap}: {exc.strerror or exc}")
        with self._cond:
            self.proc = proc
            stopped_meanwhile = self._closed
        _LIVE.add(self)
        self._out_fd = proc.stdout.fileno()
        threading.Thread(target=self._pump, name=f"host-lambda-out-{self.name}", daemon=True).start()
        threading.Thread(target=self._reap, name=f"host-lambda-wait-{self.name}", daemon=True).start()
        LOG.debug("%s: started pid %s, runtime API %s", self.name, proc.pid, env["AWS_LAMBDA_RUNTIME_API"])
        if stopped_meanwhile:  # kill() ran before the process existed
            return failed("Runtime.ExitError", "environment stopped", stopped=True)

        with self._cond:
            while not (self._ready or self._posted_init_error is not None or self._closed):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._ready:
                return InitResult(True, self.init_ms or 0.0)
            posted, exit_code, closed = self._posted_init_error, self._exit_code, self._closed
        if posted is not None:
            return failed(error_type_of(posted, "Runtime.Unknown"), "", document=posted)
        if exit_code is not None:
            self.wait_for_output_end()
            return failed("Runtime.ExitError", f"Runtime exited with error: {exit_text(exit_code)}")
        if closed:
            return failed("Runtime.ExitError", "environment stopped", stopped=True)
        return failed("Sandbox.Timedout", "init did not finish before the deadline", timed_out=True)

    def kill(self, grace_s: float | None = None) -> None:
        """Stop for good: refuse new events, end the process group (SIGTERM, SIGKILL after the
        grace period; 0 = SIGKILL at once), release every waiting request, stop the server."""
        grace = settings.KILL_GRACE_S if grace_s is None else grace_s
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            self._read_max_rss()
            _killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            try:
                proc.wait(timeout=grace if grace > 0 else 5)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    LOG.warning("%s: pid %s survives SIGKILL", self.name, proc.pid)
        self._close_server()
        _LIVE.discard(self)

    @property
    def alive(self) -> bool:
        with self._cond:
            return not self._closed and self.proc is not None and self.proc.poll() is None

    def bootstrap_changed(self) -> bool:
        try:
            return self.bootstrap.stat().st_mtime != self.bootstrap_mtime
        except OSError:
            return True

    def _close_server(self) -> None:
        with self._server_lock:
            if self._server_closed:
                return
            self._server_closed = True
            started = self._server_started
        if started:
            self._server.shutdown()
        self._server.server_close()

    def _reap(self) -> None:
        """Wait for the process to end; then clean up its group and fail what it left open."""
        proc = self.proc
        # Wait without reaping: while the leader is a zombie its PID (= the group's id) cannot be
        # reused, so the SIGKILL below reaches only the children it left behind. ChildProcessError:
        # already reaped (Popen.poll() in kill() or alive) a moment ago.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        _killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
        with self._cond:
            self._exit_code = code
            self._closed = True
            orphans = list(self._inflight.values()) + ([self._pending] if self._pending else [])
            self._inflight.clear()
            self._pending = None
            self._cond.notify_all()
        for event in orphans:
            event.finish(_exit_document(event.request_id, code), True)
        LOG.debug("%s: pid %s ended (%s)", self.name, proc.pid, exit_text(code))
        self._close_server()
        _LIVE.discard(self)

    # -- invocations ---------------------------------------------------------------------------
    def run(self, event: Event, deadline: float) -> tuple[bytes, bool] | None:
        """Hand `event` to the runtime and wait for its answer until the monotonic `deadline`.
        Returns (body, is_error), or None when the deadline passed (the caller resets the runtime)."""
        with self._cond:
            if self._closed:
                event.finish(_exit_document(event.request_id, self._exit_code), True)
            else:
                self._pending = event
                self._cond.notify_all()
        try:
            return event.result.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            with self._cond:
                if self._pending is event:
                    self._pending = None
                self._inflight.pop(event.request_id, None)
            if event.finish(b"", True):  # a POST arriving from now on gets 400
                return None
            return event.result.result()  # the answer came in just now

    # RuntimeBackend, called from the Runtime API's handler threads.
    def next_event(self) -> Event | None:
        with self._cond:
            if not self._ready:
                self._ready = True  # the first GET /next ends the init phase
                self.init_ms = (time.perf_counter() - self._spawned_at) * 1000
                self._cond.notify_all()
            while self._pending is None and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            event, self._pending = self._pending, None
            self._inflight[event.request_id] = event
        self._read_max_rss()  # the process may not live to the end of this event
        return event

    def event_done(self, request_id: str, body: bytes, is_error: bool) -> bool | None:
        with self._cond:
            event = self._inflight.pop(request_id, None)
        if event is None:
            return None
        return event.finish(body, is_error)

    def init_error(self, body: bytes) -> None:
        with self._cond:
            if self._posted_init_error is None:
                self._posted_init_error = body
            self._cond.notify_all()

    # -- memory --------------------------------------------------------------------------------
    def _read_max_rss(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            with open(f"/proc/{proc.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self._max_rss_mb = max(1, round(int(line.split()[1]) / 1024))
                        return
        except (OSError, ValueError):
            pass

    def max_memory_mb(self) -> int | None:
        """Peak resident memory of the bootstrap process (VmHWM), as in Lambda's REPORT line."""
        self._read_max_rss()
        return self._max_rss_mb

    # -- output --------------------------------------------------------------------------------
    def _pump(self) -> None:
        fd = self._out_fd
        os.set_blocking(fd, False)
        while True:
            try:
                select.select([fd], [], [])
            except (OSError, ValueError):
                break
            with self._out_lock:
                if not self._read_available():
                    break
        with self._out_lock:
            if self._partial:
                self._emit(self._partial.decode("utf-8", "replace") + "\n")
                self._partial = b""
            self._out_eof.set()
            if self.proc is not None and self.proc.stdout is not None:
                self.proc.stdout.close()
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def _read_available(self) -> bool:
        """Read what the pipe holds now (caller holds _out_lock). False at end of file."""
        while True:
            try:
                data = os.read(self._out_fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            *lines, self._partial = (self._partial + data).split(b"\n")
            for line in lines:
                self._emit(line.decode("utf-8", "replace") + "\n")

    def _emit(self, line: str) -> None:
        self._output.append(line)
        self._history.append(line)
        self._history_chars += len(line)
        while self._history_chars > settings.MAX_HISTORY_CHARS and len(self._history) > 1:
            self._history_chars -= len(self._history.popleft())
        if settings.ECHO:
            LOG.info("[lambda %s] %s", self.name, line.rstrip("\n"))
        if self._log_file_path is not None:
            try:
                if self._log_file is None:
                    self._log_file_path.parent.mkdir(parents=True, exist_ok=True)
                    self._log_file = self._log_file_path.open("a", encoding="utf-8", buffering=1)
                self._log_file.write(line)
            except OSError as exc:
                LOG.warning("%s: cannot write %s: %s", self.name, self._log_file_path, exc)
                self._log_file_path = None

    def collect_output(self) -> None:
        """Take in everything the process wrote before now. Its answer arrives over HTTP after it
        wrote its log lines, so after this call they are all in."""
        with self._out_lock:
            if not self._out_eof.is_set() and self._out_fd is not None:
                self._read_available()

    def wait_for_output_end(self, timeout_s: float = 1.0) -> None:
        """After the process ended: wait (briefly) until the pump has read the pipe to its end."""
        self._out_eof.wait(timeout_s)

    def take_output(self) -> str:
        with self._out_lock:
            text = "".join(self._output)
            self._output = []
        return text

    def history(self) -> str:
        with self._out_lock:
            return "".join(self._history)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_all() -> None:
    """SIGKILL every live sandbox (LocalStack normally stops them itself; this is the net)."""
    for sandbox in list(_LIVE):
        sandbox.kill(grace_s=0)


atexit.register(kill_all)
