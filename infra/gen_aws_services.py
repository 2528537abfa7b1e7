"""Writes crates/protocol/src/service_models.json, the table the `aws` agent kind calls AWS APIs by.

From botocore's published service models (the ones LocalStack's venv carries: `make
localstack-install` first, or any botocore on PYTHONPATH): for every service, the name Step
Functions' `aws-sdk:SERVICE:ACTION` resources give it (botocore's serviceId without a last
" Service", lower case, without spaces and hyphens: `sfn`, `dynamodb`, `redshiftdata`, `config`;
the agent also takes the model's name without hyphens: `lookoutvision`), its protocol, and for the services that
speak JSON 1.0/1.1 (the ones the agent calls) the endpoint prefix, signing name, IAM prefix, target
prefix, JSON version and every operation, with the member that takes a client token
(`idempotencyToken` in the model) where it has one (`Op=Member`, or `Op=Member/N` when it takes at
most N < 64 characters), where its answer's keys are data (maps, documents: Step Functions renames
the others) and which of its request's members take a JSON value as text (long strings, blobs).
An operation is its name alone, or `{"n": name, "o": its answer's shape, "i": request's texts,
"m": the request's members Step Functions names otherwise (camelCase APIs: `names`)}`;
a service's `maps` are the shapes that are or lead to maps and documents (`map_shapes`).

    .local/localstack/venv/bin/python infra/gen_aws_services.py

The output is committed: nothing reads botocore at build or run time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import botocore
import botocore.session

OUT = Path(__file__).resolve().parent.parent / "crates/protocol/src/service_models.json"

# IAM action prefixes that are neither the signing name nor the endpoint prefix.
IAM_PREFIX = {"monitoring": "cloudwatch"}
# The REST-JSON services whose operations the table carries (each operation's HTTP binding is
# larger than a JSON service's name: all 240 would be 2.8 MB): the ones workflows call.
REST_JSON = {
    "batch",
    "bedrock",
    "bedrock-agent",
    "bedrock-agent-runtime",
    "bedrock-runtime",
    "emr-serverless",
    "lambda",
    "polly",
    "scheduler",
}
# The REST-XML services the table carries, with the shapes their answers are read by (S3: the
# service workflows read and write objects in; the others would add their shapes).
REST_XML = {"s3"}
# the query services carried (form-encoded requests, XML answers); not yet EC2 (its shapes alone
# would add 0.7 MB to the table) nor RDS (0.13 MB; not in LocalStack's community edition)
QUERY = {"sns", "sts", "cloudformation", "autoscaling"}
# Names Step Functions gives where the serviceId rule gives another.
SFN_NAME = {"pinpoint-sms-voice": None}


def sfn_name(model_name: str, service_id: str) -> str | None:
    if model_name in SFN_NAME:
        return SFN_NAME[model_name]
    # the AWS SDK for Java 2's client names, which Step Functions' are: "Config Service" is config
    base = service_id[: -len(" Service")] if service_id.endswith(" Service") else service_id
    return base.lower().replace(" ", "").replace("-", "")


def map_shapes(shapes: dict) -> dict:
    """Where an answer's keys are data, not members (Step Functions renames members only): every
    shape that is or leads to a map or a document, as `{member: shape}` (a structure's members
    that lead to one), `{"[]": shape}` (a list), `{"{}": shape of its values or 0}` (a map), or 1
    (a document: left as it is)."""

    def children(shape: dict) -> list[tuple[str, str]]:
        if shape["type"] == "structure":
            return [(m, r["shape"]) for m, r in shape.get("members", {}).items()]
        if shape["type"] == "list":
            return [("[]", shape["member"]["shape"])]
        if shape["type"] == "map":
            return [("{}", shape["value"]["shape"])]
        return []

    leads = {n for n, sh in shapes.items() if sh["type"] == "map" or sh.get("document")}
    grown = True
    while grown:
        grown = False
        for n, sh in shapes.items():
            if n not in leads and any(c in leads for _, c in children(sh)):
                leads.add(n)
                grown = True
    out: dict = {}
    for n in sorted(leads):
        sh = shapes[n]
        if sh.get("document"):
            out[n] = 1
        elif sh["type"] == "map":
            value = sh["value"]["shape"]
            out[n] = {"{}": value if value in leads else 0}
        else:
            out[n] = {k: c for k, c in children(sh) if c in leads}
    return out


def texts(shapes: dict, name: str, depth: int, seen: tuple = ()) -> object:
    """The request's members a definition may give a JSON value that Step Functions sends as its
    text: long strings (`s`: 1 KiB or more, not an enum: a message, a document, an input) and blobs
    (`b`), down to three structures deep; lists as `{"[]": tree}`; None where there is none."""
    if name in seen or depth > 3:
        return None
    shape = shapes[name]
    if shape["type"] == "list":
        sub = texts(shapes, shape["member"]["shape"], depth, (*seen, name))
        return {"[]": sub} if sub else None
    if shape["type"] != "structure":
        return None
    members = {}
    for member, ref in shape.get("members", {}).items():
        child = shapes[ref["shape"]]
        if child["type"] == "blob":
            members[member] = "b"
        elif child["type"] == "string" and "enum" not in child and child.get("max", 1 << 30) >= 1024:
            members[member] = "s"
        elif child["type"] in ("structure", "list"):
            sub = texts(shapes, ref["shape"], depth + 1, (*seen, name))
            if sub:
                members[member] = sub
    return members or None


def names(shapes: dict, name: str, depth: int, seen: tuple = ()) -> object:
    """The request's members whose names Step Functions writes otherwise (its parameters are
    PascalCase, `StateMachineArn`; the API's member is `stateMachineArn`), by the API's name: `0`
    for one renamed, its structure's tree where members below it are, down to six structures deep;
    lists as `{"[]": tree}`, maps left alone (their keys are data); None where there is none."""
    if name in seen or depth > 6:
        return None
    shape = shapes[name]
    if shape["type"] == "list":
        sub = names(shapes, shape["member"]["shape"], depth, (*seen, name))
        return {"[]": sub} if sub else None
    if shape["type"] != "structure":
        return None
    members = {}
    for member, ref in shape.get("members", {}).items():
        sub = None
        if shapes[ref["shape"]]["type"] in ("structure", "list"):
            sub = names(shapes, ref["shape"], depth + 1, (*seen, name))
        if sub:
            members[member] = sub
        elif member[:1].islower():
            members[member] = 0
    return members or None


SCALARS = {
    "string": "s",
    "integer": "i",
    "long": "i",
    "float": "f",
    "double": "f",
    "boolean": "b",
    "timestamp": "t",
    "blob": "B",
}


def wire_shapes(shapes: dict, roots: list, writing: str | None) -> dict:
    """The shapes a REST-XML or query answer is read by (`writing` None), or a query request is
    written by (`writing` "query" or "ec2"), from `roots`: a structure as `{"S": {member: shape, or
    [shape, name on the wire]}}`, a list as `{"L": shape, "n": item name, "f": 1 when flattened}`, a
    map as `{"M": [key, value]}` (and, written, `"k"`/`"v"` its key's and value's names, `"f"`), a
    scalar as its type's letter (`s` string, `i` integer, `f` float, `b` boolean, `t` timestamp,
    `B` blob). An answer's structure leaves out the members that come from elsewhere (headers)."""
    out: dict = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        shape = shapes[name]
        t = shape["type"]
        if t == "structure":
            members = {}
            for m, ref in shape.get("members", {}).items():
                if writing is None and ref.get("location"):
                    continue
                if writing == "ec2":
                    wire = ref.get("queryName") or (
                        ref["locationName"][:1].upper() + ref["locationName"][1:] if "locationName" in ref else m
                    )
                else:
                    wire = ref.get("locationName") or m
                members[m] = [ref["shape"], wire] if wire != m else ref["shape"]
                todo.append(ref["shape"])
            out[name] = {"S": members}
        elif t == "list":
            entry = {"L": shape["member"]["shape"]}
            item = shape["member"].get("locationName")
            if item and item != "member":
                entry["n"] = item
            if shape.get("flattened"):
                entry["f"] = 1
            out[name] = entry
            todo.append(shape["member"]["shape"])
        elif t == "map":
            entry = {"M": [shape["key"]["shape"], shape["value"]["shape"]]}
            if writing is not None:
                if shape["key"].get("locationName", "key") != "key":
                    entry["k"] = shape["key"]["locationName"]
                if shape["value"].get("locationName", "value") != "value":
                    entry["v"] = shape["value"]["locationName"]
                if shape.get("flattened"):
                    entry["f"] = 1
            out[name] = entry
            todo.extend([shape["key"]["shape"], shape["value"]["shape"]])
        else:
            out[name] = SCALARS.get(t, "s")
    return out


