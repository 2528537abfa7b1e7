"""Writes crates/protocol/src/aws_services.json, the table the `aws` agent kind calls AWS APIs by.

From botocore's published service models (the ones LocalStack's venv carries: `make
localstack-install` first, or any botocore on PYTHONPATH): for every service, the name Step
Functions' `aws-sdk:SERVICE:ACTION` resources give it (botocore's serviceId without a last
" Service", lower case, without spaces and hyphens: `sfn`, `dynamodb`, `redshiftdata`, `config`;
the agent also takes the model's name without hyphens: `lookoutvision`), its protocol, and for the services that
speak JSON 1.0/1.1 (the ones the agent calls) the endpoint prefix, signing name, IAM prefix, target
prefix, JSON version and every operation, with the member that takes a client token
(`idempotencyToken` in the model) where it has one (`Op=Member`, or `Op=Member/N` when it takes at
most N < 64 characters).

    .local/localstack/venv/bin/python infra/gen_aws_services.py

The output is committed: nothing reads botocore at build or run time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import botocore
import botocore.session

OUT = Path(__file__).resolve().parent.parent / "crates/protocol/src/aws_services.json"

# IAM action prefixes that are neither the signing name nor the endpoint prefix.
IAM_PREFIX = {"monitoring": "cloudwatch"}
# Names Step Functions gives where the serviceId rule gives another.
SFN_NAME = {"pinpoint-sms-voice": None}


def sfn_name(model_name: str, service_id: str) -> str | None:
    if model_name in SFN_NAME:
        return SFN_NAME[model_name]
    # the AWS SDK for Java 2's client names, which Step Functions' are: "Config Service" is config
    base = service_id[: -len(" Service")] if service_id.endswith(" Service") else service_id
    return base.lower().replace(" ", "").replace("-", "")


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
        if protocol == "json":
            signing = meta.get("signingName") or meta["endpointPrefix"]
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
                ops.append(f"{op_name}={token}" if token else op_name)
            entry.update(
                {
                    "endpoint": meta["endpointPrefix"],
                    "signing": signing,
                    "iam": IAM_PREFIX.get(signing, signing),
                    "target": meta["targetPrefix"],
                    "json_version": meta.get("jsonVersion", "1.0"),
                    "ops": ops,
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
    json_ones = sum(1 for s in services.values() if s["protocol"] == "json")
    ops = sum(len(s.get("ops", [])) for s in services.values())
    print(f"{OUT}: {len(services)} services, {json_ones} speaking JSON, {ops} of their operations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
