"""`fedmcmc run` and the convergence check (issue 44): the warning is printed and goes to
the report, whose tables show R-hat, bulk and tail ESS; run lengths "auto" in a config."""

import json

import pytest
import yaml

from fedmcmc import cli
from fedmcmc.config import parse_config


@pytest.fixture(scope="module", autouse=True)
def _cache(private_cache):
    yield


def config(**changes):
    out = {
        "name": "convergence-test",
        "model": {"name": "gaussian_mean", "params": {"dim": 2, "prior_cov": 100.0}},
        "data": {"generate": {"num_examples": 120, "seed": 3}},
        "partition": {"method": "iid", "num_clients": 3, "seed": 0},
        "algorithms": [{"name": "FSGLD", "params": {"step_size": 1e-5, "batch_size": 10,
                                                    "local_steps": 5, "surrogate": "exact"}}],
        "num_samples": 60,
        "burn_in": 0,
        "thin": 1,
        "chains": 2,
        "seed": 1,
        "reference": {"method": "none"},
    }
    out.update(changes)
    return out


def run(tmp_path, raw):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code = cli.main(["run", str(path), "--out", str(out), "--quiet"])
    return code, out


def test_a_run_that_has_not_converged_is_reported(tmp_path, capsys):
    code, out = run(tmp_path, config())
    assert code == 0
    err = capsys.readouterr().err
    assert "ConvergenceWarning" in err and "thin" in err
    report = (out / "report.md").read_text()
    assert "tail ESS" in report and "R-hat" in report and "converged" in report
    assert "ConvergenceWarning" in report  # in the notes
    info = json.loads((out / "info.json").read_text())
    figures = info["algorithms"]["FSGLD"]["info"]["diagnostics"]
    assert figures["converged"] is False
    assert len(figures["r_hat"]) == len(figures["ess_bulk"]) == len(figures["ess_tail"]) == 2


def test_run_lengths_auto_in_a_config(tmp_path):
    parsed = parse_config(config(thin="auto", burn_in="auto", max_iterations=50_000))
    assert parsed.thin == "auto" and parsed.burn_in == "auto" and parsed.max_iterations == 50_000
    with pytest.raises(Exception, match="thin"):
        parse_config(config(thin="often"))
    raw = config(thin="auto", burn_in="auto", num_samples=200, algorithms=[
        {"name": "FSGLD", "params": {"step_size": "auto", "batch_size": 10, "local_steps": 5,
                                     "surrogate": "exact"}}])
    code, out = run(tmp_path, raw)
    assert code == 0
    info = json.loads((out / "info.json").read_text())["algorithms"]["FSGLD"]["info"]
    assert info["thin_auto"] is True and info["thin"] >= 1 and info["burn_in"] >= 1
    assert "Run length used: thin" in (out / "report.md").read_text()
