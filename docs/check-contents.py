#!/usr/bin/env python3
"""The book's contents lists agree with its nav. mkdocs.yml's `nav` is the one source of the
book's pages (mkdocs build --strict fails on a page left out of it); the section "## The book" of
docs/index.md and of README.md lists the same pages, each once, in the nav's order (index.md
itself aside; README.md may name the changelog as CHANGELOG.md). Run by `make docs` with the docs
venv's Python (it needs PyYAML, which MkDocs installs); exits 1 naming each page missing, extra or
out of order, and prints the list as it should be."""
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def nav_pages() -> list:
    """(title, page) of every page of the nav, in order, sections flattened."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    out = []

    def walk(items, section=""):
        for item in items:
            if isinstance(item, str):
                out.append((item, item, section))
                continue
            for title, value in item.items():
                if isinstance(value, list):
                    walk(value, title)
                else:
                    out.append((title, value, section))

    walk(config["nav"])
    return out


def section_links(path: pathlib.Path, prefix: str) -> list:
    """The pages linked from the section "## The book" of `path`, in order of first mention,
    as paths under docs/."""
    text = path.read_text(encoding="utf-8")
    start = text.find("\n## The book\n")
    if start < 0:
        sys.exit(f"{path.name}: no section '## The book'")
    body = text[start + 1:]
    end = body.find("\n## ", 1)
    body = body if end < 0 else body[:end]
    pages = []
    for link in LINK.findall(body):
        if re.match(r"^(https?:|mailto:)", link):
            continue
        # the README links the changelog at the root; the book has it as docs/changelog.md
        target = prefix + "changelog.md" if prefix and link == "CHANGELOG.md" else link
        if not target.startswith(prefix) or not target.endswith(".md"):
            continue
        page = target[len(prefix):]
        if page not in pages:
            pages.append(page)
    return pages


def expected_list(nav, prefix: str) -> str:
    lines, section = [], None
    for title, page, sec in nav:
        if page == "index.md":
            continue
        if sec != section:
            section = sec
            lines.append(f"- {sec}:" if sec else "-")
        lines[-1] += f" [{title}]({prefix}{page}),"
    return "\n".join(line.rstrip(",") for line in lines)


def main() -> int:
    nav = nav_pages()
    want = [page for _, page, _ in nav if page != "index.md"]
    failed = False
    for name, prefix in (("docs/index.md", ""), ("README.md", "docs/")):
        got = section_links(ROOT / name, prefix)
        missing = [p for p in want if p not in got]
        extra = [p for p in got if p not in want and p != "index.md"]
        common = [p for p in got if p in want]
        order_ok = common == [p for p in want if p in common]
        if missing or extra or not order_ok:
            failed = True
            for p in missing:
                print(f"{name}: '## The book' does not list {p}, which the nav has", file=sys.stderr)
            for p in extra:
                print(f"{name}: '## The book' lists {p}, which the nav does not have", file=sys.stderr)
            if not order_ok:
                print(f"{name}: '## The book' lists its pages in another order than the nav", file=sys.stderr)
            print(f"the nav's pages, in order, as {name} would link them:\n{expected_list(nav, prefix)}",
                  file=sys.stderr)
        else:
            print(f"{name}: the book's contents list names the nav's {len(want)} pages, in its order")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
