"""`fedmcmc run` / `fedmcmc reproduce`: outputs, config errors, Ctrl-C, checkpoint and resume."""

import json
import subprocess

import numpy as np
import pytest
import yaml

import fedmcmc as fm
from fedmcmc import cli, runner
from fedmcmc.config import ConfigError, build_experiment, parse_config
from fedmcmc.report import _fmt


@pytest.fixture(scope="module", autouse=True)
def _cache(private_cache):
    # references and compiled programs go to a temporary cache, not the user's
    yield


def small_config(**changes):
    config = {
        "name": "cli-test",
        "model": {"name": "gaussian_mean", "params": {"dim": 2, "prior_cov": 100.0}},
        "data": {"generate": {"num_examples": 120, "seed": 3}},
        "partition": {"method": "iid", "num_clients": 3, "seed": 0},
        "algorithms": [
            {"name": "FSGLD", "params": {"step_size": 2e-3, "batch_size": 10, "local_steps": 5,
                                         "surrogate": "exact"}},
            {"name": "DSGLD", "label": "dsgld-5", "params": {"step_size": 2e-3, "batch_size": 10,
                                                             "local_steps": 5}},
        ],
        "num_samples": 160,
        "burn_in": 40,
        "thin": 2,
        "chains": 2,
        "seed": 1,
        "reference": {"num_samples": 1000},
        "checkpoint": {"every_chunks": 1, "chunk_size": 20},
        "report": {"curve_points": 5, "max_points": 300},
    }
    config.update(changes)
    return config


