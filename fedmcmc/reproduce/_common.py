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

__all__ = ["Clock", "write_json", "write_csv", "figure", "save", "write_readme", "jsonable",
           "load_data", "data_record", "data_section"]


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
    data: Optional[str] = None,
) -> Path:
    """DIR/README.md: the paper's stated result beside ours, the differences, the verdict.
    ``data`` (see :func:`data_section`) becomes a "Data used" section after the run line."""
    size = "quick (`--quick`)" if quick else "default"
    lines = [
        f"# {title}",
        "",
        f"`fedmcmc reproduce {name} --out DIR{' --quick' if quick else ''}` -- size: {size}, "
        f"wall time {seconds:.0f} s.",
        "",
    ]
    if data:
        lines += ["## Data used", "", data.strip(), ""]
    lines += [
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


def load_data(name: str, **kwargs):
    """``fm.datasets.load_or_fallback``: the full data set when its package is installed,
    otherwise the stand-in shipped with ``.[all]`` (with a printed DataFallbackWarning and
    ``info["fallback_for"]``). Returns ``(dataset, is_fallback)``."""
    import warnings

    from fedmcmc import datasets

    with warnings.catch_warnings():  # printed on every substitution, not once per process
        warnings.simplefilter("always", datasets.DataFallbackWarning)
        data = datasets.load_or_fallback(name, **kwargs)
    return data, "fallback_for" in data.info


def data_record(*parts) -> Dict[str, Any]:
    """The ``"data"`` entry of a reproduction's results JSON: which data set ran (name,
    package, rows, features per part) and, for a fallback, what it replaced and why."""
    first = parts[0]
    record: Dict[str, Any] = {
        "name": first.info["name"],
        "package": first.info.get("package"),
        "rows": [int(p.x.shape[0]) for p in parts] if len(parts) > 1 else int(first.x.shape[0]),
        "features": int(np.prod(first.x.shape[1:])),
        "fallback": "fallback_for" in first.info,
    }
    if first.y.dtype.kind in "iu":
        record["classes"] = int(np.unique(np.concatenate([np.asarray(p.y) for p in parts])).size)
    for key in ("split", "stand_in_for", "fallback_for", "fallback_reason"):
        values = [p.info[key] for p in parts if key in p.info]
        if values:
            record[key] = values if key == "split" and len(values) > 1 else values[0]
    return record


def data_section(record: Dict[str, Any], intended: str, *, consequence: str = "") -> str:
    """README text saying which data set ran and why: ``intended`` describes the full data
    set; for a fallback the missing package's pip line and ``consequence`` (what changed in
    the experiment because of the stand-in) follow."""
    rows = record["rows"]
    rows = " + ".join(f"{r:,}" for r in rows) if isinstance(rows, list) else f"{rows:,}"
    shape = f"{rows} rows x {record['features']:,} features" + (
        f", {record['classes']} classes" if "classes" in record else "")
    if not record.get("fallback"):
        return (f"`{record['name']}` from the `{record['package']}` package ({shape}): {intended}. "
                f"The full data set was used.")
    return (f"**Stand-in data.** `{record['name']}` from `{record['package']}` ({shape}) was used "
            f"instead of `{record['fallback_for']}` ({intended}): {record['fallback_reason']}. "
            + (consequence.strip() + " " if consequence else "")
            + "Install the package (the README's set-up commands do) and rerun for the "
              "full-data result.")
