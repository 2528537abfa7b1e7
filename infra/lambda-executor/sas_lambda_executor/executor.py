"""`HostRuntimeExecutor`: LocalStack's `RuntimeExecutor` for functions that run as host processes.

LocalStack (services/lambda_/invocation/) creates one executor per execution environment and
serves one invocation at a time on it; concurrent invocations get environments of their own.

    start(env_vars)   LocalStack's thread, once: start the runtime and block until it has
                      initialised, at most 10 s (HOST_LAMBDA_INIT_TIMEOUT). A failed or slow init
                      does not raise: as on AWS, the next invocation retries the init within its
                      own timeout and reports the error if it fails again. Raises only when the
                      environment is stopped meanwhile.
    invoke(payload)   synchronous: returns InvocationResult(request_id, payload, is_error, logs),
                      logs = the output plus START/END/REPORT, which LocalStack stores in
                      CloudWatch Logs /aws/lambda/<function> and returns for LogType=Tail.
                      Enforces the function's Timeout (LocalStack itself would wait 905 s); a
                      runtime that timed out or exited is started again by the next invocation
                      ("suppressed init", counted against that invocation's timeout).
    stop()            end the process group; unblocks a start() in progress.

Layers are applied as Lambda does, in a host process's terms (see `layers`): the function's layers
are unpacked and merged in their order (a later layer's file wins) into one directory, made once
for each set of layer versions, and every environment variable whose value is a path under /opt
is pointed there (SAS_WORKFLOWS_FILE=/opt/workflows.json -> <merged>/workflows.json).
A layer that cannot be unpacked fails the function's creation (prepare_version).

LocalStack's docker executor needs a callback endpoint and its Go init; this executor returns the
result directly and serves the Runtime API itself, so neither is used.
Written against localstack-core 4.13.1.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from localstack import config
from localstack.aws.api.lambda_ import PackageType
from localstack.services.lambda_.invocation.lambda_models import FunctionVersion, InvocationResult
from localstack.services.lambda_.invocation.plugins import RuntimeExecutorPlugin
from localstack.services.lambda_.invocation.runtime_executor import LambdaRuntimeException, RuntimeExecutor

from . import layers, settings
from .platform_log import PlatformLog
from .runtime_api import Event, error_document, error_type_of
from .sandbox import InitResult, Sandbox, bootstrap_problem, host_architecture

LOG = logging.getLogger(__name__)

_UNSPECIFIED_HOSTS = ("", "0.0.0.0", "::", "[::]")


def endpoint_host() -> str:
    """The host under which a function reaches LocalStack: the same machine."""
    if settings.ENDPOINT_HOST:
        return settings.ENDPOINT_HOST
    host = config.GATEWAY_LISTEN[0].host
    return "127.0.0.1" if host in _UNSPECIFIED_HOSTS else host


class HostRuntimeExecutor(RuntimeExecutor):
    def __init__(self, id: str, function_version: FunctionVersion) -> None:  # noqa: A002 - LocalStack's name
        super().__init__(id=id, function_version=function_version)
        self._lock = threading.Lock()
        self._env: dict[str, str] = {}
        self._sandbox: Sandbox | None = None
        self._stopped = False
        self._carry_log = ""  # a failed init's log, reported by the next invocation
        cfg = function_version.config
        self._code_dir = Path(cfg.code.get_unzipped_code_location())
        self._opt_dir = _opt_dir(function_version)  # the merged layers, if it has any
        self._platform_log = PlatformLog(False, function_version.id.qualifier, int(cfg.memory_size))

    # -- helpers -------------------------------------------------------------------------------
    @property
    def _function_name(self) -> str:
        return self.function_version.id.function_name

    def _process_env(self, env_vars: dict[str, str]) -> dict[str, str]:
        """LocalStack's variables for the function, plus a little of LocalStack's own environment."""
        if settings.INHERIT_ENV:
            env = dict(os.environ)
        else:
            env = {key: os.environ[key] for key in settings.PASS_ENV if key in os.environ}
            env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update({key: str(value) for key, value in env_vars.items() if value is not None})
        if self._opt_dir is not None:
            env = layers.rewrite_opt(env, self._opt_dir)
        # LocalStack fills in the container paths; here the code runs where it was unpacked.
        env["LAMBDA_TASK_ROOT"] = str(self._code_dir)
        env["LAMBDA_RUNTIME_DIR"] = str(self._code_dir)
        return env

    def _spawn(self, deadline: float, phase: str) -> tuple[Sandbox | None, InitResult, str]:
        """Start a new runtime; returns it, how its init ended, and the log lines of a failed init."""
        log_file = Path(settings.LOG_DIR) / f"{self._function_name}.log" if settings.LOG_DIR else None
        sandbox = Sandbox(f"{self._function_name}:{self.id[:8]}", self._code_dir, self._env, log_file)
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._sandbox = sandbox  # from here on stop() reaches it
        if stopped:
            sandbox.kill(grace_s=0)
            return None, InitResult(False, 0.0, "Runtime.ExitError", "environment stopped", stopped=True), ""
        init = sandbox.start(deadline)
        log = ""
        if not init.ok and not init.stopped:
            log = sandbox.take_output() + self._platform_log.init_failed(
                init.duration_ms, phase, init.error_type, init.timed_out
            )
            LOG.info("host executor: %s init failed (%s) in phase %s", self._function_name, init.error_type, phase)
        return sandbox, init, log

    # -- RuntimeExecutor -----------------------------------------------------------------------
    def start(self, env_vars: dict[str, str]) -> None:
        _apply_layers(self.function_version)  # done by prepare_version; unless LocalStack cleaned up
        self._env = self._process_env(env_vars)
        self._platform_log.json_format = env_vars.get("AWS_LAMBDA_LOG_FORMAT") == "JSON"
        _record_credentials(self._env)
        self.function_version.config.code.prepare_for_execution()
        # Lambda gives the init phase 10 s. Stay below LocalStack's own start-up timer, which would
        # stop the environment and fail the invocation with a ServiceException instead.
        budget = min(settings.INIT_TIMEOUT_S, max(1.0, config.LAMBDA_RUNTIME_ENVIRONMENT_TIMEOUT - 1.0))
        _, init, log = self._spawn(time.monotonic() + budget, phase="init")
        if init.stopped:
            raise LambdaRuntimeException(
                f"host executor: environment {self.id} of {self._function_name} was stopped during start-up"
            )
        if not init.ok:  # failed or too slow: the next invocation reports it and initialises again
            with self._lock:
                self._carry_log += log

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            sandbox = self._sandbox
        if sandbox is not None:
            sandbox.kill()

    def invoke(self, payload: dict[str, str]) -> InvocationResult:
        cfg = self.function_version.config
        timeout_s = int(cfg.timeout)
        begun = time.monotonic()
        deadline = begun + timeout_s
        event = Event(
            request_id=payload["invoke-id"],
            function_arn=payload.get("invoked-function-arn") or "",
            trace_id=payload.get("trace-id") or "",
            body=(payload.get("payload") or "").encode(),
            deadline_ms=int((time.time() + timeout_s) * 1000),
        )
        rid = event.request_id
        plog = self._platform_log
        with self._lock:
            sandbox = self._sandbox
            log = [self._carry_log]
            self._carry_log = ""

        if sandbox is not None and sandbox.alive and cfg.code.is_hot_reloading() and sandbox.bootstrap_changed():
            LOG.info("host executor: %s changed on disk; restarting %s", sandbox.bootstrap, sandbox.name)
            sandbox.kill()
        if sandbox is None or not sandbox.alive:
            # The runtime was reset (timeout, exit, failed init): initialise again, within this
            # invocation's timeout, as Lambda does.
            sandbox, init, init_log = self._spawn(deadline, phase="invoke")
            log.append(init_log)
            if not init.ok:
                log.append(plog.start(rid))
                duration_ms = (time.monotonic() - begun) * 1000
                if init.timed_out:
                    body = self._timeout_document(rid, timeout_s)
                    log += [plog.timed_out(rid, timeout_s), plog.end(rid, "timeout", duration_ms)]
                    log.append(plog.report(rid, "timeout", duration_ms, None, None))
                else:
                    body = init.payload(rid)
                    log.append(plog.end(rid, "error", duration_ms, init.error_type))
                    log.append(plog.report(rid, "error", duration_ms, None, None, init.error_type))
                return InvocationResult(rid, body, True, "".join(log))

        log.append(sandbox.take_output())  # what it printed while initialising, before START
        log.append(plog.start(rid))
        handed_over = time.monotonic()  # Duration excludes a re-init (that is Init Duration)
        answer = sandbox.run(event, deadline)
        duration_ms = min((time.monotonic() - handed_over) * 1000, timeout_s * 1000.0)
        max_memory = sandbox.max_memory_mb()
        if answer is None:  # timed out: reset the runtime, the next invocation starts a new one
            sandbox.kill(grace_s=0)
            sandbox.wait_for_output_end(0.5)
            body, is_error, status, platform_error = self._timeout_document(rid, timeout_s), True, "timeout", ""
            log += [sandbox.take_output(), plog.timed_out(rid, timeout_s)]
        else:
            body, is_error = answer
            status = "error" if is_error else "success"
            platform_error = ""
            if is_error and not sandbox.alive and error_type_of(body, "") == "Runtime.ExitError":
                platform_error = "Runtime.ExitError"  # the process died during the invocation
                sandbox.wait_for_output_end(0.5)
            sandbox.collect_output()
            log.append(sandbox.take_output())
            if platform_error:
                log.append(plog.exited(rid, _message_of(body, rid)))
        init_ms, sandbox.init_ms = sandbox.init_ms, None  # reported once, by the first invocation
        log.append(plog.end(rid, status, duration_ms, platform_error))
        log.append(plog.report(rid, status, duration_ms, max_memory, init_ms, platform_error))
        return InvocationResult(rid, body, is_error, "".join(log))

    @staticmethod
    def _timeout_document(request_id: str, timeout_s: int) -> bytes:
        return error_document(
            "Sandbox.Timedout", f"RequestId: {request_id} Error: Task timed out after {timeout_s:.2f} seconds"
        )

    def get_address(self) -> str:
        return "127.0.0.1"

    def get_endpoint_from_executor(self) -> str:
        return endpoint_host()

    def get_runtime_endpoint(self) -> str:
        # Goes into LOCALSTACK_RUNTIME_ENDPOINT, which only LocalStack's Go init reads.
        return f"http://{endpoint_host()}:{config.GATEWAY_LISTEN[0].port}/_localstack_lambda/{self.id}"

    def get_logs(self) -> str:
        with self._lock:
            sandbox = self._sandbox
        return sandbox.history() if sandbox is not None else ""

    @classmethod
    def prepare_version(cls, function_version: FunctionVersion) -> None:
        """CreateFunction / UpdateFunctionCode: refuse what cannot run as a host process (the
        function becomes Failed with this reason), unpack the code, warn about what will fail."""
        cfg = function_version.config
        arn = function_version.qualified_arn
        if cfg.package_type != PackageType.Zip:
            raise LambdaRuntimeException("host executor: only Zip packages run as host processes")
        if not (cfg.runtime or "").startswith("provided"):
            raise LambdaRuntimeException(
                f"host executor: runtime {cfg.runtime} is not supported; only provided.* runtimes "
                "(an executable bootstrap in the zip) run as host processes"
            )
        if cfg.layers:
            try:
                opt = _apply_layers(function_version)
            except Exception as e:
                raise LambdaRuntimeException(f"host executor: {arn}: cannot unpack its layers: {e}") from e
            LOG.info("host executor: %s: %d layer(s) merged into %s (its /opt)", arn, len(cfg.layers), opt)
        arch = cfg.architectures[0] if cfg.architectures else "x86_64"
        if arch != host_architecture():
            LOG.warning(
                "host executor: %s is declared %s but this host is %s; deploy with Architecture=%s",
                arn,
                arch,
                host_architecture(),
                host_architecture(),
            )
        if cfg.code:
            cfg.code.prepare_for_execution()
            problem = bootstrap_problem(Path(cfg.code.get_unzipped_code_location()) / "bootstrap")
            if problem:
                LOG.warning("host executor: %s will fail to start: %s", arn, problem)

    @classmethod
    def cleanup_version(cls, function_version: FunctionVersion) -> None:
        """Nothing to undo: LocalStack stops the environments and owns the unpacked code."""

    @classmethod
    def validate_environment(cls) -> bool:
        LOG.info("Lambda runtime executor 'host': functions run as host processes (provided.* runtimes)")
        return True


def _record_credentials(env: dict[str, str]) -> None:
    """HOST_LAMBDA_CREDENTIALS_DIR: keep the environment's secret key under its access key id, for
    a test endpoint that verifies the function's SigV4 signatures (LocalStack's fake credentials)."""
    key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if not (settings.CREDENTIALS_DIR and key_id and secret and key_id.isalnum()):
        return
    try:
        directory = Path(settings.CREDENTIALS_DIR)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / key_id
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret)
    except OSError as exc:
        LOG.warning("host executor: cannot record credentials in %s: %s", settings.CREDENTIALS_DIR, exc)


def _layer_dirs(function_version: FunctionVersion) -> list[Path]:
    return [Path(layer.code.get_unzipped_code_location()) for layer in function_version.config.layers or []]


def _opt_dir(function_version: FunctionVersion) -> Path | None:
    """The directory that stands for /opt: the merge of the function's layers (None without)."""
    dirs = _layer_dirs(function_version)
    if not dirs:
        return None
    return layers.merged_dir(Path(tempfile.gettempdir()) / "lambda" / "host-layers", dirs)


def _apply_layers(function_version: FunctionVersion) -> Path | None:
    """Unpack each layer (LocalStack's ArchiveCode) and merge them in order into `_opt_dir`."""
    target = _opt_dir(function_version)
    if target is None:
        return None
    for layer in function_version.config.layers:
        layer.code.prepare_for_execution()
    return layers.merge(_layer_dirs(function_version), target)


def _message_of(document: bytes, request_id: str) -> str:
    """The errorMessage of an error document without its 'RequestId: <id> Error: ' prefix."""
    try:
        message = str(json.loads(document).get("errorMessage", ""))
    except (ValueError, AttributeError):
        return document.decode("utf-8", "replace")
    prefix = f"RequestId: {request_id} Error: "
    return message[len(prefix) :] if message.startswith(prefix) else message


class HostRuntimeExecutorPlugin(RuntimeExecutorPlugin):
    """plux plugin `host` in `localstack.lambda.runtime_executor` (LAMBDA_RUNTIME_EXECUTOR=host)."""

    name = "host"

    def load(self, *args, **kwargs):
        return HostRuntimeExecutor
