"""A function's layers, as Lambda applies them, for functions that run as host processes.

Lambda unpacks a function's layers into /opt in their order, a later layer's file replacing an
earlier one's of the same path. A host process cannot be given its own /opt, so the layers are
merged into one directory per set of layers (`merged_dir`: named by a hash of the layers' unpacked
locations, which LocalStack keys by each layer version's code, so every function version with the
same layers shares it and a new layer version gets a new directory), and every environment
variable whose value is a path under /opt is pointed at that directory instead (`rewrite_opt`):
e.g. SAS_WORKFLOWS_FILE=/opt/workflows.json becomes <merged>/workflows.json. Paths that the code
itself builds from "/opt" (not from a variable) are not rewritten.

No LocalStack import: tested with `python3 -m unittest` (infra/lambda-executor/test_layers.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

OPT = "/opt"

_merge_lock = threading.Lock()


def merged_dir(root: Path, layer_dirs: Iterable[Path]) -> Path:
    """Where the merge of `layer_dirs` (in this order) lives under `root`."""
    digest = hashlib.sha256("\n".join(str(d) for d in layer_dirs).encode()).hexdigest()[:20]
    return root / digest / "opt"


def merge(layer_dirs: list[Path], target: Path) -> Path:
    """Copy each directory of `layer_dirs` into `target`, in order (later ones win); returns
    `target`. Done once: an existing `target` is a finished merge (it is renamed into place only
    when complete), so concurrent environments of a function share it."""
    with _merge_lock:
        if target.is_dir():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".merge-", dir=target.parent))
        try:
            for d in layer_dirs:
                if not d.is_dir():
                    raise FileNotFoundError(f"layer content {d} is not a directory")
                shutil.copytree(d, staging, symlinks=True, dirs_exist_ok=True)
            os.chmod(staging, 0o755)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def rewrite_opt(env: Mapping[str, str], opt_dir: Path) -> dict[str, str]:
    """`env` with each value that is /opt or starts with /opt/ moved to `opt_dir`."""
    out = dict(env)
    for key, value in env.items():
        if value == OPT:
            out[key] = str(opt_dir)
        elif value.startswith(OPT + "/"):
            out[key] = str(opt_dir) + value[len(OPT) :]
    return out
