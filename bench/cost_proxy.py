#!/usr/bin/env python3
"""A counting HTTP/1.1 proxy in front of LocalStack, for `make bench-cost` (stdlib only).

Point an AWS SDK at it (AWS_ENDPOINT_URL=http://127.0.0.1:<port>): every request is forwarded
unchanged to the real endpoint (--upstream; LocalStack does not verify SigV4 signatures, so the
bytes need no re-signing) and counted:

- service and operation: the JSON protocol's X-Amz-Target (DynamoDB_20120810.PutItem,
  AmazonSQS.SendMessageBatch), else the query protocol's Action= (SNS Publish); the service
  comes from the SigV4 credential scope;
- the resource: SQS queue name, DynamoDB table (and index for Query/Scan), SNS topic name;
- SQS/SNS billed requests: one per started 64 KB of payload (request or response, the larger);
  SQS messages received, and whether a ReceiveMessage was empty;
- DynamoDB read units, from what was read (GetItem/Query/Scan/BatchGetItem), and write units,
  from the item before and after each write (read with GetItem ConsistentRead straight from the
  upstream, not counted), split by base table and by each global secondary index, whose key
  schema and projection come from DescribeTable (so index changes need no edit here).

Writes to DynamoDB are serialised (one at a time) so that the before/after reads are exact.

Control endpoints (on the same port): GET /_cost/counters (JSON), POST /_cost/reset,
GET /_cost/health. The pure cost functions are unit-tested in bench/test_cost_proxy.py.
"""

from __future__ import annotations

import argparse
import contextlib
import decimal
import gzip
import http.client
import json
import math
import re
import sys
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KB = 1024
SQS_CHUNK = 64 * KB
INDEX_OVERHEAD = 100  # bytes DynamoDB adds to every GSI entry

# ---------------------------------------------------------------------------------------------
# DynamoDB sizes and capacity units (pure functions)
# ---------------------------------------------------------------------------------------------


def number_size(text: str) -> int:
    """Bytes DynamoDB stores for a number: about 1 byte per 2 significant digits, + 1 (+1 if
    negative)."""
    t = text.strip().lower()
    negative = t.startswith("-")
    t = t.lstrip("+-")
    try:
        d = decimal.Decimal(t)
    except decimal.InvalidOperation:
        return len(t)
    digits = d.normalize().as_tuple().digits if d != 0 else (0,)
    # Significant digits: strip leading and trailing zeros of the mantissa.
    s = "".join(map(str, digits)).strip("0") or "0"
    return (len(s) + 1) // 2 + 1 + (1 if negative else 0)


def value_size(v: dict) -> int:
    """Size of one DynamoDB-JSON attribute value ({"S": ...}, {"N": ...}, {"M": {...}}, ...)."""
    (kind, x), = v.items()
    if kind == "S":
        return len(x.encode("utf-8"))
    if kind == "N":
        return number_size(x)
    if kind == "B":
        return len(x) * 3 // 4 - x.count("=") if isinstance(x, str) else len(x)  # base64 in JSON
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in x)
    if kind == "NS":
        return sum(number_size(n) for n in x)
    if kind == "BS":
        return sum(value_size({"B": b}) for b in x)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + value_size(e) + 1 for k, e in x.items())
    if kind == "L":
        return 3 + sum(value_size(e) + 1 for e in x)
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict | None) -> int:
    """Size of an item: the sum of its attribute names (UTF-8) and values."""
    if not item:
        return 0
    return sum(len(k.encode("utf-8")) + value_size(v) for k, v in item.items())


def write_units_for(size: int) -> int:
    return max(1, math.ceil(size / KB))


def read_units_for(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / (4 * KB)))
    return units if consistent else units / 2


