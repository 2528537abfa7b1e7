#!/usr/bin/env python3
"""Every relative link of README.md points at a file or directory of the repository, and a link
with #anchor into a Markdown file at one of its headings (as MkDocs names them). Run by `make docs`;
exits 1 naming each broken link. Links to http(s) and mailto are not checked."""
import pathlib
import re
import sys
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(text: str) -> str:
    """The anchor MkDocs' toc extension gives a heading (its default slugify)."""
    text = re.sub(r"`|\*|\[|\]\([^)]*\)", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: pathlib.Path) -> set:
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#").strip()))
    return found


def main() -> int:
    readme = ROOT / "README.md"
    broken, checked, fenced = [], 0, False
    for n, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^(https?:|mailto:)", target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            where = (ROOT / path) if path else readme
            if not where.exists():
                broken.append(f"README.md:{n}: {target}: no such file")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"README.md:{n}: {target}: no heading #{anchor} in {path or 'README.md'}")
    for b in broken:
        print(b, file=sys.stderr)
    print(f"README.md: {checked} relative links checked, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
