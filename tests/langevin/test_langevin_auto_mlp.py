"""``step_size="auto"`` on a Bayesian neural network (issues 44 and 45).

On a ReLU MLP the posterior is not log-concave: a client's likelihood curves upward in some
directions, the Laplace fits' summed curvature can be zero or negative there, and the
relaxation time ``2 / (h lambda_min)`` that ``thin="auto"`` and the budget of an "auto" h
read was infinite (the budget then kept an h that cannot move the chain) and FSGLD's noise
measurement drew Laplace points at infinity ("non-finite" moments). The Laplace fit of the
posterior (``surrogates.laplace_of_product``) now floors every curvature at the prior's, and
the budget (``run_length.budget_step_size``) raises h until the run makes one relaxation
time within ``max_iterations``.

Checked here on a small MLP federation (10 non-IID clients x 200 rows, a 4-8-2 MLP): for
SGLD, DSGLD and FSGLD "auto", the chosen h makes at least one relaxation time within the
iterations the run makes, the budget says so (``RunLengthWarning``), and the chains move
(finite draws with a positive sd in every coordinate); a chain frozen by a tiny given h is
flagged by ``ConvergenceWarning``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import run_length, surrogates
from fedmcmc.langevin import step_size
from fedmcmc.models import synthetic

NUM_CLIENTS = 10
ROWS = 200
MAX_ITERATIONS = 4000
NUM_SAMPLES = 100
CHAINS = 2


def _mlp_federation():
    proportions = np.random.default_rng(1).beta(0.5, 0.5, size=NUM_CLIENTS)
    federation = synthetic.teacher_classification_clients(proportions, ROWS, seed=101)
    # the first 4 of the stand-in's 18 features: a 4-8-2 MLP (d = 58, full Laplace fits)
    federation = fm.Federation([{"x": c["x"][:, :4], "y": c["y"]} for c in federation.clients])
    model = fm.models.mlp_classifier(4, 2, hidden=(8,))
    return model, federation, model.attributes["init"](jax.random.key(0))


def test_laplace_of_product_floors_the_curvature_at_the_prior():
    """Surrogates that curve the wrong way (negative precision) give the prior's curvature,
    never zero (diagonal and full); log-concave surrogates are unchanged."""
    model = fm.Model(log_prior=lambda theta: -0.5 * jnp.sum(theta ** 2) / 4.0,  # prior sd 2
                     log_likelihood=lambda theta, x: 0.0)
    flat = model.flatten(jnp.zeros(3))
    theta0 = jnp.zeros(3)
    shift = jnp.ones((2, 3))
    diagonal = surrogates.GaussianSurrogates(precision=jnp.array([[-3.0, 1.0, 2.0]] * 2),
                                             shift=shift)
    mode, precision = surrogates.laplace_of_product(flat, diagonal, theta0)
    np.testing.assert_allclose(precision, [0.25, 2.25, 4.25], rtol=1e-6)
    assert np.all(np.isfinite(mode))
    full = surrogates.GaussianSurrogates(
        precision=jnp.stack([jnp.diag(jnp.array([-3.0, 1.0, 2.0]))] * 2), shift=shift)
    _, precision = surrogates.laplace_of_product(flat, full, theta0)
    np.testing.assert_allclose(np.linalg.eigvalsh(np.asarray(precision)), [0.25, 2.25, 4.25],
                               rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SGLD", "DSGLD", "FSGLD"])
def test_auto_on_an_mlp_moves_within_the_budget(name):
    model, federation, init = _mlp_federation()
    algorithm = {"SGLD": lambda h: fm.SGLD(step_size=h, batch_size=20),
                 "DSGLD": lambda h: fm.DSGLD(step_size=h, batch_size=20, local_steps=10),
                 "FSGLD": lambda h: fm.FSGLD(step_size=h, batch_size=20, local_steps=10)}[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fm.sample(model, federation, algorithm("auto"), init, num_samples=NUM_SAMPLES,
                           burn_in="auto", thin="auto", chains=CHAINS, seed=0,
                           max_iterations=MAX_ITERATIONS)
    info = result.info
    iterations = (info["burn_in"] + NUM_SAMPLES) * info["thin"]
    assert np.isfinite(info["relaxation_time"]), info["relaxation_time"]
    # the exact h cannot cross this posterior in the run: the budget raised it, and said so
    assert info["step_size_budget_reason"] is not None
    assert info["step_size"] > info["step_size_exact"]
    assert any(issubclass(w.category, run_length.RunLengthWarning) for w in caught)
    # at least one relaxation time within the iterations the run makes
    assert info["relaxation_time"] <= iterations, (info["relaxation_time"], iterations)
    draws = result.flat_samples()
    assert np.all(np.isfinite(draws))
    spread = draws.reshape(-1, draws.shape[-1]).std(axis=0)
    assert np.all(spread > 0), np.sum(spread == 0)

    # the broken variant: a step that cannot move the chain is flagged
    with pytest.warns(fm.ConvergenceWarning):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", run_length.RunLengthWarning)
            fm.sample(model, federation, algorithm(1e-12), init, num_samples=NUM_SAMPLES,
                      burn_in=0, thin=1, chains=CHAINS, seed=0)


def test_expansions_curving_upward_are_floored_keeping_their_gradient():
    """FSGLD's re-expansion at the global mode: a client's expansion that curves upward gets
    zero curvature there, with the same gradient at the expansion point (diagonal and full);
    one that curves downward is kept as it is."""
    center = jnp.array([2.0, 3.0])
    for precision in (jnp.array([[-1.0, 2.0]]), jnp.array([[[-1.0, 0.0], [0.0, 2.0]]])):
        given = surrogates.GaussianSurrogates(precision=precision, shift=jnp.array([[1.0, 1.0]]))
        floored, curved_up = surrogates._curving_down(given, center)
        assert bool(curved_up)
        matrix = lambda p: np.diag(np.asarray(p)[0]) if p.ndim == 2 else np.asarray(p)[0]
        gradient = lambda s: np.asarray(s.shift)[0] - matrix(s.precision) @ np.asarray(center)
        np.testing.assert_allclose(gradient(floored), gradient(given), rtol=1e-6)
        assert np.linalg.eigvalsh(matrix(floored.precision)).min() >= 0
    concave = surrogates.GaussianSurrogates(precision=jnp.array([[1.0, 2.0]]),
                                            shift=jnp.array([[1.0, 1.0]]))
    kept, curved_up = surrogates._curving_down(concave, center)
    assert not bool(curved_up)
    np.testing.assert_array_equal(kept.shift, concave.shift)


#: FSGLD Table 1's shape (``fedmcmc reproduce fsgld-table1``): 30 label-imbalanced clients
#: (Beta(0.5, 0.5) proportions) of the SUSY stand-in, the 18-18-8 MLP (d = 854, diagonal
#: surrogates), batch 50, 40 local steps; 300 rows per client to keep the set-up short
TABLE1_CLIENTS, TABLE1_ROWS, TABLE1_MAX_ITERATIONS = 30, 300, 20_000


def _table1_run(fsgld_kwargs=None):
    proportions = np.random.default_rng(1).beta(0.5, 0.5, size=TABLE1_CLIENTS)
    federation = synthetic.teacher_classification_clients(proportions, TABLE1_ROWS, seed=101)
    model = fm.models.mlp_classifier(18, 2)
    init = model.attributes["init"](jax.random.key(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", run_length.RunLengthWarning)
        warnings.simplefilter("ignore", fm.ConvergenceWarning)  # 50 draws of an MLP
        warnings.simplefilter("ignore", surrogates.SurrogatePredictionWarning)
        return fm.sample(model, federation,
                         fm.FSGLD(step_size="auto", batch_size=50, local_steps=40, diagonal=True),
                         init, num_samples=50, burn_in="auto", thin="auto", chains=2, seed=0,
                         max_iterations=TABLE1_MAX_ITERATIONS, progress=False)


@pytest.mark.slow
def test_fsgld_auto_on_the_table1_mlp_runs_and_moves(monkeypatch):
    """FSGLD "auto" on the Table 1 MLP federation: no divergence, finite draws that move in
    every coordinate, a relaxation time within the run, and a conducive weight in [0, 1] per
    client in ``info``. Broken variant: the set-up before the fix, with the distributed
    Newton rounds of the re-expansion unchecked for diagonal expansions (a ReLU network's
    diagonal curvature is never negative, so the upward-curvature check never fired) and
    every conducive weight 1: the Newton steps run away and a chain diverges (measured at
    30 x 2,000 rows: the set-up's noise was not finite; here at 300 rows a chain diverged at
    iteration 4,730). Either rule alone ran here (measured: the check with all weights 1;
    the weights, all 0 at the runaway centre, without the check)."""
    result = _table1_run()
    info = result.info
    iterations = (info["burn_in"] + 50) * info["thin"]
    assert info["relaxation_time"] <= iterations, (info["relaxation_time"], iterations)
    weights = np.asarray(info["conducive_weights"])
    assert weights.shape == (TABLE1_CLIENTS,) and np.all((weights >= 0) & (weights <= 1))
    draws = result.flat_samples()
    assert np.all(np.isfinite(draws))
    assert np.all(draws.reshape(-1, draws.shape[-1]).std(axis=0) > 0)

    monkeypatch.setattr(surrogates, "_within_reach", lambda step, precision: True)
    monkeypatch.setattr(step_size, "conducive_weights",
                        lambda prediction: (np.ones(len(prediction)), np.ones(len(prediction))))
    with pytest.raises((fm.SamplingDivergedError, ValueError)):
        _table1_run()