def write(tmp_path, config, name="config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def nc_draws(path):
    import arviz as az

    data = az.from_netcdf(str(path))
    arrays = [np.asarray(data.posterior[n]) for n in data.posterior.data_vars]
    return np.concatenate(
        [a.reshape(*a.shape[:2], int(np.prod(a.shape[2:], dtype=int))) for a in arrays], axis=-1
    )


# ------------------------------------------------------------------------- a full run


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    config_path = write(tmp, small_config())
    out = tmp / "out"
    code = cli.main(["run", str(config_path), "--out", str(out), "--quiet"])
    return code, out, config_path


def test_run_writes_draws_info_report_and_plots(finished_run):
    code, out, _ = finished_run
    assert code == 0
    for name in ("config.resolved.json", "info.json", "summary.json", "report.md", "report.html",
                 "draws/FSGLD.nc", "draws/dsgld-5.nc", "plots/traces.png", "plots/marginals.png",
                 "plots/convergence.png"):
        assert (out / name).is_file(), name
    draws = nc_draws(out / "draws" / "FSGLD.nc")
    assert draws.shape == (2, 160, 2)
    info = json.loads((out / "info.json").read_text())
    assert info["algorithms"]["FSGLD"]["status"] == "complete"
    assert info["algorithms"]["dsgld-5"]["info"]["rounds"] > 0
    assert info["reference"]["method"] == "exact"
    resolved = json.loads((out / "config.resolved.json").read_text())
    assert resolved["resolved"]["num_clients"] == 3 and resolved["thin"] == 2
    html = (out / "report.html").read_text()
    assert "<table>" in html and "plots/convergence.png" in html


def test_report_numbers_match_the_draws(finished_run):
    _, out, config_path = finished_run
    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    experiment = build_experiment(fm.config.load_config(config_path))
    config = experiment.config
    reference = fm.reference_posterior(
        experiment.model, experiment.federation, experiment.init, num_samples=1000,
        num_warmup=config.reference.num_warmup, chains=config.reference.chains,
    )
    assert reference.from_cache  # the run computed and cached the same reference
    for label in ("FSGLD", "dsgld-5"):
        draws = nc_draws(out / "draws" / f"{label}.nc")
        pooled = draws.reshape(-1, draws.shape[-1])
        entry = summary[label]
        np.testing.assert_allclose(entry["mean"], pooled.mean(axis=0), rtol=1e-5)
        w1 = fm.diagnostics.wasserstein_marginal(pooled, reference.draws).mean()
        assert entry["distances"]["w1_marginal_mean"] == pytest.approx(w1, rel=1e-6)
        ess = fm.diagnostics.ess(draws).min()
        assert entry["min_ess"] == pytest.approx(ess, rel=1e-6)
        row = next(line for line in report.splitlines() if line.startswith(f"| {label} |"))
        assert f"| {_fmt(w1)} |" in row
        assert f"| {_fmt(entry['rounds'])} |" in row


def test_pngs_render(finished_run):
    import matplotlib.image

    _, out, _ = finished_run
    for name in ("traces", "marginals", "convergence"):
        path = out / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert image[..., :3].std() > 0.05  # not blank


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_samples": None}, "num_samples"),
        ({"chains": 0}, "chains"),
        ({"num_sample": 10}, "num_sample: unknown field"),
        ({"thin": "two"}, "thin"),
        ({"algorithms": []}, "algorithms"),
        ({"reference": {"method": "magic"}}, "reference.method"),
        ({"engine": "mpi"}, "engine: Value error, engine must be one of local, ray"),
        ({"partition": {"method": "iid", "num_clients": 3, "colour": 1}}, "partition.colour"),
    ],
)
def test_schema_errors_name_the_field(tmp_path, capsys, change, field):
    config = small_config()
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    code = cli.main(["run", str(write(tmp_path, config)), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert field in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"algorithms": [{"name": "FSGLDX", "params": {}}]}, ["algorithms.0.name", "FSGLDX", "DSGLD"]),
        ({"algorithms": [{"name": "SGLD", "params": {"step_size": -1.0, "batch_size": 5}}]},
         ["algorithms.0.params", "step_size"]),
        ({"algorithms": [{"name": "SGLD", "params": {"step_size": 1e-3}}]},
         ["algorithms.0.params", "batch_size"]),
        ({"model": {"name": "no_such_model"}}, ["model.name", "unknown model", "gaussian_mean"]),
        ({"model": {"name": "no_such_package.mod:fn"}}, ["model.name", "no_such_package"]),
        ({"partition": {"method": "no_such_split", "num_clients": 3}}, ["partition.method"]),
        ({"data": {"path": "missing.npz"}}, ["data.path", "not found", "missing.npz"]),
    ],
)
def test_resolution_errors_are_clear(tmp_path, capsys, change, needles):
    config = small_config(**change)
    code = cli.main(["run", str(write(tmp_path, config)), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    for needle in needles:
        assert needle in err
    assert "Traceback" not in err


def test_missing_config_file(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 1
    assert "config file not found" in capsys.readouterr().err


def test_data_file_and_import_path(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((90, 3))
    np.savez(tmp_path / "rows.npz", x=x, y=x @ np.array([1.0, 0.0, -1.0]))
    module = tmp_path / "my_models.py"
    module.write_text(
        "import jax.numpy as jnp, fedmcmc as fm\n"
        "def regression(dim=3):\n"
        "    model = fm.Model(lambda b: -0.5 * jnp.sum(b ** 2),\n"
        "                     lambda b, e: -0.5 * (e['y'] - e['x'] @ b) ** 2)\n"
        "    return model, None, jnp.zeros(dim)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # a user's own module, as on their path
    config = parse_config(small_config(model={"name": "my_models:regression"},
                                       data={"path": "rows.npz"}), base_dir=tmp_path)
    experiment = build_experiment(config)
    assert experiment.federation.total_size == 90 and experiment.federation.num_clients == 3
    assert experiment.model_source == "import:my_models:regression"


def test_an_algorithm_named_by_import_path_runs(tmp_path, capsys, monkeypatch):
    """algorithms[].name "package.module:Class": a user's Algorithm subclass, labelled by its
    class name, runs under `fedmcmc run`; a wrong path is one message naming the field."""
    (tmp_path / "my_algorithms.py").write_text(
        "import fedmcmc as fm\n"
        "class MyDSGLD(fm.DSGLD):\n"
        "    pass\n"
        "NotAnAlgorithm = dict\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # a user's own module, as on their path
    params = {"step_size": 2e-3, "batch_size": 10, "local_steps": 5}
    config = small_config(algorithms=[{"name": "my_algorithms:MyDSGLD", "params": params}],
                          num_samples=20, burn_in=0, reference={"method": "none"},
                          checkpoint={"every_chunks": 1, "chunk_size": 10})
    experiment = build_experiment(parse_config(config, base_dir=tmp_path))
    [(label, _, algorithm)] = experiment.algorithms
    assert label == "MyDSGLD" and type(algorithm).__name__ == "MyDSGLD"
    out = tmp_path / "out"
    assert cli.main(["run", str(write(tmp_path, config)), "--out", str(out), "--quiet"]) == 0
    assert (out / "draws" / "MyDSGLD.nc").is_file()
    for name, needle in (("my_algorithms:NotAnAlgorithm", "no fedmcmc.algorithm.Algorithm"),
                         ("no_such_module:X", "cannot import 'no_such_module'")):
        bad = small_config(algorithms=[{"name": name, "params": params}])
        code = cli.main(["run", str(write(tmp_path, bad)), "--out", str(tmp_path / "o"),
                         "--quiet"])
        err = capsys.readouterr().err
        assert code == 1 and "algorithms.0.name" in err and needle in err, err
        assert "Traceback" not in err


def test_help_lists_commands():
    completed = subprocess.run(["fedmcmc", "--help"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0
    assert "run" in completed.stdout and "reproduce" in completed.stdout


# ---------------------------------------------------------------- Ctrl-C and resume


def _interrupt_at(write_number, exception):
    def hook(checkpointer):
        hook.count += 1
        if hook.count == write_number:
            raise exception

    hook.count = 0
    return hook


def test_ctrl_c_keeps_draws_and_resume_reproduces_the_uninterrupted_run(finished_run, tmp_path,
                                                                         monkeypatch, capsys):
    _, reference_out, config_path = finished_run
    out = tmp_path / "out"
    # FSGLD writes 11 checkpoints (one per chunk of 20 of its 200 draws, and a final one),
    # then Ctrl-C hits the DSGLD run after its 3rd chunk (draw 60).
    monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", _interrupt_at(14, KeyboardInterrupt()))
    code = cli.main(["run", str(config_path), "--out", str(out), "--quiet"])
    assert code == 130
    assert "--resume" in capsys.readouterr().err
    partial = nc_draws(out / "draws" / "dsgld-5.nc")
    assert partial.shape[1] == 3 * 20 - 40  # 3 chunks of 20 draws, minus the burn-in
    info = json.loads((out / "info.json").read_text())
    assert info["interrupted"] and info["algorithms"]["dsgld-5"]["status"] == "interrupted"
    assert "interrupted" in (out / "report.md").read_text()

    monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", None)
    code = cli.main(["run", str(config_path), "--out", str(out), "--quiet", "--resume"])
    assert code == 0
    for label in ("FSGLD", "dsgld-5"):
        np.testing.assert_array_equal(nc_draws(out / "draws" / f"{label}.nc"),
                                      nc_draws(reference_out / "draws" / f"{label}.nc"))
    info = json.loads((out / "info.json").read_text())
    uninterrupted = json.loads((reference_out / "info.json").read_text())
    dsgld = info["algorithms"]["dsgld-5"]["info"]
    assert dsgld["resumed_at_draw"] == 60
    assert dsgld["draws_kept"] == 160
    assert dsgld["rounds"] == uninterrupted["algorithms"]["dsgld-5"]["info"]["rounds"]


def test_crash_then_resume_from_disk(finished_run, tmp_path, monkeypatch):
    _, reference_out, config_path = finished_run
    out = tmp_path / "out"
    monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", _interrupt_at(3, RuntimeError("power cut")))
    with pytest.raises(RuntimeError, match="power cut"):
        runner.run_experiment(config_path, out, quiet=True)
    monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", None)
    runner.run_experiment(config_path, out, quiet=True, resume=True)
    for label in ("FSGLD", "dsgld-5"):
        np.testing.assert_array_equal(nc_draws(out / "draws" / f"{label}.nc"),
                                      nc_draws(reference_out / "draws" / f"{label}.nc"))
    # a changed config is not resumed from the old checkpoints
    changed = small_config(seed=2)
    with pytest.raises(ConfigError, match="config changed"):
        runner.run_experiment(write(tmp_path, changed, "changed.yaml"), out, quiet=True, resume=True)


# ------------------------------------------------------------------------ reproduce


def test_reproduce_list_and_run(tmp_path, capsys, monkeypatch):
    from fedmcmc import reproduce

    monkeypatch.setattr(reproduce, "_REGISTRY", {})
    monkeypatch.setattr(reproduce, "_DISCOVERED", True)
    assert cli.main(["reproduce", "--list"]) == 0
    assert "no reproductions are registered" in capsys.readouterr().err

    @reproduce.register("toy-check", "a toy reproduction for the test")
    def toy(out_dir, quick):
        (out_dir / "README.md").write_text(f"quick={quick}\n")

    assert cli.main(["reproduce", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == ["toy-check\ta toy reproduction for the test"]
    assert cli.main(["reproduce", "toy-check", "--out", str(tmp_path / "r"), "--quick"]) == 0
    assert (tmp_path / "r" / "README.md").read_text() == "quick=True\n"
    assert cli.main(["reproduce", "nope", "--out", str(tmp_path / "r")]) == 1
    assert "unknown reproduction 'nope'" in capsys.readouterr().err


def test_trajectory_plot_from_a_pdmp_skeleton(tmp_path):
    import matplotlib.image

    from fedmcmc.report import plot_trajectories

    t = np.linspace(0.0, 5.0, 60)
    positions = np.stack([np.cos(t), np.sin(t)], axis=1)
    result = fm.Result(
        samples=np.zeros((2, 10, 2)), algorithm="FedZigZag",
        info={"skeleton_times": [t.tolist()] * 2, "skeleton_positions": [positions.tolist()] * 2},
    )
    path = plot_trajectories({"zz": result}, ["x[0]", "x[1]"], tmp_path / "trajectory.png")
    assert path is not None and matplotlib.image.imread(path)[..., :3].std() > 0.05
    plain = fm.Result(samples=np.zeros((2, 10, 2)), info={}, algorithm="SGLD")
    assert plot_trajectories({"sgld": plain}, ["x[0]", "x[1]"], tmp_path / "none.png") is None


def test_csv_columns_zoo_model_and_labelled_partition(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 2))
    y = (x[:, 0] > 0).astype(float)
    lines = ["a,b,label"] + [f"{p},{q},{l}" for (p, q), l in zip(x, y)]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    config = parse_config(
        small_config(
            model={"name": "logistic_regression", "params": {"dim": 2}},
            data={"path": "rows.csv", "columns": {"x": ["a", "b"], "y": "label"}},
            partition={"method": "dirichlet", "num_clients": 4, "options": {"labels": "y", "alpha": 5.0}},
            init=[0.5, -0.5],
        ),
        base_dir=tmp_path,
    )
    experiment = build_experiment(config)
    assert experiment.federation.num_clients == 4 and experiment.federation.total_size == 200
    np.testing.assert_allclose(experiment.federation.pooled()["x"][:, 0].sum(), x[:, 0].sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(experiment.init), [0.5, -0.5])
    bad = parse_config(small_config(data={"path": "rows.csv", "columns": {"x": ["a", "zz"]}}),
                       base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"data.columns.x: column 'zz'"):
        build_experiment(bad)


@pytest.mark.slow
def test_real_sigint_then_resume(tmp_path):
    """A real SIGINT to a `fedmcmc run` process: status 130, draws kept, --resume reproduces."""
    import os
    import signal
    import time

    config = small_config(
        algorithms=[small_config()["algorithms"][1]], num_samples=6000, burn_in=200,
        checkpoint={"every_chunks": 1, "chunk_size": 100},
    )
    path = write(tmp_path, config)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    runner.run_experiment(path, tmp_path / "full", quiet=True)
    out = tmp_path / "interrupted"
    process = subprocess.Popen(["fedmcmc", "run", str(path), "--out", str(out), "--quiet"],
                               env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "dsgld-5.npz").exists() and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    partial = nc_draws(out / "draws" / "dsgld-5.nc")
    assert 0 <= partial.shape[1] < 6000
    completed = subprocess.run(["fedmcmc", "run", str(path), "--out", str(out), "--quiet", "--resume"],
                               env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr
    np.testing.assert_array_equal(nc_draws(out / "draws" / "dsgld-5.nc"),
                                  nc_draws(tmp_path / "full" / "draws" / "dsgld-5.nc"))