def query_op(model: dict, op_name: str, op: dict) -> dict:
    """A query (or EC2) operation: `n` its name (and client token), `qi` its input shape, `x` its
    output shape and `w` the element the answer's result is in (query's `resultWrapper`)."""
    shapes = model["shapes"]
    token = None
    full: dict = {}
    shape = op.get("input", {}).get("shape")
    if shape:
        full["qi"] = shape
        for member, ref in shapes[shape].get("members", {}).items():
            if ref.get("idempotencyToken"):
                most = shapes[ref["shape"]].get("max")
                token = member if most is None or most >= 64 else f"{member}/{most}"
    out = op.get("output", {})
    if out.get("shape"):
        full["x"] = out["shape"]
        if out.get("resultWrapper"):
            full["w"] = out["resultWrapper"]
    full["n"] = f"{op_name}={token}" if token else op_name
    return full


def rest_op(model: dict, op_name: str, op: dict, shape_maps: dict) -> dict:
    """A REST-JSON operation: `h` its method and URI template, `l` where its request's members go
    (`u` the path, `q:NAME` the query, `q` a map of query parameters, `h:NAME` a header, `hs:PREFIX`
    a map of headers), `p` the member that is the body (`NAME:TYPE`), `r` where its answer's
    members come from (`h:NAME:TYPE` a header, `s` the status code), `rp` the member the body is;
    with the JSON services' `n`, `o`, `i` and `m`."""
    shapes = model["shapes"]
    token = None
    full: dict = {"h": f"{op['http']['method']} {op['http']['requestUri']}"}
    shape = op.get("input", {}).get("shape")
    if shape:
        located = {}
        for member, ref in shapes[shape].get("members", {}).items():
            if ref.get("idempotencyToken"):
                most = shapes[ref["shape"]].get("max")
                token = member if most is None or most >= 64 else f"{member}/{most}"
            where = ref.get("location")
            if where == "uri":
                located[member] = "u"
            elif where == "querystring":
                located[member] = f"q:{ref['locationName']}" if "locationName" in ref else "q"
            elif where == "header":
                located[member] = f"h:{ref['locationName']}"
            elif where == "headers":
                located[member] = f"hs:{ref.get('locationName', '')}"
        if located:
            full["l"] = located
        payload = shapes[shape].get("payload")
        if payload:
            full["p"] = f"{payload}:{shapes[shapes[shape]['members'][payload]['shape']]['type']}"
        request = texts(shapes, shape, 0)
        if request is not None:
            full["i"] = request
        renamed = names(shapes, shape, 0)
        if renamed is not None:
            full["m"] = renamed
    out = op.get("output", {}).get("shape")
    if out:
        located = {}
        for member, ref in shapes[out].get("members", {}).items():
            where = ref.get("location")
            if where == "header":
                located[member] = f"h:{ref['locationName']}:{shapes[ref['shape']]['type']}"
            elif where == "statusCode":
                located[member] = "s"
            elif where == "headers":
                located[member] = f"hs:{ref.get('locationName', '')}"
        if located:
            full["r"] = located
        payload = shapes[out].get("payload")
        if payload:
            full["rp"] = f"{payload}:{shapes[shapes[out]['members'][payload]['shape']]['type']}"
        if out in shape_maps:
            full["o"] = out
    if model["metadata"]["protocol"] == "rest-xml":
        payload = shapes[shape].get("payload") if shape else None
        if payload and full["p"].endswith(":structure") and payload in shapes[shape].get("required", []):
            full["xi"] = 1  # a request whose body is always XML: not sent yet
        if out:
            payload = shapes[out].get("payload")
            if payload and shapes[shapes[out]["members"][payload]["shape"]]["type"] == "structure":
                full["x"] = shapes[out]["members"][payload]["shape"]
            elif not payload and any(not r.get("location") for r in shapes[out].get("members", {}).values()):
                full["x"] = out
    full["n"] = f"{op_name}={token}" if token else op_name
    return full


