"""control_variates="auto" (issue 48): Remark 4.3's shift is on where the federated Newton
finds a mode with a positive definite Hessian, off with the reason where it does not or
where the shift is not allowed (privacy). The default's law is checked against NUTS in
tests/pdmp/test_pdmp_logistic.py (whose runs use the default)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.pdmp import models


def _built(model, federation, algorithm, init):
    with jax.enable_x64(True):
        return algorithm.build(model, federation, init)


@pytest.fixture(scope="module")
def unequal_logistic():
    clients, _ = models.logistic_data(3, 300, 3, num_workers=1)
    rows = clients[0]
    cuts = [0, 150, 230, 280, 300]  # four clients of unequal size
    return fm.Federation([{key: rows[key][a:b] for key in rows}
                          for a, b in zip(cuts[:-1], cuts[1:])])


@pytest.mark.parametrize("make", [fm.FedZigZag,
                                  pytest.param(fm.FedBPS, marks=pytest.mark.slow),
                                  pytest.param(fm.FedBoomerang, marks=pytest.mark.slow)])
def test_auto_turns_control_variates_on_for_a_log_concave_model(unequal_logistic, make):
    info = _built(models.logistic_model(), unequal_logistic, make(0.1),
                  np.zeros(3, np.float32)).info
    assert info["control_variates"] is True
    assert info["control_variates_reason"].startswith("auto: on")
    # centred at the posterior mode: the federated Newton's point, where grad U = 0
    mode = np.asarray(info["control_variate_point"])
    model, rows = models.logistic_model(), unequal_logistic.pooled()
    grad = jax.grad(lambda w: model.log_prior(w) + jnp.sum(
        jax.vmap(model.log_likelihood, (None, 0))(w, rows)))
    with jax.enable_x64(True):
        assert np.max(np.abs(np.asarray(grad(jnp.asarray(mode))))) < 1e-6


def _flat_direction_model():
    """Logistic regression on theta[0] + theta[1] only, with a flat prior: the potential is
    constant along (1, -1), so its Hessian is singular everywhere (no mode to centre at)."""

    def log_likelihood(theta, row):
        z = row["x"] * (theta[0] + theta[1])
        return row["y"] * z - jax.nn.softplus(z)

    return fm.Model(lambda theta: jnp.zeros(()), log_likelihood,
                    hessian_bound=lambda row: jnp.full((2, 2), row["x"] ** 2 / 4.0))


def test_auto_leaves_control_variates_off_without_a_positive_definite_mode():
    rng = np.random.default_rng(0)
    clients = [{"x": rng.normal(size=n), "y": (rng.random(n) < 0.5).astype(np.float64)}
               for n in (40, 25, 10)]
    federation = fm.Federation(clients)
    info = _built(_flat_direction_model(), federation, fm.FedZigZag(0.1),
                  np.zeros(2, np.float32)).info
    assert info["control_variates"] is False
    assert info["control_variates_reason"].startswith("auto: off")
    assert "positive definite" in info["control_variates_reason"] or \
        "did not converge" in info["control_variates_reason"]
    assert "control_variate_point" not in info
    # given explicitly, they are on (the shift is valid at any point; it only may not help)
    given = _built(_flat_direction_model(), federation, fm.FedZigZag(0.1, control_variates=True),
                   np.zeros(2, np.float32)).info
    assert given["control_variates"] is True


def test_auto_leaves_control_variates_off_with_privacy(unequal_logistic):
    algorithm = fm.FedZigZag(0.1, privacy=(5.0, 0.1), sensitivity=2.0)
    info = _built(models.logistic_model(), unequal_logistic, algorithm,
                  np.zeros(3, np.float32)).info
    assert info["control_variates"] is False
    assert "privacy" in info["control_variates_reason"]


def test_control_variates_false_and_bad_values():
    assert fm.FedBPS(0.1, control_variates=False).control_variates is False
    assert fm.FedBoomerang(0.1).control_variates == "auto"  # the default
    with pytest.raises(ValueError, match="control_variates"):
        fm.FedZigZag(0.1, control_variates="yes")