class IndexDef:
    """A global secondary index: its key attributes and what it projects."""

    def __init__(self, name: str, keys: list[str], projection: str, non_key: list[str] | None = None):
        self.name = name
        self.keys = keys
        self.projection = projection  # ALL | KEYS_ONLY | INCLUDE
        self.non_key = list(non_key or [])

    @classmethod
    def from_description(cls, gsi: dict) -> IndexDef:
        proj = gsi.get("Projection", {})
        return cls(
            gsi["IndexName"],
            [k["AttributeName"] for k in gsi["KeySchema"]],
            proj.get("ProjectionType", "ALL"),
            proj.get("NonKeyAttributes"),
        )

    def entry(self, item: dict | None, table_keys: list[str]) -> dict | None:
        """The index entry of an item (its projected attributes), or None when the item is not in
        the (sparse) index."""
        if not item or any(k not in item for k in self.keys):
            return None
        if self.projection == "ALL":
            return dict(item)
        names = list(dict.fromkeys(table_keys + self.keys + (self.non_key if self.projection == "INCLUDE" else [])))
        return {n: item[n] for n in names if n in item}

    def entry_size(self, entry: dict) -> int:
        return item_size(entry) + INDEX_OVERHEAD

    def write_units(self, before: dict | None, after: dict | None, table_keys: list[str]) -> int:
        """Write units this index consumes when `before` becomes `after` (None: no item)."""
        old, new = self.entry(before, table_keys), self.entry(after, table_keys)
        if old is None and new is None:
            return 0
        if old is None:
            return write_units_for(self.entry_size(new))
        if new is None:
            return write_units_for(self.entry_size(old))
        if any(old.get(k) != new.get(k) for k in self.keys):
            return write_units_for(self.entry_size(old)) + write_units_for(self.entry_size(new))
        if old != new:
            return write_units_for(self.entry_size(new))
        return 0


def write_cost(
    before: dict | None,
    after: dict | None,
    table_keys: list[str],
    indexes: list[IndexDef],
    transactional: bool = False,
) -> dict[str, int]:
    """Write units of one successful item write, {"table": n, "<index name>": n, ...}."""
    base = write_units_for(max(item_size(before), item_size(after)))
    cost = {"table": base * (2 if transactional else 1)}
    for ix in indexes:
        cost[ix.name] = ix.write_units(before, after, table_keys)
    return cost


def failed_write_cost(existing: dict | None, transactional: bool = False) -> dict[str, int]:
    """A write refused by its condition still consumes the units of the item it checked."""
    return {"table": write_units_for(item_size(existing)) * (2 if transactional else 1)}


def query_read_units(items: list[dict], consistent: bool) -> float:
    """A Query or Scan page: the total size of the items read, rounded up to 4 KB once."""
    return read_units_for(sum(item_size(i) for i in items), consistent)


# ---------------------------------------------------------------------------------------------
# Talking to the upstream
# ---------------------------------------------------------------------------------------------

FAKE_AUTH = (
    "AWS4-HMAC-SHA256 Credential=test/20240101/{region}/{service}/aws4_request, "
    "SignedHeaders=content-type;host;x-amz-date, Signature=" + "0" * 64
)


class Upstream:
    """Keep-alive connections to the real endpoint, one per thread."""

    def __init__(self, url: str, region: str = "us-east-1"):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.region = region
        self._local = threading.local()

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            c = http.client.HTTPConnection(self.host, self.port, timeout=120)
            self._local.conn = c
        return c

    def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes):
        """Send one request as is; (status, reason, headers, body)."""
        for attempt in (0, 1):
            c = self._conn(fresh=attempt > 0)
            try:
                c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for k, v in headers:
                    c.putheader(k, v)
                c.endheaders(body if body else None)
                r = c.getresponse()
                data = r.read()
                return r.status, r.reason, r.getheaders(), data
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                http.client.CannotSendRequest,
            ):
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def call(self, service: str, target: str, payload: dict) -> tuple[int, dict]:
        """A JSON-protocol call of our own (not counted)."""
        body = json.dumps(payload).encode()
        headers = [
            ("Host", f"{self.host}:{self.port}"),
            ("Content-Type", "application/x-amz-json-1.0"),
            ("X-Amz-Target", target),
            ("X-Amz-Date", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())),
            ("Authorization", FAKE_AUTH.format(region=self.region, service=service)),
            ("Content-Length", str(len(body))),
        ]
        status, _, _, data = self.request("POST", "/", headers, body)
        return status, json.loads(data or b"{}")

    def ddb(self, op: str, payload: dict) -> dict:
        status, out = self.call("dynamodb", f"DynamoDB_20120810.{op}", payload)
        if status != 200:
            raise RuntimeError(f"DynamoDB {op}: HTTP {status}: {out}")
        return out


