"""Write docs/reference/benchmark.md from ``fedmcmc bench`` output folders.

    fedmcmc bench --out bench-default
    fedmcmc bench --quick --out bench-quick
    python docs/tools/make_benchmark_page.py bench-default bench-quick

The page is each run's own README.md (its tables and verdicts) under a fixed introduction,
the default size first, with each run's accuracy-against-cost figure copied beside the page.
"""
import re, shutil, sys, pathlib

doc = pathlib.Path(__file__).resolve().parents[1] / "reference" / "benchmark.md"


def section(out_dir: pathlib.Path, size: str) -> str:
    readme = (out_dir / "README.md").read_text()
    lines = readme.splitlines()
    assert lines[0].startswith("# ")
    body = []
    for line in lines[1:]:
        if line.startswith("#"):
            line = "#" + line  # one level down: under the page's "## The ... size"
        body.append(line)
    body = "\n".join(body).strip()
    # the run's own folder name is a temporary path: say what the command was
    body = body.replace(f"--out {out_dir}", f"--out bench-{size}")
    body = re.sub(r"!\[[^\]]*\]\(accuracy_vs_cost\.png\)", "(The figure above.)", body)
    shutil.copy(out_dir / "accuracy_vs_cost.png", doc.parent / f"benchmark_{size}.png")
    date = re.search(r" on (\d{4}-\d{2}-\d{2})", body)
    title = f"## The {size} size" + (f", measured on {date.group(1)}" if date else "")
    return (f"{title}\n\n![Accuracy against cost, {size} size](benchmark_{size}.png)\n\n{body}\n")


head = """# Benchmark: every algorithm on the same problems

`fedmcmc bench` runs every algorithm of the library (the three families and the field's
baselines, [](../baselines.md)) on the same federated problems with the same budget, seed and
starting point, scores each against the problem's reference posterior (exact where the
posterior is Gaussian, BlackJAX NUTS on the pooled rows otherwise) and writes a leaderboard:

```{code-block} console
fedmcmc bench --list                              # the problems and the algorithms
fedmcmc bench --quick --out bench-quick           # 3 problems, 2 chains x 80 draws, 2 runs at a time
fedmcmc bench --out bench-default                 # 4 problems, 4 chains x 500 draws, 1 run at a time
fedmcmc bench --out DIR --problems exam-schools --algorithms FSGLD GTDULA
```

It writes `leaderboard.csv` (one row per problem and algorithm), `results.json` (everything,
with the settings each algorithm used) and `README.md` (the tables below, the verdicts in
words). A verdict is **ok** when the run has at least 20 effective draws, every coordinate's
mean is within 0.15 posterior sd of the reference's plus 4 Monte Carlo standard errors (from
the run's and the reference's effective sample sizes), and every sd is within 15% of the
reference's plus the same allowance (`fedmcmc/bench/metrics.py`); otherwise it says why the
algorithm **LOSES** (too few effective draws for the budget, a mean off by so many sds, an sd
too small or too large, over the wall-time budget) or that it **FAILED** (an error, with its
message). Hyper-parameters come from one rule per algorithm, the same on
every problem, or `"auto"` where the algorithm offers it, so the table measures what a user
gets without hand-tuning.

What follows is the default size, then the quick size, each as run on the development
machine (2 CPU cores; wall times include compilation and set-up, compare orders of
magnitude).

"""
sizes = [(pathlib.Path(sys.argv[1]), "default")]
if len(sys.argv) > 2:
    sizes.append((pathlib.Path(sys.argv[2]), "quick"))
doc.write_text(head + "\n".join(section(folder, size) for folder, size in sizes))
print(doc, len(doc.read_text().splitlines()), "lines")
