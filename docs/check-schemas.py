#!/usr/bin/env python3
"""The shipped configuration files, and the examples', against schemas/ (make docs).

Each file must validate against the schema its "$schema" key names (the shipped ones must name
one); a sample with known mistakes must fail, so that a schema that accepts anything fails here.
"""
import json
import pathlib
import sys

import jsonschema

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMAS = {
    "workflows": json.loads((ROOT / "schemas/workflows.schema.json").read_text()),
    "agents": json.loads((ROOT / "schemas/agents.schema.json").read_text()),
}


def errors(kind, doc):
    validator = jsonschema.Draft202012Validator(SCHEMAS[kind])
    return sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))


def main():
    failed = 0
    files = sorted(ROOT.glob("config/*.json")) + sorted(ROOT.glob("examples/**/*.json"))
    for path in files:
        kind = next((k for k in ("workflows", "agents") if path.name.startswith(k)), None)
        if kind is None:
            continue
        doc = json.loads(path.read_text())
        rel = path.relative_to(ROOT)
        if path.parent.name == "config" and doc.get("$schema") != f"../schemas/{kind}.schema.json":
            print(f"FAIL {rel}: names no $schema ../schemas/{kind}.schema.json")
            failed += 1
        errs = errors(kind, doc)
        for e in errs:
            print(f"FAIL {rel}: at {'/'.join(map(str, e.absolute_path)) or 'the top'}: {e.message}")
        failed += len(errs)
        if not errs:
            print(f"ok   {rel} against schemas/{kind}.schema.json")
    # the schemas must refuse what the functions refuse
    bad_workflows = {"workflows": [{"name": "w", "version": 1, "steps": [
        {"name": "a", "agent": "x", "max_atempts": 3}, {"name": "b", "agent": "x", "timeout_ms": "5s"}]}]}
    bad_agents = {"agents": {
        "a": {"kind": "htp", "url": "https://x"}, "b": {"kind": "http", "url": "https://x", "max_in_flight": 0}}}
    for kind, doc, want in (("workflows", bad_workflows, 2), ("agents", bad_agents, 2)):
        got = len(errors(kind, doc))
        if got < want:
            print(f"FAIL schemas/{kind}.schema.json found {got} of the sample's {want} mistakes")
            failed += 1
    if failed:
        sys.exit(f"{failed} schema problem(s)")
    print("schemas: the shipped configuration validates, and the samples' mistakes are found")


if __name__ == "__main__":
    main()
