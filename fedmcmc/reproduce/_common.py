"""Helpers shared by the reproductions: timing, JSON/CSV output, plots, README.

Not a reproduction itself (the leading underscore keeps the registry from
importing it as one).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

__all__ = ["Clock", "write_json", "write_csv", "figure", "save", "write_readme", "jsonable"]


class Clock:
    """Wall time since construction, in seconds."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # jax arrays
        return jsonable(np.asarray(value))
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def write_json(out_dir: Path, name: str, payload: Dict[str, Any]) -> Path:
    path = Path(out_dir) / name
    path.write_text(json.dumps(jsonable(payload), indent=1))
    return path


def write_csv(out_dir: Path, name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    path = Path(out_dir) / name
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(header))
        for row in rows:
            writer.writerow([jsonable(v) for v in row])
    return path


def figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 4.0):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def save(fig, out_dir: Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    path = Path(out_dir) / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_readme(
    out_dir: Path,
    *,
    name: str,
    title: str,
    quick: bool,
    seconds: float,
    paper: str,
    ours: str,
    differences: str,
    verdict: str,
    files: Optional[List[str]] = None,
    table: Optional[str] = None,
) -> Path:
    """DIR/README.md: the paper's stated result beside ours, the differences, the verdict."""
    size = "quick (`--quick`)" if quick else "default"
    lines = [
        f"# {title}",
        "",
        f"`fedmcmc reproduce {name} --out DIR{' --quick' if quick else ''}` -- size: {size}, "
        f"wall time {seconds:.0f} s.",
        "",
        "## The paper's result",
        "",
        paper.strip(),
        "",
        "## Our result",
        "",
        ours.strip(),
        "",
    ]
    if table:
        lines += [table.strip(), ""]
    lines += [
        "## Where our setting differs",
        "",
        differences.strip(),
        "",
        "## Did the paper's claim hold?",
        "",
        verdict.strip(),
        "",
    ]
    if quick:
        lines += [
            "(This was the `--quick` size, meant to check that the pipeline runs; "
            "its numbers are noisy and the verdict above is computed from them. "
            "Run without `--quick` for the reported result.)",
            "",
        ]
    if files:
        lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    path = Path(out_dir) / "README.md"
    path.write_text("\n".join(lines))
    return path
