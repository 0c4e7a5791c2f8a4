"""The SUSY stand-in of FSGLD Table 1 (fm.models.teacher_classification_data/_clients)."""

import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.models import synthetic


def _log_likelihood(p, y):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(np.mean(np.where(y == 1, np.log(p), np.log(1 - p))))


def test_shape_dtype_balance_and_determinism():
    data = fm.models.teacher_classification_data(20_000, seed=3)
    assert data["x"].shape == (20_000, 18) and data["x"].dtype == np.float32
    assert data["y"].shape == (20_000,) and data["y"].dtype == np.int32
    assert set(np.unique(data["y"]).tolist()) == {0, 1}
    # balanced: P(y = 1) = 1/2 by construction; sd of the mean of 20,000 Bernoulli(1/2) is 0.0035
    assert abs(data["y"].mean() - 0.5) < 0.015
    again = fm.models.teacher_classification_data(20_000, seed=3)
    np.testing.assert_array_equal(data["x"], again["x"])
    np.testing.assert_array_equal(data["y"], again["y"])
    other = fm.models.teacher_classification_data(20_000, seed=4)
    assert not np.array_equal(data["x"], other["x"])


def test_linear_model_clearly_worse_than_teacher():
    """The boundary is one the 18-18-8 MLP can learn (the teacher) but a linear model cannot:
    the best logistic regression (Newton's method on 20,000 rows) loses at least 0.1 nats per
    row on fresh rows against the teacher's own probabilities."""
    train = fm.models.teacher_classification_data(20_000, seed=0)
    test = fm.models.teacher_classification_data(20_000, seed=1)
    x = np.hstack([train["x"], np.ones((20_000, 1), np.float32)]).astype(np.float64)
    y = train["y"].astype(np.float64)
    beta = np.zeros(x.shape[1])
    for _ in range(12):  # Newton's method for logistic regression
        p = 1 / (1 + np.exp(-x @ beta))
        beta += np.linalg.solve(x.T @ (x * (p * (1 - p))[:, None]) + 1e-6 * np.eye(x.shape[1]),
                                x.T @ (y - p))
    xt = np.hstack([test["x"], np.ones((20_000, 1), np.float32)]).astype(np.float64)
    linear = _log_likelihood(1 / (1 + np.exp(-xt @ beta)), test["y"])
    rule = synthetic.teacher()
    best = _log_likelihood(rule.probability(test["x"]), test["y"])
    assert best > linear + 0.1, (best, linear)
    assert np.mean((rule.probability(test["x"]) > 0.5) == test["y"]) > 0.75
    assert np.mean(((xt @ beta) > 0) == test["y"]) < 0.70


def test_clients_exact_proportions_and_independent_generation():
    proportions = [0.0, 0.02, 0.5, 0.97, 1.0]
    federation = fm.models.teacher_classification_clients(proportions, 2_000, seed=7)
    assert federation.num_clients == 5
    np.testing.assert_allclose(federation.weights, 0.2)
    for client, p in zip(federation.clients, proportions):
        assert client["x"].shape == (2_000, 18) and client["x"].dtype == np.float32
        assert int(client["y"].sum()) == round(p * 2_000)
    # a client's rows depend on (seed, its index) only, not on the other clients
    alone = fm.models.teacher_classification_clients(proportions[:3], 2_000, seed=7)
    np.testing.assert_array_equal(alone.clients[2]["x"], federation.clients[2]["x"])


@pytest.mark.parametrize("kwargs, argument", [
    (dict(num_examples=0), "num_examples"),
    (dict(num_examples=10, positive_fraction=1.5), "positive_fraction"),
    (dict(num_examples=10, linear_share=2.0), "linear_share"),
    (dict(num_examples=10, sharpness=-1.0), "sharpness"),
    (dict(num_examples=10, teacher_seed=1.5), "teacher_seed"),
])
def test_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        fm.models.teacher_classification_data(**kwargs)
    with pytest.raises(ValueError, match="proportions"):
        fm.models.teacher_classification_clients([0.5, 1.2], 10)
