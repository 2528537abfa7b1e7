"""The SAM transform of a template, offline: the plain CloudFormation that CloudFormation would
deploy, for a linter to read (infra/lint.sh lints the GradualDeploy=true path this way).

Usage: python sam_transform.py TEMPLATE OUTPUT [Name=Value ...]  (the tools venv's Python, which
has SAM's translator). Parameters not given take their defaults. Local CodeUri/ContentUri paths
become S3 placeholders, as `sam package` would make them. Exits 1 naming each transform error.
"""

from __future__ import annotations

import json
import os
import re
import sys

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from samtranslator.public.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    """The template names no SAM policy template nor managed policy by name: nothing to load."""

    def load(self) -> dict[str, str]:
        return {}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, output = argv[1], argv[2]
    params = dict(arg.split("=", 1) for arg in argv[3:])
    with open(source) as f:
        text = re.sub(r"^(\s*(?:CodeUri|ContentUri):)\s*\S+\s*$", r"\1 s3://placeholder/code.zip", f.read(), flags=re.M)
    try:
        out = transform(yaml_parse(text), params, NoManagedPolicies())
    except InvalidDocumentException as e:
        for cause in e.causes:
            print(f"sam transform: {cause.message}", file=sys.stderr)
        return 1
    with open(output, "w") as f:
        json.dump(out, f, indent=1)
    kinds: dict[str, int] = {}
    for resource in out["Resources"].values():
        kinds[resource["Type"]] = kinds.get(resource["Type"], 0) + 1
    codedeploy = sum(n for kind, n in kinds.items() if kind.startswith("AWS::CodeDeploy::"))
    print(f"sam transform: {len(out['Resources'])} resources, {codedeploy} of CodeDeploy -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
