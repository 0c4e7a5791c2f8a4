"""``fedmcmc bench`` (issue 17): the problems, the verdicts and the leaderboard files."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from fedmcmc import bench
from fedmcmc.bench import metrics
from fedmcmc.cli import main


def test_list_names_every_problem_name_first(capsys):
    assert main(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == bench.problem_names()
    assert {"gaussian-drift", "exam-schools", "contraception", "grouseticks"} <= set(
        bench.problem_names())
    assert all("``" not in line for line in lines)


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch):
    """``fedmcmc bench --list | head``: the reader closes the pipe; the command ends with
    status 1 and no traceback (a stdout whose writes raise BrokenPipeError stands for it)."""

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["bench", "--list"]) == 1


def test_bench_needs_an_output_directory_and_known_names(capsys, tmp_path):
    assert main(["bench"]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path), "--problems", "no-such-problem"]) == 1
    assert "no-such-problem" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path), "--problems", "gaussian-drift",
                 "--algorithms", "NUTS-everywhere"]) == 1
    assert "NUTS-everywhere" in capsys.readouterr().err


def test_names_are_comma_or_space_separated(monkeypatch, tmp_path):
    """``--algorithms A B`` (as docs/reference/benchmark.md writes it) and ``--algorithms A,B``
    name the same runs; so do the forms of ``--problems``."""
    calls = []

    def record(out, **kwargs):
        calls.append((kwargs["problems"], kwargs["algorithms"]))
        return out / "README.md"

    monkeypatch.setattr(bench, "run", record)
    out = str(tmp_path)
    assert main(["bench", "--out", out, "--quiet", "--algorithms", "FSGLD", "GTDULA"]) == 0
    assert main(["bench", "--out", out, "--quiet", "--algorithms", "FSGLD,GTDULA"]) == 0
    assert main(["bench", "--out", out, "--quiet", "--problems", "exam-schools,",
                 "grouseticks", "--algorithms", "FSGLD, GTDULA"]) == 0
    assert main(["bench", "--out", out, "--quiet"]) == 0
    assert calls == [(None, ["FSGLD", "GTDULA"]), (None, ["FSGLD", "GTDULA"]),
                     (["exam-schools", "grouseticks"], ["FSGLD", "GTDULA"]), (None, None)]


class _Reference:
    def __init__(self, draws):
        self.draws = draws
        self.mean = draws.mean(0)
        self.sd = draws.std(0)


def test_verdict_says_plainly_when_an_algorithm_loses():
    """Draws from the reference itself are 'ok'; the same draws shifted by half a posterior
    sd (a biased sampler), or with their spread halved (an overconfident one), LOSE, and
    the verdict names the coordinate and the figure; a handful of draws is 'too few'."""
    rng = np.random.default_rng(0)
    reference = _Reference(rng.normal(size=(8000, 3)) * [1.0, 2.0, 0.5] + [0.0, 1.0, -1.0])
    coordinates = ["a", "b", "c"]
    good = rng.normal(size=(4, 500, 3)) * [1.0, 2.0, 0.5] + [0.0, 1.0, -1.0]
    figures = metrics.accuracy(good, reference, coordinates)
    assert metrics.verdict(figures, reference_ess=8000) == "ok"
    shifted = good + np.array([0.0, 1.0, 0.0])  # b off by 0.5 sd
    verdict = metrics.verdict(metrics.accuracy(shifted, reference, coordinates), 8000)
    assert verdict.startswith("LOSES: mean of b off by +0.5")
    narrow = (good - good.mean((0, 1))) * 0.5 + good.mean((0, 1))
    verdict = metrics.verdict(metrics.accuracy(narrow, reference, coordinates), 8000)
    assert verdict.startswith("LOSES: sd of") and "x the reference" in verdict
    assert 0.4 < float(verdict.split("x the reference")[0].split()[-1]) < 0.6
    few = good[:, :3]
    assert "too few effective draws" in metrics.verdict(
        metrics.accuracy(few, reference, coordinates), 8000)


def test_a_small_run_writes_the_leaderboard(tmp_path):
    """One problem with an exact reference, two algorithms of different families, a small
    budget: the files the contract names, one row per algorithm, a verdict each."""
    out = tmp_path / "bench"
    readme = bench.run(out, problems=["gaussian-drift"], algorithms=["SGLD", "FALD"],
                       budget=bench.Budget(chains=2, num_samples=150, burn_in=30), quiet=True)
    assert readme == out / "README.md" and readme.exists()
    with open(out / "leaderboard.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["algorithm"] for r in rows] == ["SGLD", "FALD"]
    for column in ("problem", "algorithm", "max_abs_z", "sd_ratio_min", "sd_ratio_max",
                   "verdict"):
        assert column in rows[0]
    for row in rows:
        assert row["problem"] == "gaussian-drift"
        assert row["verdict"] == "ok" or row["verdict"].startswith(("LOSES", "FAILED"))
        if not row["verdict"].startswith("FAILED"):
            assert float(row["max_abs_z"]) >= 0 and float(row["sd_ratio_min"]) > 0
    text = readme.read_text()
    assert "gaussian-drift" in text and "SGLD" in text and "FALD" in text
    results = json.loads((out / "results.json").read_text())
    assert results  # the same rows and the problems' reference figures


@pytest.mark.slow
def test_quick_leaderboard_has_every_algorithm_on_three_problems(tmp_path):
    """The issue's done-means: `fedmcmc bench --quick --out DIR`, every algorithm (at least
    11) on at least 3 problems."""
    out = tmp_path / "quick"
    command = "import sys; from fedmcmc.cli import main; sys.exit(main(sys.argv[1:]))"
    completed = subprocess.run([sys.executable, "-c", command, "bench", "--quick", "--quiet",
                                "--out", str(out)], capture_output=True, text=True,
                               timeout=3600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    with open(out / "leaderboard.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    problems = {r["problem"] for r in rows}
    algorithms = {r["algorithm"] for r in rows}
    assert len(problems) >= 3 and len(algorithms) >= 11
    assert len(rows) == len(problems) * len(algorithms)


def test_a_run_over_the_time_budget_loses_on_time(tmp_path):
    """A run still going when the budget's seconds are spent stops at the end of its chunk
    and the leaderboard says it lost on time (the rule that keeps --quick bounded when a
    sampler is very slow on a problem, e.g. Fed Boomerang under client drift)."""
    out = tmp_path / "bench"
    bench.run(out, problems=["gaussian-drift"], algorithms=["SGLD"],
              budget=bench.Budget(chains=2, num_samples=400, burn_in=40, seconds=0.0),
              quiet=True)
    with open(out / "leaderboard.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["verdict"].startswith("LOSES: over the time budget (0 s;")
    assert "loses here" in (out / "README.md").read_text()


def test_a_run_stuck_inside_one_chunk_is_stopped_with_its_worker(tmp_path):
    """A row whose chunk of draws runs on past the budget cannot be stopped at a chunk's
    end: its worker process is ended ``grace_seconds`` after the budget, the row says it lost
    on time, and the next row runs in a fresh worker, two at a time (jobs=2), in the tasks'
    order. (Here the budget is 0 s and the grace 0.5 s: the first chunk, which compiles the
    run, is still going. One draw of Fed Boomerang under client drift used to take minutes,
    before the workers' searches stopped at the earliest proposal.)"""
    out = tmp_path / "bench"
    bench.run(out, problems=["gaussian-drift"], algorithms=["FedBoomerang", "SGLD"],
              budget=bench.Budget(chains=2, num_samples=50, burn_in=5, seconds=0.0,
                                  grace_seconds=0.5),
              quiet=True, jobs=2)
    with open(out / "leaderboard.csv", newline="") as handle:
        boomerang, sgld = list(csv.DictReader(handle))
    assert boomerang["algorithm"] == "FedBoomerang" and sgld["algorithm"] == "SGLD"
    assert boomerang["verdict"].startswith("LOSES: over the time budget (0 s; stopped after")
    assert boomerang["settings"]  # what it ran with, sent before the run began
    assert sgld["verdict"].startswith("LOSES: over the time budget (0 s;")  # at a chunk's end
    assert json.loads((out / "results.json").read_text())["meta"]["jobs"] == 2
    assert "2 runs went at a time" in (out / "README.md").read_text()


def test_jobs_must_be_a_positive_integer(tmp_path):
    for jobs in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="jobs"):
            bench.run(tmp_path, problems=["gaussian-drift"], algorithms=["FALD"], jobs=jobs)


def test_budget_seconds_must_be_non_negative_numbers():
    for name, value in (("seconds", -1.0), ("grace_seconds", -0.5), ("grace_seconds", "10"),
                        ("seconds", True)):
        with pytest.raises(ValueError, match=name):
            bench.Budget(chains=2, num_samples=10, burn_in=2, **{name: value})
    assert bench.Budget(chains=2, num_samples=10, burn_in=2, grace_seconds=0).grace_seconds == 0