# ---------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------

HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade", "expect", "content-length",
}
DDB_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
SCOPE = re.compile(r"Credential=[^/]*/[^/]*/[^/]*/([^/]*)/aws4_request")


def decoded(headers, body: bytes) -> bytes:
    enc = ""
    for k, v in headers:
        if k.lower() == "content-encoding":
            enc = v.lower()
    if enc == "gzip":
        return gzip.decompress(body)
    if enc == "deflate":
        return zlib.decompress(body)
    return body


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.rows: dict[tuple[str, str, str], dict] = {}
            self.since = time.time()

    def add(self, service: str, op: str, resource: str, **fig):
        with self.lock:
            row = self.rows.setdefault(
                (service, op, resource),
                {"service": service, "op": op, "resource": resource, "requests": 0, "billed": 0,
                 "messages": 0, "empty": 0, "rcu": 0.0, "wcu": {}, "items": 0, "bytes": 0,
                 "failed_conditions": 0, "errors": 0},
            )
            row["requests"] += 1
            for k, v in fig.items():
                if k == "wcu":
                    for name, n in v.items():
                        row["wcu"][name] = row["wcu"].get(name, 0) + n
                else:
                    row[k] += v

    def snapshot(self) -> dict:
        with self.lock:
            rows = [dict(r, wcu=dict(r["wcu"])) for r in self.rows.values()]
            return {"since": self.since, "until": time.time(), "rows": rows}


class Tables:
    """Key schema and GSIs per table, from DescribeTable (cached)."""

    def __init__(self, upstream: Upstream):
        self.upstream = upstream
        self.cache: dict[str, tuple[list[str], list[IndexDef]]] = {}
        self.lock = threading.Lock()

    def get(self, table: str) -> tuple[list[str], list[IndexDef]]:
        with self.lock:
            if table not in self.cache:
                t = self.upstream.ddb("DescribeTable", {"TableName": table})["Table"]
                keys = [k["AttributeName"] for k in t["KeySchema"]]
                ixs = [IndexDef.from_description(g) for g in t.get("GlobalSecondaryIndexes", [])]
                self.cache[table] = (keys, ixs)
            return self.cache[table]


def s3_op(method: str, path: str) -> str:
    """An S3 REST request's action, by its method and query (path-style addressing)."""
    u = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
    has_key = "/" in u.path.lstrip("/")
    if method == "GET":
        if not has_key:
            return "ListObjectsV2" if query.get("list-type") == ["2"] else "ListObjects"
        return "GetObject"
    if method == "PUT":
        return "PutObject" if has_key else "CreateBucket"
    return {"HEAD": "HeadObject", "DELETE": "DeleteObject", "POST": "PostObject"}.get(method, method)


