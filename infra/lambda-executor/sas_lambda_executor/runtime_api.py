"""The Lambda Runtime API (2018-06-01), as much of it as a `provided` runtime uses.

One `RuntimeApiServer` per function process, on 127.0.0.1 and a free port; the process finds it
through `AWS_LAMBDA_RUNTIME_API=127.0.0.1:<port>`. Routes:

    GET  /2018-06-01/runtime/invocation/next            blocks until there is an event
    POST /2018-06-01/runtime/invocation/{id}/response   the result of event {id}
    POST /2018-06-01/runtime/invocation/{id}/error      the function failed on event {id}
    POST /2018-06-01/runtime/init/error                 the runtime failed to initialise

Everything else answers 404. Not served: the Extensions and Telemetry APIs, response streaming
(a chunked response body is accepted and read whole), client context and Cognito identity.

The server knows nothing about LocalStack: it calls a `RuntimeBackend` (the sandbox).
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import unquote

LOG = logging.getLogger(__name__)

PREFIX = "/2018-06-01/runtime"


def error_document(error_type: str, message: str) -> bytes:
    """A Lambda error document, as the Invoke API returns it for a function error."""
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


def error_type_of(document: bytes, default: str) -> str:
    """The errorType of a JSON error document, or `default`."""
    try:
        doc = json.loads(document)
    except ValueError:
        return default
    if isinstance(doc, dict) and isinstance(doc.get("errorType"), str) and doc["errorType"]:
        return doc["errorType"]
    return default


@dataclass
class Event:
    """One invocation on its way through the Runtime API."""

    request_id: str
    function_arn: str
    trace_id: str
    body: bytes
    deadline_ms: int
    # (body, is_error), set by the runtime's POST or by the sandbox (exit, timeout, stop).
    result: Future = field(default_factory=Future)

    def finish(self, body: bytes, is_error: bool) -> bool:
        """Set the result once; False when it was already set."""
        try:
            self.result.set_result((body, is_error))
        except InvalidStateError:  # already finished
            return False
        return True


class RuntimeBackend(Protocol):
    name: str

    def next_event(self) -> Event | None:
        """Block until the next event; None when the environment is shutting down."""

    def event_done(self, request_id: str, body: bytes, is_error: bool) -> bool | None:
        """The runtime's answer for request_id: True accepted, False already answered, None unknown."""

    def init_error(self, body: bytes) -> None:
        """The runtime reported a failed initialisation."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: runtime clients reuse one connection
    server: RuntimeApiServer

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        LOG.debug("runtime api %s: " + format, self.server.backend.name, *args)

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _not_found(self) -> None:
        self._send(404, error_document("NotFound", f"no route {self.command} {self.path}"))

    def do_GET(self):
        if self.path != f"{PREFIX}/invocation/next":
            self._not_found()
            return
        backend = self.server.backend
        event = backend.next_event()
        if event is None:  # shutting down: hang up, the runtime exits on the broken connection
            self.close_connection = True
            return
        headers = {
            "Lambda-Runtime-Aws-Request-Id": event.request_id,
            "Lambda-Runtime-Deadline-Ms": str(event.deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": event.function_arn,
        }
        if event.trace_id:
            headers["Lambda-Runtime-Trace-Id"] = event.trace_id
        try:
            self._send(200, event.body, headers)
        except OSError as exc:  # the runtime went away while we answered
            backend.event_done(
                event.request_id,
                error_document("Runtime.ExitError", f"the event could not be delivered: {exc}"),
                True,
            )

    def do_POST(self):
        body = self._body()
        backend = self.server.backend
        if self.path == f"{PREFIX}/init/error":
            backend.init_error(self._as_error_document(body, "Runtime.Unknown"))
            self._send(202, b'{"status":"OK"}')
            return
        head = f"{PREFIX}/invocation/"
        if not self.path.startswith(head):
            self._not_found()
            return
        request_id, _, kind = self.path[len(head) :].partition("/")
        if kind == "response":
            accepted = backend.event_done(unquote(request_id), body, False)
        elif kind == "error":
            accepted = backend.event_done(unquote(request_id), self._as_error_document(body, "Unhandled"), True)
        else:
            self._not_found()
            return
        if not accepted:
            self._send(400, error_document("InvalidRequestID", "Invalid request ID"))
        else:
            self._send(202, b'{"status":"OK"}')

    def _as_error_document(self, body: bytes, default_type: str) -> bytes:
        """A JSON error document passes as it is (as on AWS); anything else becomes one, with the
        type from the Lambda-Runtime-Function-Error-Type header."""
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and ("errorMessage" in doc or "errorType" in doc):
            return body
        error_type = self.headers.get("Lambda-Runtime-Function-Error-Type") or default_type
        return error_document(error_type, body.decode("utf-8", "replace"))


class RuntimeApiServer(ThreadingHTTPServer):
    """The Runtime API of one function process, on 127.0.0.1 and a port the kernel picks."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, backend: RuntimeBackend):
        self.backend = backend
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"

    def handle_error(self, request, client_address):  # a debug line, not a traceback on stderr
        LOG.debug("runtime api %s: error serving %s", self.backend.name, client_address, exc_info=True)
