#!/usr/bin/env python3
"""Run a tutorial page's commands as written: CI follows the book, so the book cannot rot.

    docs/run-tutorial.py PAGE [--set NAME=VALUE ...] [--python PYTHON]

Every fenced ```bash or ```python block right after a line `<!-- ci: run -->` in PAGE runs, in
the page's order: consecutive bash blocks in one bash (set -euo pipefail), so a variable set in
one is there in the next; each python block with PYTHON (default python3). `--set NAME=VALUE` gives a
name another value for the run, the same way in both languages: a bash line `NAME=...` becomes
`NAME=VALUE`, a python line `NAME = "..."` becomes `NAME = "VALUE"`, and a literal `--stack OLD`
or `--stack-name OLD` where OLD was NAME's value follows it (the CI stack is not named `sas`).
Exits with the first failing block's status; prints each block before it runs.
"""
import argparse
import pathlib
import re
import subprocess
import sys

MARK = "<!-- ci: run -->"


def blocks(text):
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == MARK:
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            fence = lines[j].strip() if j < len(lines) else ""
            lang = fence[3:].strip()
            if not fence.startswith("```") or lang not in ("bash", "python"):
                sys.exit(f"{MARK} at line {i + 1} is not followed by a ```bash or ```python block")
            k = j + 1
            while k < len(lines) and lines[k].strip() != "```":
                k += 1
            yield lang, j + 2, "\n".join(lines[j + 1 : k])
            i = k
        i += 1


def substitute(lang, code, sets, old_values):
    for name, value in sets.items():
        if lang == "bash":
            code = re.sub(rf"(?m)^{re.escape(name)}=\S*", f"{name}={value}", code)
        else:
            code = re.sub(rf'(?m)^{re.escape(name)} = "[^"]*"', f'{name} = "{value}"', code)
        old = old_values.get(name)
        if old:
            code = re.sub(rf"(--stack(?:-name)?) {re.escape(old)}\b", rf"\1 {value}", code)
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--python", default="python3")
    args = ap.parse_args()
    text = pathlib.Path(args.page).read_text(encoding="utf-8")
    sets = dict(s.split("=", 1) for s in args.set)
    # the page's own values of the names set, e.g. stack=sas
    old_values = {}
    for name in sets:
        m = re.search(rf"(?m)^{re.escape(name)}=(\S+)", text)
        if m:
            old_values[name] = m.group(1)
    found = list(blocks(text))
    if not found:
        sys.exit(f"{args.page}: no block marked {MARK}")
    # consecutive bash blocks run in one bash, so a variable set in one is there in the next
    group = []
    for lang, line, raw in [*found, ("end", 0, "")]:
        code = substitute(lang, raw, sets, old_values)
        if lang != "bash" and group:
            rc = subprocess.call(["bash", "-c", "\n".join(["set -euo pipefail", *group])])
            if rc:
                sys.exit(f"{args.page}: a bash block exited {rc}")
            group = []
        if lang == "end":
            break
        print(f"--- {args.page}:{line} ({lang})\n{code}\n---", flush=True)
        if lang == "bash":
            group.append(code)
        else:
            rc = subprocess.call([args.python, "-c", code])
            if rc:
                sys.exit(f"{args.page}:{line}: the python block exited {rc}")
    print(f"{args.page}: {len(found)} block(s) ran", flush=True)


if __name__ == "__main__":
    main()
