"""`fedmcmc run --resume` for the PDMP and decentralised families (issue 5).

A run interrupted in the middle of each algorithm in turn and continued with
``resume=True`` (from the checkpoint files on disk) must reproduce the
uninterrupted run: the draws exactly, the per-draw stats and every ``info``
figure that does not measure wall time.
The Langevin family's resume is tested in ``test_cli.py``.
"""

import json

import numpy as np
import pytest
import yaml

from fedmcmc import runner
from fedmcmc.checkpoint import load_checkpoint


@pytest.fixture(scope="module", autouse=True)
def _cache(private_cache):
    # compiled programs go to a temporary cache, not the user's; the runs below compile the
    # same programs again and again, so switch on the cache `fedmcmc run` uses
    import jax

    from fedmcmc import cli

    jax.config.update("jax_compilation_cache_dir", None)
    cli._enable_compilation_cache()
    yield


CONFIG = {
    "name": "resume-test",
    "model": {"name": "gaussian_mean", "params": {"dim": 2, "prior_cov": 100.0}},
    "data": {"generate": {"num_examples": 120, "seed": 3}},
    "partition": {"method": "iid", "num_clients": 4, "seed": 0},
    "algorithms": [
        # split prior + redistribution + refreshment: the prior shares and both server
        # clocks are part of the state that has to survive the checkpoint
        {"name": "FedZigZag", "label": "zigzag",
         "params": {"sample_interval": 0.05, "refresh_rate": 0.5, "prior": "split",
                    "redistribution_rate": 2.0}},
        # minibatches and a decaying step size: keys and the schedule position
        {"name": "GTDULA", "label": "gtdula",
         "params": {"step_size": 2e-4, "beta": 0.3, "gamma": 0.3, "batch_size": 10,
                    "decay_every": 150, "decay_factor": 0.5}},
        {"name": "DULA", "label": "dula", "params": {"step_size": 2e-4, "beta": 0.3}},
    ],
    "num_samples": 160,
    "burn_in": 40,
    "thin": 2,
    "chains": 2,
    "seed": 5,
    "reference": {"method": "none"},
    "checkpoint": {"every_chunks": 1, "chunk_size": 20},
    "report": {"curve_points": 5, "max_points": 300},
}

#: info entries that measure this process's wall time or describe the interruption
VOLATILE = {"wall_time", "seconds_per_iteration", "ess_per_second", "interrupted", "resumed_at_draw", "start_draw",
            "agent_samples", "agent_samples_first_draw",
            # DULA/GT-DULA: measured from the draws of the resumed call only (as agent_samples)
            "bias_estimate"}


def _write_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def _flat(result):
    from fedmcmc.report import flat_draws

    return flat_draws(result)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    return runner.run_experiment(_write_config(tmp), tmp / "out", quiet=True)


def _interrupt_once(label, draws_done):
    """Checkpoint hook: Ctrl-C right after ``label``'s checkpoint at ``draws_done`` (once)."""

    def hook(checkpointer):
        if not hook.fired and checkpointer.meta["label"] == label and checkpointer.draws_done == draws_done:
            hook.fired = True
            raise KeyboardInterrupt

    hook.fired = False
    return hook


def test_interrupted_pdmp_and_decentralised_runs_resume_exactly(uninterrupted, tmp_path, monkeypatch):
    assert all(uninterrupted.status[label] == "complete" for label in ("zigzag", "gtdula", "dula"))
    config_path = _write_config(tmp_path)
    out = tmp_path / "out"
    # Ctrl-C in the middle of each algorithm in turn (draw 100 of 200, 60, 140), then --resume.
    for step, (label, at) in enumerate([("zigzag", 100), ("gtdula", 60), ("dula", 140)]):
        monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", _interrupt_once(label, at))
        outcome = runner.run_experiment(config_path, out, quiet=True, resume=step > 0)
        assert outcome.interrupted and outcome.status[label] == "interrupted"
        assert _flat(outcome.results[label]).shape[1] == at - CONFIG["burn_in"]
        saved = load_checkpoint(out / "checkpoints" / f"{label}.npz")
        assert saved["draws_done"] == at
        if label == "zigzag":  # PDMP states are float64 (process time, position, integrals)
            assert sum(leaf.dtype == np.float64 for leaf in saved["states"]) >= 10
    monkeypatch.setattr(runner, "_AFTER_CHECKPOINT", None)
    outcome = runner.run_experiment(config_path, out, quiet=True, resume=True)
    assert not outcome.interrupted

    info = json.loads((out / "info.json").read_text())["algorithms"]
    info_full = json.loads((uninterrupted.out_dir / "info.json").read_text())["algorithms"]
    for label in ("zigzag", "gtdula", "dula"):
        assert outcome.status[label] == "complete"
        resumed, full = outcome.results[label], uninterrupted.results[label]
        np.testing.assert_array_equal(_flat(resumed), _flat(full))
        assert sorted(resumed.sample_stats) == sorted(full.sample_stats)
        for name in full.sample_stats:
            np.testing.assert_array_equal(np.asarray(resumed.sample_stats[name]),
                                          np.asarray(full.sample_stats[name]), err_msg=name)
        got, want = info[label]["info"], info_full[label]["info"]
        assert got["resumed_at_draw"] > 0 and got["draws_kept"] == CONFIG["num_samples"]
        for key in sorted(set(want) | set(got)):
            if key not in VOLATILE:
                assert got.get(key) == want.get(key), (label, key)

    zigzag = info["zigzag"]["info"]
    # the figures accumulated over the whole run, not only over the resumed part
    for key in ("events_per_worker", "effective_switching_rate", "trajectory_mean",
                "trajectory_var", "ess_batch_means", "mean_rate_federated", "redistributions",
                "skeleton_times", "rounds", "floats_communicated"):
        assert key in zigzag, key
    assert zigzag["redistributions"] > 0 and zigzag["refreshments"] > 0
    assert info["gtdula"]["info"]["iterations"] == 200 * CONFIG["thin"]

