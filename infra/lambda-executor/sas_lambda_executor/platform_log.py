"""The lines Lambda itself adds to a function's log stream.

Text format (the default):

    START RequestId: <id> Version: $LATEST
    <the function's output>
    END RequestId: <id>
    REPORT RequestId: <id>  Duration: 3.21 ms  Billed Duration: 4 ms  Memory Size: 256 MB
           Max Memory Used: 9 MB  Init Duration: 5.10 ms        (one line, tab-separated)

plus, when something went wrong, `Status: error  Error Type: Runtime.ExitError` (or
`Status: timeout`) at the end of REPORT, an `INIT_REPORT ... Phase: init|invoke  Status: error|timeout`
line for a failed initialisation and `<time> <id> Task timed out after 5.00 seconds` for a timeout.

With `LoggingConfig: LogFormat: JSON` (LocalStack then sets AWS_LAMBDA_LOG_FORMAT=JSON) the same
events are JSON records: `platform.initReport`, `platform.start`, `platform.runtimeDone`,
`platform.report`, each `{"time": ..., "type": ..., "record": {...}}`.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class PlatformLog:
    def __init__(self, json_format: bool, version: str, memory_mb: int):
        self.json_format = json_format
        self.version = version
        self.memory_mb = memory_mb

    def _record(self, kind: str, record: dict) -> str:
        return json.dumps({"time": _now(), "type": kind, "record": record}, separators=(",", ":")) + "\n"

    def init_failed(self, duration_ms: float, phase: str, error_type: str, timed_out: bool) -> str:
        if self.json_format:
            record = {
                "initializationType": "on-demand",
                "phase": phase,
                "status": "timeout" if timed_out else "error",
                "metrics": {"durationMs": round(duration_ms, 2)},
            }
            if not timed_out:
                record["errorType"] = error_type
            return self._record("platform.initReport", record)
        status = "Status: timeout" if timed_out else f"Status: error\tError Type: {error_type}"
        return f"INIT_REPORT Init Duration: {duration_ms:.2f} ms\tPhase: {phase}\t{status}\n"

    def start(self, request_id: str) -> str:
        if self.json_format:
            return self._record("platform.start", {"requestId": request_id, "version": self.version})
        return f"START RequestId: {request_id} Version: {self.version}\n"

    def timed_out(self, request_id: str, timeout_s: int) -> str:
        if self.json_format:
            return ""  # the status "timeout" of runtimeDone and report says it
        return f"{_now()} {request_id} Task timed out after {timeout_s:.2f} seconds\n"

    def exited(self, request_id: str, message: str) -> str:
        if self.json_format:
            return ""
        return f"RequestId: {request_id} Error: {message}\nRuntime.ExitError\n"

    def end(self, request_id: str, status: str, duration_ms: float, error_type: str = "") -> str:
        if self.json_format:
            record = {
                "requestId": request_id,
                "status": status,
                "metrics": {"durationMs": round(duration_ms, 2)},
            }
            if error_type:
                record["errorType"] = error_type
            return self._record("platform.runtimeDone", record)
        return f"END RequestId: {request_id}\n"

    def report(
        self,
        request_id: str,
        status: str,
        duration_ms: float,
        max_memory_mb: int | None,
        init_ms: float | None,
        error_type: str = "",
    ) -> str:
        billed = max(1, math.ceil(duration_ms))
        used = max_memory_mb or 1
        if self.json_format:
            metrics = {
                "durationMs": round(duration_ms, 2),
                "billedDurationMs": billed,
                "memorySizeMB": self.memory_mb,
                "maxMemoryUsedMB": used,
            }
            if init_ms is not None:
                metrics["initDurationMs"] = round(init_ms, 2)
            record = {"requestId": request_id, "metrics": metrics, "status": status}
            if error_type:
                record["errorType"] = error_type
            return self._record("platform.report", record)
        line = (
            f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms\tBilled Duration: {billed} ms\t"
            f"Memory Size: {self.memory_mb} MB\tMax Memory Used: {used} MB\t"
        )
        if init_ms is not None:
            line += f"Init Duration: {init_ms:.2f} ms\t"
        if status == "timeout":
            line += "Status: timeout"
        elif error_type:  # a platform error (exit, failed init); a handler's own error has none
            line += f"Status: error\tError Type: {error_type}"
        return line + "\n"
