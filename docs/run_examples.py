"""Run every ```python block of the documentation, page by page, so the docs cannot rot.

    python docs/run_examples.py                  # every page under docs/
    python docs/run_examples.py docs/tutorials/langevin.md README.md ...

A page's blocks run in order in one fresh namespace (a later block sees what an earlier one
defined), with the working directory docs/_generated/<page>/: files a block writes (the
tutorials' plots) land there, and the pages show them with the ``generated-figure`` directive.
Only fences whose info string is exactly ``python`` run; a block that cannot run here (a real
cluster's address, say) is written as ```{code-block} python and says why in the text.
The exit status is 1 if any block raised; the report names the page, the block and its line.
"""

from __future__ import annotations

import os
import re
import sys
import time
import traceback
from pathlib import Path

DOCS = Path(__file__).resolve().parent
GENERATED = DOCS / "_generated"
SKIPPED_DIRS = {"_build", "_generated", "_ext", "_static", "_templates"}

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def python_blocks(text: str):
    """The ```python fenced blocks of a Markdown page: a list of (first line number, code)."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group("fence"), match.group("info").strip()
        start = i + 1
        j = start
        while j < len(lines) and not (
            lines[j].strip().startswith(fence[0] * len(fence))
            and set(lines[j].strip()) == {fence[0]}
        ):
            j += 1
        if info == "python":
            blocks.append((start + 1, "\n".join(lines[start:j])))
        i = j + 1
    return blocks


def pages(root: Path = DOCS):
    """Every Markdown page of the documentation, sorted (build and generated folders skipped)."""
    found = []
    for path in sorted(root.rglob("*.md")):
        relative = path.relative_to(root)
        if relative.parts[0] in SKIPPED_DIRS or relative.name == "README.md":
            continue
        found.append(path)
    return found


def output_dir(page: Path) -> Path:
    """docs/_generated/<page path without .md>/: where a page's blocks run and write files
    (a page outside docs/, such as the README, gets docs/_generated/_outside/<name>/)."""
    page = page.resolve()
    if DOCS in page.parents:
        return GENERATED / page.relative_to(DOCS).with_suffix("")
    return GENERATED / "_outside" / page.stem


def run_page(page: Path) -> list:
    """Run one page's blocks in order; return the failures as (page, line, traceback) tuples."""
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    if not blocks:
        return []
    out = output_dir(page)
    out.mkdir(parents=True, exist_ok=True)
    namespace = {"__name__": "__main__", "__file__": str(page)}
    here = os.getcwd()
    failures = []
    os.chdir(out)
    try:
        for line, code in blocks:
            try:
                exec(compile(code, f"{page}:{line}", "exec"), namespace)
            except BaseException:  # report and go on with the next page
                failures.append((page, line, traceback.format_exc()))
                break
    finally:
        os.chdir(here)
        try:
            import matplotlib.pyplot as plt

            plt.close("all")
        except ImportError:
            pass
    return failures


def _shown(page: Path) -> str:
    page = page.resolve()
    return str(page.relative_to(DOCS)) if DOCS in page.parents else str(page)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("MPLBACKEND", "Agg")
    targets = [Path(a).resolve() for a in args] if args else pages()
    failures = []
    for page in targets:
        started = time.perf_counter()
        page_failures = run_page(page)
        failures += page_failures
        count = len(python_blocks(page.read_text(encoding="utf-8")))
        status = "FAILED" if page_failures else "ok"
        print(f"{status:6s} {_shown(page)}: {count} block(s), "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    for page, line, text in failures:
        print(f"\n--- {_shown(page)}, block starting at line {line} ---\n{text}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
