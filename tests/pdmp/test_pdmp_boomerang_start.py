"""FedBoomerang's start (issue 48): by default every chain starts at its own draw from the
reference N(mu, Sigma); ``start="init"`` keeps the user's ``init``. The flow and the
reflections keep an orbit's whitened radius, so a start far from mu leaves the chains on wide
orbits (grouseticks from 0: a coefficient 8 units off; the slow statistical test of the
defaults on the real federations is in test_pdmp_run_length.py)."""

import jax
import numpy as np
import pytest

import fedmcmc as fm
from toy_problems import D, pdmp_gaussian_problem

FAR = np.full(D, 30.0, np.float32)  # many posterior sd from the mode


def _built(**options):
    model, fed, _, _ = pdmp_gaussian_problem(4)
    with jax.enable_x64(True):
        return fm.FedBoomerang(sample_interval=0.5, **options).build(model, fed, FAR, chains=64,
                                                                    seed=3)


@pytest.mark.slow  # two builds: about 10 s on 2 loaded cores
def test_chains_start_at_draws_from_the_reference_and_init_is_kept_on_request():
    built = _built()
    assert built.info["start"] == "reference"
    ref = built.config.reference
    starts = np.asarray(built.initial_states.x)
    z = np.linalg.solve(np.asarray(ref.chol), (starts - np.asarray(ref.mean)).T).T
    # whitened: standard normal draws, one per chain (a start at init would be ~100 sd away)
    assert np.all(np.abs(z.mean(axis=0)) < 4 / np.sqrt(64)), z.mean(axis=0)
    assert np.all(np.abs(z.std(axis=0) - 1) < 0.3), z.std(axis=0)
    assert len(np.unique(starts[:, 0])) == 64
    kept = _built(start="init")
    assert kept.info["start"] == "init"
    np.testing.assert_array_equal(np.asarray(kept.initial_states.x), np.broadcast_to(FAR, (64, D)))


def test_bad_start_names_the_argument():
    with pytest.raises(ValueError, match="start"):
        fm.FedBoomerang(sample_interval=0.5, start="mode")