class Proxy:
    def __init__(self, upstream: Upstream, trace: str | None = None):
        self.upstream = upstream
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115 - lives as long as the proxy
        self.counters = Counters()
        self.tables = Tables(upstream)
        self.write_lock = threading.Lock()

    # -- one request ---------------------------------------------------------------------------

    def handle(self, method, path, headers, body):
        h = {k.lower(): v for k, v in headers}
        target = h.get("x-amz-target", "")
        m = SCOPE.search(h.get("authorization", ""))
        service = m.group(1) if m else "?"
        op, params = "", {}
        if target:
            op = target.rsplit(".", 1)[-1]
            try:
                params = json.loads(body or b"{}")
            except ValueError:
                params = {}
        elif "x-www-form-urlencoded" in h.get("content-type", ""):
            form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
            params = {k: v[0] for k, v in form.items()}
            op = params.get("Action", "")
        if not op and service == "s3":
            op = s3_op(method, path)
        if not op:
            op = f"{method} {urllib.parse.urlsplit(path).path}"
        if service == "dynamodb" and op in DDB_WRITES:
            with self.write_lock:
                before = self._read_keys(op, params)
                resp = self.upstream.request(method, path, headers, body)
                after = self._read_keys(op, params)
            self._count_ddb_write(op, params, resp, before, after)
        else:
            resp = self.upstream.request(method, path, headers, body)
            try:
                self._count(service, op, params, body, resp, path)
            except Exception as e:  # noqa: BLE001 - counting must never break the proxied call
                print(f"cost_proxy: cannot count {service} {op}: {e!r}", file=sys.stderr)
                self.counters.add(service, op, "?", errors=1)
        return resp

    # -- DynamoDB writes -----------------------------------------------------------------------

    def _write_targets(self, op, params):
        """[(table, key, kind)] of a write request; kind is put/update/delete/check."""
        out = []
        if op in ("PutItem", "UpdateItem", "DeleteItem"):
            table = params["TableName"]
            keys, _ = self.tables.get(table)
            src = params["Item"] if op == "PutItem" else params["Key"]
            out.append((table, {k: src[k] for k in keys}, op))
        elif op == "BatchWriteItem":
            for table, reqs in params.get("RequestItems", {}).items():
                keys, _ = self.tables.get(table)
                for r in reqs:
                    if "PutRequest" in r:
                        out.append((table, {k: r["PutRequest"]["Item"][k] for k in keys}, "PutItem"))
                    else:
                        out.append((table, {k: r["DeleteRequest"]["Key"][k] for k in keys}, "DeleteItem"))
        elif op == "TransactWriteItems":
            for t in params.get("TransactItems", []):
                (kind, spec), = t.items()
                table = spec["TableName"]
                keys, _ = self.tables.get(table)
                src = spec["Item"] if kind == "Put" else spec["Key"]
                out.append((table, {k: src[k] for k in keys}, kind))
        return out

    def _read_keys(self, op, params):
        try:
            targets = self._write_targets(op, params)
        except (KeyError, ValueError, RuntimeError):
            return None
        return [
            self.upstream.ddb("GetItem", {"TableName": t, "Key": k, "ConsistentRead": True}).get("Item")
            for t, k, _ in targets
        ]

    def _count_ddb_write(self, op, params, resp, before, after):
        status, _, rheaders, rbody = resp
        table = params.get("TableName") or ",".join(params.get("RequestItems", {}).keys()) or "(transaction)"
        if before is None or after is None:
            self.counters.add("dynamodb", op, table, errors=1)
            return
        targets = self._write_targets(op, params)
        transactional = op == "TransactWriteItems"
        wcu: dict[str, int] = {}

        def add(cost):
            for k, v in cost.items():
                wcu[k] = wcu.get(k, 0) + v

        if status == 200:
            unprocessed = set()
            if op == "BatchWriteItem":
                out = json.loads(decoded(rheaders, rbody) or b"{}")
                for t, reqs in out.get("UnprocessedItems", {}).items():
                    keys, _ = self.tables.get(t)
                    for r in reqs:
                        src = r["PutRequest"]["Item"] if "PutRequest" in r else r["DeleteRequest"]["Key"]
                        unprocessed.add((t, json.dumps({k: src[k] for k in keys}, sort_keys=True)))
            for (t, key, kind), b, a in zip(targets, before, after, strict=True):
                if (t, json.dumps(key, sort_keys=True)) in unprocessed:
                    continue
                keys, ixs = self.tables.get(t)
                if kind == "ConditionCheck":
                    cost = failed_write_cost(b, transactional)
                else:
                    cost = write_cost(b, a, keys, ixs, transactional)
                add(cost)
                self._trace(op, t, key, b, a, cost, ixs, keys)
            self.counters.add("dynamodb", op, table, wcu=wcu)
            return
        err = json.loads(decoded(rheaders, rbody) or b"{}").get("__type", "")
        if "ConditionalCheckFailed" in err or "TransactionCanceled" in err:
            for (t, key, _), b in zip(targets, before, strict=True):
                cost = failed_write_cost(b, transactional)
                add(cost)
                self._trace(op + " (condition failed)", t, key, b, b, cost, [], [])
            self.counters.add("dynamodb", op, table, wcu=wcu, failed_conditions=1)
        else:
            self.counters.add("dynamodb", op, table, errors=1)

    def _trace(self, op, table, key, before, after, cost, ixs, keys):
        """One line of JSON per item write (--trace): sizes and units, to check the rules by hand."""
        if not self.trace:
            return
        state = lambda i: (i or {}).get("ProcessState", {}).get("S")  # noqa: E731
        line = {
            "t": round(time.time(), 3), "op": op, "table": table,
            "key": {k: next(iter(v.values())) for k, v in key.items()},
            "state": [state(before), state(after)], "size": [item_size(before), item_size(after)],
            "index_entry": {ix.name: [ix.entry_size(e) if (e := ix.entry(before, keys)) else None,
                                      ix.entry_size(e) if (e := ix.entry(after, keys)) else None] for ix in ixs},
            "wcu": cost,
        }
        self.trace.write(json.dumps(line) + "\n")

    # -- everything else -----------------------------------------------------------------------

    def _count(self, service, op, params, body, resp, path="/"):
        status, _, rheaders, rbody = resp
        out_raw = decoded(rheaders, rbody)
        ok = 200 <= status < 300
        if service == "sqs":
            queue = (params.get("QueueUrl") or "").rstrip("/").rsplit("/", 1)[-1] or "-"
            billed = max(1, math.ceil(max(len(body), len(out_raw)) / SQS_CHUNK))
            fig = {"billed": billed}
            if op == "ReceiveMessage" and ok:
                try:
                    n = len(json.loads(out_raw or b"{}").get("Messages", []))
                except ValueError:
                    n = out_raw.count(b"<Message>")
                fig["messages"] = n
                fig["empty"] = 0 if n else 1
            if not ok:
                fig["errors"] = 1
            self.counters.add("sqs", op, queue, **fig)
        elif service == "sns":
            topic = (params.get("TopicArn") or params.get("TargetArn") or "-").rsplit(":", 1)[-1]
            billed = max(1, math.ceil(len(body) / SQS_CHUNK))
            self.counters.add("sns", op, topic, billed=billed, errors=0 if ok else 1)
        elif service == "dynamodb":
            self._count_ddb_read(op, params, out_raw, ok)
        elif service == "s3":
            bucket = urllib.parse.urlsplit(path).path.lstrip("/").split("/", 1)[0] or "-"
            self.counters.add("s3", op, bucket, billed=1, errors=0 if ok else 1)
        else:
            self.counters.add(service, op, "-", billed=1, errors=0 if ok else 1)

    def _count_ddb_read(self, op, params, out_raw, ok):
        table = params.get("TableName", "-")
        if not ok:
            self.counters.add("dynamodb", op, table, errors=1)
            return
        out = json.loads(out_raw or b"{}")
        if op == "GetItem":
            item = out.get("Item")
            if "ProjectionExpression" in params or "AttributesToGet" in params:
                item = self.upstream.ddb(
                    "GetItem", {"TableName": table, "Key": params["Key"], "ConsistentRead": True}
                ).get("Item")
            rcu = read_units_for(item_size(item), bool(params.get("ConsistentRead")))
            self.counters.add("dynamodb", op, table, rcu=rcu, items=1 if item else 0)
        elif op in ("Query", "Scan"):
            returned = out.get("Items", [])
            read = returned
            shaping = (
                "ProjectionExpression", "AttributesToGet", "Select", "FilterExpression", "QueryFilter", "ScanFilter"
            )
            shadow = {k: v for k, v in params.items() if k not in shaping}
            if len(shadow) != len(params):
                # Units follow the items read, before projection and filter: read them again.
                used = " ".join(str(shadow.get(k, "")) for k in ("KeyConditionExpression", "ConditionExpression"))
                for key in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
                    if key in shadow:
                        kept = {n: v for n, v in shadow[key].items() if re.search(re.escape(n) + r"\b", used)}
                        if kept:
                            shadow[key] = kept
                        else:
                            del shadow[key]
                read = self.upstream.ddb(op, shadow).get("Items", [])
            consistent = bool(params.get("ConsistentRead")) and "IndexName" not in params
            resource = table + (f"/{params['IndexName']}" if "IndexName" in params else "")
            self.counters.add(
                "dynamodb", op, resource,
                rcu=query_read_units(read, consistent), items=len(returned),
                bytes=sum(item_size(i) for i in returned),
            )
        elif op == "BatchGetItem":
            rcu, n = 0.0, 0
            for t, items in out.get("Responses", {}).items():
                consistent = bool(params.get("RequestItems", {}).get(t, {}).get("ConsistentRead"))
                for i in items:
                    rcu += read_units_for(item_size(i), consistent)
                    n += 1
            self.counters.add("dynamodb", op, ",".join(params.get("RequestItems", {}).keys()), rcu=rcu, items=n)
        else:
            self.counters.add("dynamodb", op, table)


