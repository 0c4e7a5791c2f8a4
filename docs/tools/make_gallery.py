"""Write docs/reference/gallery.md from a folder of reproduction runs.

    for name in $(fedmcmc reproduce --list | cut -f1); do
        fedmcmc reproduce $name --out runs/$name
    done
    python docs/tools/make_gallery.py runs
    python docs/tools/make_gallery.py --update runs   # only the reproductions in runs/, the rest kept

For every registered reproduction whose run is in the folder, the page shows its figures
(copied into docs/reference/gallery/, reduced to a 256-colour palette), the paper's result and
the verdict exactly as the run's own README.md states them, its command and wall time. Nothing
is written by hand: rerun the two commands to refresh the page.
"""

from __future__ import annotations

import datetime
import platform
import re
import sys
from pathlib import Path

from PIL import Image

from fedmcmc import reproduce

DOCS = Path(__file__).resolve().parents[1]
PAGE = DOCS / "reference" / "gallery.md"
IMAGES = DOCS / "reference" / "gallery"


def section(readme: str, title: str) -> str:
    """The text of a README's ``## title`` section (up to the next ``##``)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, flags=re.S | re.M)
    return match.group(1).strip() if match else ""


def copy_figure(source: Path, name: str) -> str:
    IMAGES.mkdir(parents=True, exist_ok=True)
    target = IMAGES / f"{name}-{source.name}"
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=256).save(target, optimize=True)
    return f"gallery/{target.name}"


def block(name, title, run_line, figures, paper, verdict, differences, when=None):
    lines = [f"## `{name}`: {title}", "", run_line + (f" Run on {when}." if when else ""), ""]
    lines += [f"![{name}]({figure})" for figure in figures] + [""]
    lines += ["**The paper.** " + paper, "", "**Verdict.** " + verdict, ""]
    if differences:
        lines += ["**Where our setting differs.** " + differences, ""]
    return lines


def update(entries) -> None:
    """Replace the sections of ``entries`` in the existing page; keep every other section."""
    text = PAGE.read_text()
    today = datetime.date.today().isoformat()
    for entry in entries:
        name = entry[0]
        new = "\n".join(block(*entry, when=today))
        pattern = rf"^## `{re.escape(name)}`: .*?(?=^## `|\Z)"
        if re.search(pattern, text, flags=re.S | re.M):
            text = re.sub(pattern, lambda _: new + "\n", text, count=1, flags=re.S | re.M)
        else:
            text = text.rstrip("\n") + "\n\n" + new + "\n"
    PAGE.write_text(text)
    print(f"updated {PAGE}: {', '.join(e[0] for e in entries)}")


def main(runs: Path, only_update: bool = False) -> None:
    entries, missing = [], []
    for entry in reproduce.available():
        folder = runs / entry.name
        readme_path = folder / "README.md"
        if not readme_path.is_file():
            missing.append(entry.name)
            continue
        readme = readme_path.read_text()
        title = readme.splitlines()[0].lstrip("# ").strip()
        run_line = readme.splitlines()[2].strip()
        figures = [copy_figure(png, entry.name) for png in sorted(folder.glob("*.png"))]
        entries.append((entry.name, title, run_line, figures, section(readme, "The paper's result"),
                        section(readme, "Did the paper's claim hold?"),
                        section(readme, "Where our setting differs")))
    if only_update:
        update(entries)
        return
    today = datetime.date.today().isoformat()
    lines = [
        "# Reproductions gallery",
        "",
        f"Every reproduction at its default size, run on {today} on the development machine "
        f"({platform.machine()}, 2 CPU cores, Python {platform.python_version()}) with "
        "`fedmcmc reproduce NAME --out DIR`. Figures, the paper's result, the verdict and the "
        "differences are each run's own `DIR/README.md`, copied by `docs/tools/make_gallery.py` "
        "(nothing here is written by hand). [](reproductions.md) explains the reproductions and "
        "why some claims did not hold.",
        "",
    ]
    if missing:
        lines += [f"Not run for this page: {', '.join(missing)}.", ""]
    for entry in entries:
        lines += block(*entry)
    PAGE.write_text("\n".join(lines))
    print(f"wrote {PAGE} ({len(entries)} reproductions)")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    only_update = arguments[:1] == ["--update"]
    arguments = arguments[1:] if only_update else arguments
    if len(arguments) != 1:
        raise SystemExit("usage: python docs/tools/make_gallery.py [--update] RUNS_DIR")
    main(Path(arguments[0]), only_update)