def main() -> int:
    session = botocore.session.get_session()
    loader = session.get_component("data_loader")
    services: dict[str, dict] = {}
    for model_name in sorted(session.get_available_services()):
        model = loader.load_service_model(model_name, "service-2")
        meta = model["metadata"]
        name = sfn_name(model_name, meta["serviceId"])
        if name is None:
            continue
        protocols = meta.get("protocols") or [meta["protocol"]]
        protocol = "json" if "json" in protocols else meta["protocol"]
        entry: dict = {"id": meta["serviceId"], "model": model_name, "protocol": protocol}
        if (protocol, model_name) in {("rest-xml", m) for m in REST_XML} | {("rest-json", m) for m in REST_JSON}:
            signing = meta.get("signingName") or meta["endpointPrefix"]
            shape_maps = map_shapes(model["shapes"])
            ops = [rest_op(model, name_, op, shape_maps) for name_, op in sorted(model["operations"].items())]
            entry.update(
                {
                    "endpoint": meta["endpointPrefix"],
                    "signing": signing,
                    "iam": IAM_PREFIX.get(signing, signing),
                    "ops": ops,
                    "maps": shape_maps,
                }
            )
            if protocol == "rest-xml":
                entry["xml"] = wire_shapes(model["shapes"], [o["x"] for o in ops if "x" in o], None)
        if protocol in ("query", "ec2") and model_name in QUERY:
            signing = meta.get("signingName") or meta["endpointPrefix"]
            ops = [query_op(model, name_, op) for name_, op in sorted(model["operations"].items())]
            entry.update(
                {
                    "endpoint": meta["endpointPrefix"],
                    "signing": signing,
                    "iam": IAM_PREFIX.get(signing, signing),
                    "version": meta["apiVersion"],
                    "ops": ops,
                    "maps": map_shapes(model["shapes"]),
                    "xml": wire_shapes(model["shapes"], [o["x"] for o in ops if "x" in o], None),
                    "qs": wire_shapes(model["shapes"], [o["qi"] for o in ops if "qi" in o], protocol),
                }
            )
        if protocol == "json":
            signing = meta.get("signingName") or meta["endpointPrefix"]
            shape_maps = map_shapes(model["shapes"])
            ops = []
            for op_name, op in sorted(model["operations"].items()):
                token = None
                shape = op.get("input", {}).get("shape")
                if shape:
                    for member, ref in model["shapes"][shape].get("members", {}).items():
                        if ref.get("idempotencyToken"):
                            # the longest token the member takes, where under 64 characters
                            most = model["shapes"][ref["shape"]].get("max")
                            token = member if most is None or most >= 64 else f"{member}/{most}"
                label = f"{op_name}={token}" if token else op_name
                answer = op["output"]["shape"] if "output" in op and op["output"]["shape"] in shape_maps else None
                request = texts(model["shapes"], shape, 0) if shape else None
                renamed = names(model["shapes"], shape, 0) if shape else None
                if answer is None and request is None and renamed is None:
                    ops.append(label)
                else:
                    full = {"n": label}
                    if answer is not None:
                        full["o"] = answer
                    if request is not None:
                        full["i"] = request
                    if renamed is not None:
                        full["m"] = renamed
                    ops.append(full)
            entry.update(
                {
                    "endpoint": meta["endpointPrefix"],
                    "signing": signing,
                    "iam": IAM_PREFIX.get(signing, signing),
                    "target": meta["targetPrefix"],
                    "json_version": meta.get("jsonVersion", "1.0"),
                    "ops": ops,
                    "maps": shape_maps,
                }
            )
        if name in services:
            print(f"two services named {name}: {services[name]['model']}, {model_name}", file=sys.stderr)
            return 1
        services[name] = entry
    # one service a line: a model update reads as a diff of the services it changed
    lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(services.items())]
    body = ",\n".join(lines)
    OUT.write_text(f'{{"botocore": {json.dumps(botocore.__version__)}, "services": {{\n{body}\n}}}}\n')
    json_ones = sum(1 for s in services.values() if "ops" in s)
    ops = sum(len(s.get("ops", [])) for s in services.values())
    called = (
        f"{json_ones} called (JSON, REST-JSON's {len(REST_JSON)}, REST-XML's {len(REST_XML)}, query's {len(QUERY)})"
    )
    print(f"{OUT}: {len(services)} services, {called}, {ops} of their operations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