# ---------------------------------------------------------------------------------------------
# HTTP server
# ---------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: Proxy  # set on the class by serve()

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(self, status, reason, headers, body):
        self.send_response_only(status, reason)
        for k, v in headers:
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _control(self, body):
        path = urllib.parse.urlsplit(self.path).path
        if path == "/_cost/counters":
            out = self.proxy.counters.snapshot()
        elif path == "/_cost/reset" and self.command == "POST":
            self.proxy.counters.reset()
            out = {"reset": True}
        elif path == "/_cost/health":
            out = {"ok": True}
        else:
            return self._reply(404, "Not Found", [("Content-Type", "text/plain")], b"no such control path\n")
        return self._reply(200, "OK", [("Content-Type", "application/json")], json.dumps(out).encode())

    def _any(self):
        body = self._body()
        if self.path.startswith("/_cost/"):
            return self._control(body)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP]
        if body or self.command in ("POST", "PUT"):
            headers.append(("Content-Length", str(len(body))))
        try:
            status, reason, rheaders, rbody = self.proxy.handle(self.command, self.path, headers, body)
        except Exception as e:  # noqa: BLE001
            print(f"cost_proxy: upstream failed: {e!r}", file=sys.stderr)
            return self._reply(502, "Bad Gateway", [("Content-Type", "text/plain")], f"cost_proxy: {e!r}\n".encode())
        return self._reply(status, reason, rheaders, rbody)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _any  # noqa: N815 - http.server's handler names


def serve(listen: str, upstream: str, port_file: str | None, trace: str | None = None):
    host, _, port = listen.rpartition(":")
    Handler.proxy = Proxy(Upstream(upstream), trace)
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    actual = server.server_address[1]
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{actual}\n")
        import os

        os.replace(port_file + ".tmp", port_file)
    print(f"cost_proxy: listening on {host or '127.0.0.1'}:{actual}, forwarding to {upstream}", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: any free port)")
    p.add_argument("--upstream", required=True, help="the real endpoint, e.g. http://127.0.0.1:4566")
    p.add_argument("--port-file", help="write the port listened on here once listening")
    p.add_argument("--trace", help="append one JSON line per DynamoDB item write (sizes, units) to this file")
    a = p.parse_args(argv)
    serve(a.listen, a.upstream, a.port_file, a.trace)


if __name__ == "__main__":
    main()
