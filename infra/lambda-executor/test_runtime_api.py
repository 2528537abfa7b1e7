"""Tests of the host executor's Lambda Runtime API server (runtime_api.py), driven over real HTTP on
loopback as a runtime would, with a backend that records what the server hands it (no LocalStack):

    make test-python        (or: python3 -m unittest discover -s infra/lambda-executor -p 'test_*.py')
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sas_lambda_executor.runtime_api import (
    PREFIX,
    Event,
    RuntimeApiServer,
    error_document,
    error_type_of,
)

ARN = "arn:aws:lambda:us-east-1:000000000000:function:f"
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793"


def event(request_id: str, body: bytes = b'{"k": 1}', trace_id: str = TRACE) -> Event:
    return Event(request_id=request_id, function_arn=ARN, trace_id=trace_id, body=body, deadline_ms=1_700_000_000_123)


class RecordingBackend:
    """A RuntimeBackend as the sandbox is one: events handed out in order, each answerable once."""

    name = "test"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.queue: list[Event | None] = []  # None: "shutting down" for that GET /next
        self.inflight: dict[str, Event] = {}
        self.done: list[tuple[str, bytes, bool]] = []
        self.init_errors: list[bytes] = []

    def put(self, item: Event | None) -> None:
        with self._cond:
            self.queue.append(item)
            self._cond.notify_all()

    def next_event(self) -> Event | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.queue, timeout=5):
                raise AssertionError("GET /next with nothing queued")
            item = self.queue.pop(0)
            if item is not None:
                self.inflight[item.request_id] = item
            return item

    def event_done(self, request_id: str, body: bytes, is_error: bool) -> bool | None:
        self.done.append((request_id, body, is_error))
        item = self.inflight.get(request_id)
        return None if item is None else item.finish(body, is_error)

    def init_error(self, body: bytes) -> None:
        self.init_errors.append(body)


class ServerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.backend = RecordingBackend()
        self.server = RuntimeApiServer(self.backend)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        host, port = self.server.address.split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=5)

    def tearDown(self) -> None:
        self.conn.close()
        self.server.shutdown()
        self.server.server_close()

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        status, _, data = self.request("POST", PREFIX + path, body, headers)
        return status, json.loads(data)


class NextInvocation(ServerTest):
    def test_next_hands_out_the_event_with_lambdas_headers(self) -> None:
        self.backend.put(event("req-1", b'{"orders": [1, 2]}'))
        status, headers, body = self.request("GET", f"{PREFIX}/invocation/next")
        self.assertEqual(status, 200)
        self.assertEqual(body, b'{"orders": [1, 2]}')
        self.assertEqual(headers["lambda-runtime-aws-request-id"], "req-1")
        self.assertEqual(headers["lambda-runtime-deadline-ms"], "1700000000123")
        self.assertEqual(headers["lambda-runtime-invoked-function-arn"], ARN)
        self.assertEqual(headers["lambda-runtime-trace-id"], TRACE)
        self.assertEqual(headers["content-length"], str(len(body)))

    def test_no_trace_header_without_a_trace_id(self) -> None:
        self.backend.put(event("req-1", trace_id=""))
        status, headers, _ = self.request("GET", f"{PREFIX}/invocation/next")
        self.assertEqual(status, 200)
        self.assertNotIn("lambda-runtime-trace-id", headers)

    def test_events_in_turn_over_one_kept_alive_connection(self) -> None:
        self.backend.put(event("a", b'"first"'))
        self.backend.put(event("b", b'"second"'))
        seen = []
        for _ in range(2):
            _, headers, body = self.request("GET", f"{PREFIX}/invocation/next")
            seen.append((headers["lambda-runtime-aws-request-id"], body))
            self.assertEqual(self.post(f"/invocation/{seen[-1][0]}/response", b"{}")[0], 202)
        self.assertEqual(seen, [("a", b'"first"'), ("b", b'"second"')])

    def test_shutting_down_hangs_up_on_the_waiting_runtime(self) -> None:
        self.backend.put(None)
        with self.assertRaises((http.client.RemoteDisconnected, ConnectionError)):
            self.request("GET", f"{PREFIX}/invocation/next")

    def test_next_waits_until_there_is_an_event(self) -> None:
        got: list[bytes] = []

        def runtime() -> None:
            got.append(self.request("GET", f"{PREFIX}/invocation/next")[2])

        poller = threading.Thread(target=runtime)
        poller.start()
        time.sleep(0.2)
        self.assertEqual(got, [], "GET /next answered before an event was queued")
        self.backend.put(event("late", b'"now"'))
        poller.join(5)
        self.assertEqual(got, [b'"now"'])


class Answers(ServerTest):
    def next(self, request_id: str) -> Event:
        ev = event(request_id)
        self.backend.put(ev)
        self.assertEqual(self.request("GET", f"{PREFIX}/invocation/next")[0], 200)
        return ev

    def test_a_response_finishes_the_event(self) -> None:
        ev = self.next("req-1")
        self.assertEqual(self.post("/invocation/req-1/response", b'{"ok": true}'), (202, {"status": "OK"}))
        self.assertEqual(ev.result.result(timeout=1), (b'{"ok": true}', False))

    def test_a_second_answer_is_refused(self) -> None:
        ev = self.next("req-1")
        self.assertEqual(self.post("/invocation/req-1/response", b'"one"')[0], 202)
        status, doc = self.post("/invocation/req-1/error", b'{"errorMessage": "two"}')
        self.assertEqual((status, doc["errorType"]), (400, "InvalidRequestID"))
        self.assertEqual(ev.result.result(timeout=1), (b'"one"', False), "the first answer stands")

    def test_an_answer_for_an_unknown_request_is_refused(self) -> None:
        status, doc = self.post("/invocation/nobody/response", b"{}")
        self.assertEqual(status, 400)
        self.assertEqual(doc, {"errorType": "InvalidRequestID", "errorMessage": "Invalid request ID"})
        self.assertEqual(self.backend.done, [("nobody", b"{}", False)])

    def test_the_request_id_in_the_path_is_unquoted(self) -> None:
        ev = self.next("id with/slash")
        self.assertEqual(self.post("/invocation/id%20with%2Fslash/response", b"1")[0], 202)
        self.assertEqual(ev.result.result(timeout=1), (b"1", False))

    def test_a_json_error_document_passes_as_it_is(self) -> None:
        ev = self.next("req-1")
        doc = b'{"errorType": "Handler.Bad", "errorMessage": "no", "stackTrace": ["a"]}'
        self.assertEqual(self.post("/invocation/req-1/error", doc)[0], 202)
        self.assertEqual(ev.result.result(timeout=1), (doc, True))

    def test_any_other_error_body_becomes_a_document_typed_by_the_header(self) -> None:
        ev = self.next("req-1")
        headers = {"Lambda-Runtime-Function-Error-Type": "Runtime.Panic"}
        self.assertEqual(self.post("/invocation/req-1/error", b"thread 'main' panicked", headers)[0], 202)
        body, is_error = ev.result.result(timeout=1)
        self.assertTrue(is_error)
        self.assertEqual(json.loads(body), {"errorType": "Runtime.Panic", "errorMessage": "thread 'main' panicked"})

    def test_an_untyped_error_is_unhandled(self) -> None:
        ev = self.next("req-1")
        self.assertEqual(self.post("/invocation/req-1/error", b'{"not": "an error document"}')[0], 202)
        body, is_error = ev.result.result(timeout=1)
        self.assertTrue(is_error)
        self.assertEqual(json.loads(body), {"errorType": "Unhandled", "errorMessage": '{"not": "an error document"}'})

    def test_a_chunked_body_is_read_whole(self) -> None:
        ev = self.next("req-1")
        self.conn.putrequest("POST", f"{PREFIX}/invocation/req-1/response")
        self.conn.putheader("Transfer-Encoding", "chunked")
        self.conn.endheaders()
        for chunk in (b'{"part": ', b'"one and', b' two"}'):
            self.conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.conn.send(b"0\r\n\r\n")
        resp = self.conn.getresponse()
        resp.read()
        self.assertEqual(resp.status, 202)
        self.assertEqual(ev.result.result(timeout=1), (b'{"part": "one and two"}', False))

    def test_an_empty_response_body(self) -> None:
        ev = self.next("req-1")
        self.assertEqual(self.post("/invocation/req-1/response", b"")[0], 202)
        self.assertEqual(ev.result.result(timeout=1), (b"", False))


class InitErrorAndRoutes(ServerTest):
    def test_init_error_reaches_the_backend(self) -> None:
        doc = b'{"errorType": "Runtime.ConfigError", "errorMessage": "TASK_TABLE is not set"}'
        self.assertEqual(self.post("/init/error", doc), (202, {"status": "OK"}))
        self.assertEqual(self.backend.init_errors, [doc])

    def test_an_init_error_without_a_document_is_runtime_unknown(self) -> None:
        self.assertEqual(self.post("/init/error", b"boom")[0], 202)
        got = [json.loads(b) for b in self.backend.init_errors]
        self.assertEqual(got, [{"errorType": "Runtime.Unknown", "errorMessage": "boom"}])

    def test_other_routes_are_not_found(self) -> None:
        for method, path in (
            ("GET", "/2018-06-01/runtime/invocation/next/"),
            ("GET", "/2020-01-01/extension/event/next"),
            ("POST", f"{PREFIX}/invocation/req-1/progress"),
            ("POST", f"{PREFIX}/restore/next"),
        ):
            with self.subTest(method=method, path=path):
                status, _, body = self.request(method, path, b"{}" if method == "POST" else None)
                self.assertEqual(status, 404)
                self.assertEqual(json.loads(body)["errorType"], "NotFound")
                self.assertIn(path, json.loads(body)["errorMessage"])
        self.assertEqual(self.backend.done, [], "no route reached the backend")
        self.assertEqual(self.backend.init_errors, [])

    def test_the_address_is_loopback_with_the_kernels_port(self) -> None:
        host, port = self.server.address.split(":")
        self.assertEqual(host, "127.0.0.1")
        self.assertGreater(int(port), 0)


class Documents(unittest.TestCase):
    def test_error_document(self) -> None:
        self.assertEqual(json.loads(error_document("T", 'm "q"')), {"errorType": "T", "errorMessage": 'm "q"'})

    def test_error_type_of(self) -> None:
        self.assertEqual(error_type_of(b'{"errorType": "Sandbox.Timedout"}', "d"), "Sandbox.Timedout")
        self.assertEqual(error_type_of(b'{"errorType": ""}', "d"), "d")
        self.assertEqual(error_type_of(b'{"errorType": 3}', "d"), "d")
        self.assertEqual(error_type_of(b'["errorType"]', "d"), "d")
        self.assertEqual(error_type_of(b"not json", "d"), "d")

    def test_an_event_finishes_once(self) -> None:
        ev = event("x")
        self.assertTrue(ev.finish(b"a", False))
        self.assertFalse(ev.finish(b"b", True))
        self.assertEqual(ev.result.result(timeout=0), (b"a", False))


if __name__ == "__main__":
    unittest.main()
