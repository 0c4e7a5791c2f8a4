"""Consensus Monte Carlo (fm.ConsensusMC) on a case where it is exact.

With Gaussian likelihoods and a Gaussian prior every subposterior
p(x_s | mu) p(mu)^(1/S) is Gaussian and the precision-weighted average of the clients'
draws is distributed as the posterior. The weights W_s are estimated from the draws,
which adds to the error of the combined mean (delta method, per coordinate)

    Var = sum_s (w_s / W)^2 (2 / n) (m_s - m)^2,

w_s the subposterior precision, m_s its mean, n the draws per client (NUTS draws of a
Gaussian are close to independent); the tolerance of the mean adds this to the
ESS-based variance. The variance band is ESS-based (the weights' error enters it only at
second order: the precision weighting minimises the combined variance). The same check
rejects the plain (equal-weight) average of the same draws on clients of unequal sizes.
(The default Stein weights, sym(K_s C_s^-1), are exact on Gaussian subposteriors: the
weight-estimation term is then a conservative allowance, kept for ``"precision"``.)
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.baselines import consensus

from stats import ess_per_coordinate, variance_ratio_bounds

DIM = 2
GAUSSIAN = fm.models.gaussian_mean(DIM)  # x ~ N(mu, I), mu ~ N(0, I)


def federation(seed=0, sizes=(10, 30, 20, 60), spread=0.3):
    rng = np.random.default_rng(seed)
    means = 0.5 + rng.uniform(-spread, spread, size=(len(sizes), DIM))
    clients = [rng.normal(m, 1.0, size=(n, DIM)).astype(np.float32) for m, n in zip(means, sizes)]
    return fm.Federation(clients)


def consensus_check(draws, federation, z=4.0):
    """Mean and variance of the combined draws against the exact posterior, with the
    weight-estimation term in the mean's tolerance (module docstring)."""
    draws = np.asarray(draws, np.float64)
    mean, cov = GAUSSIAN.attributes["exact_posterior"](federation)
    var = np.diag(cov)
    num_clients = federation.num_clients
    precisions = np.array([len(c) + 1.0 / num_clients for c in federation.clients])
    sub_means = np.stack([c.astype(np.float64).sum(0) / p
                          for c, p in zip(federation.clients, precisions)])
    share = precisions / precisions.sum()
    n = draws.shape[0] * draws.shape[1]
    extra = np.sum((share**2)[:, None] * (2.0 / n) * (sub_means - mean) ** 2, axis=0)
    ess = ess_per_coordinate(draws)
    flat = draws.reshape(-1, DIM)
    z_mean = (flat.mean(0) - mean) / np.sqrt(var / ess + extra)
    low, high = variance_ratio_bounds(ess, z)
    ratio = flat.var(0) / var
    ok_mean = bool(np.all(np.abs(z_mean) < z))
    ok_var = bool(np.all((ratio > low) & (ratio < high)))
    return {"ok": ok_mean and ok_var, "ok_mean": ok_mean, "ok_var": ok_var, "z_mean": z_mean,
            "var_ratio": ratio, "ess": ess}


def test_gaussian_consensus_is_exact_and_equal_weights_are_rejected():
    fed = federation()
    result = fm.sample(GAUSSIAN, fed, fm.ConsensusMC(), init=jnp.zeros(DIM), num_samples=1000,
                       burn_in=300, chains=4, seed=0, progress=False)
    figures = consensus_check(result.flat_samples(), fed)
    assert figures["ok"], figures
    info = result.info
    # one round: each of the 4 chains' start down to each of the 4 clients, its draws up
    assert info["rounds"] == 1 and info["messages"] == 2 * 4 * 4
    assert info["warmup_steps"] == 300
    # init down; draws, Stein weight and the weights of 8 halvings' halves up
    assert info["floats_communicated"] == 4 * DIM + 4 * 4 * 1000 * DIM + 4 * 17 * DIM**2
    assert sum(info["divergent_transitions_per_client"]) == 0
    assert info["weighting"] == "stein" and info["stein_fallback_clients"] == []
    client_draws = info["client_samples"]
    assert client_draws.shape == (4, 1000, 4, DIM)
    # the plain average of the same draws: wrong on clients of unequal sizes
    equal, _ = consensus.combine(client_draws, "equal")
    assert not consensus_check(equal, fed)["ok"]
    # result.samples are the combination of info["client_samples"] with the clients' weights
    weights = info["client_weights"]
    again, _ = consensus.combine(client_draws, "stein", weights)
    np.testing.assert_allclose(again, result.flat_samples(), rtol=1e-4, atol=1e-5)
    # which are the exact subposterior precisions (n_s + 1/S) I: Stein's weights of a
    # Gaussian carry no Monte Carlo error (float32 draws and gradients)
    exact = np.array([len(c) + 0.25 for c in fed.clients])
    np.testing.assert_allclose(weights, exact[:, None, None] * np.eye(DIM), rtol=1e-3,
                               atol=1e-3 * exact.max())
    assert info["combination_error_sd"] < 1e-3
    # the inverse sample covariances of the same draws are only close to them
    _, estimated = consensus.combine(client_draws, "precision")
    diagonal = np.diagonal(estimated, axis1=1, axis2=2)
    np.testing.assert_allclose(diagonal, exact[:, None] * np.ones(DIM), rtol=0.15)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(weighting="median"), "weighting"),
        (dict(weighting="Stein"), "weighting"),
        (dict(num_warmup=-1), "num_warmup"),
        (dict(step_size=0.0), "step_size"),
        (dict(target_acceptance=1.0), "target_acceptance"),
        (dict(max_num_doublings=0), "max_num_doublings"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        fm.ConsensusMC(**kwargs)


def gaussian_clients(seed, sizes, dim, draws_shape):
    """Exact draws ``(chains, n, S, d)`` of Gaussian subposteriors (client s: ``sizes[s]``
    rows of a linear regression, so small clients have wide subposteriors and far means),
    their gradients' precisions and means, and the exact posterior's mean and sds."""
    generator = np.random.default_rng(seed)
    truth = generator.normal(size=dim)
    precisions, means = [], []
    for size in sizes:
        rows = generator.normal(size=(size, dim))
        precision = rows.T @ rows + np.eye(dim) / len(sizes)
        precisions.append(precision)
        means.append(truth + np.linalg.solve(precision, rows.T @ generator.normal(size=size)))
    total = sum(precisions)
    mean = np.linalg.solve(total, sum(q @ m for q, m in zip(precisions, means)))
    sd = np.sqrt(np.diag(np.linalg.inv(total)))
    draws = np.stack([generator.multivariate_normal(m, np.linalg.inv(q), size=draws_shape)
                      for m, q in zip(means, precisions)], axis=2)
    return draws, precisions, means, mean, sd


def test_stein_weights_recover_the_exact_mean_where_sample_covariances_do_not():
    """Gaussian subposteriors of very unequal clients (30 of 2 rows, 10 of 10, 5 of 200; 6
    parameters; 400 exact draws each): the combined mean with the clients' Stein weights
    (consensus.client_weights) is within the Monte Carlo floor of the exact posterior mean
    (its error's sd is posterior sd / sqrt(draws) with exact weights: RMS z over 6 repeats
    x 6 coordinates near 1, below 1.5 = 5 sds of that RMS under the null); the same check
    rejects the inverse sample covariances of the same draws (RMS z 2.3-3.1 measured),
    whose relative error ~sqrt(d / n) moves the mean. The Stein run also predicts no
    combination error (its weights are exact here); the other predicts one."""
    sizes, dim, shape = [2] * 30 + [10] * 10 + [200] * 5, 6, (2, 200)
    z = {"stein": [], "precision": []}
    for seed in range(6):
        draws, precisions, means, mean, sd = gaussian_clients(seed, sizes, dim, shape)
        replies = []
        for s in range(len(sizes)):
            own = draws[:, :, s].reshape(-1, dim)
            replies.append(consensus.client_weights(own, -(own - means[s]) @ precisions[s]))
        weights, halves, fallback = consensus.stack_client_weights(replies)
        assert fallback == []
        np.testing.assert_allclose(weights, np.stack(precisions), rtol=1e-8, atol=1e-8)
        for weighting, given in (("stein", weights), ("precision", None)):
            combined, _ = consensus.combine(draws, weighting, given)
            error = combined.reshape(-1, dim).mean(axis=0) - mean
            z[weighting].append(error / (sd / np.sqrt(shape[0] * shape[1])))
        assert np.max(consensus.combination_error(draws, "stein", weights=weights,
                                                  half_weights=halves)) < 1e-6
        assert np.max(consensus.combination_error(draws, "precision")) > 0.03
    rms = {name: float(np.sqrt(np.mean(np.square(values)))) for name, values in z.items()}
    assert rms["stein"] < 1.5, rms
    assert rms["precision"] > 1.5, rms  # the broken variant: the same check rejects it


def test_a_stein_weight_that_is_not_positive_definite_falls_back_and_says_so():
    """Gradients that do not match the draws (here of the wrong sign: K_s = -I) give a
    negative-definite sym(K_s C_s^-1): the client sends the inverse sample covariance and
    flags it, and the run names the client in a CombinationWarning."""
    generator = np.random.default_rng(0)
    draws = generator.normal(size=(300, 3))
    weight, ok = consensus.stein_precision(draws, draws)  # grad log p = +theta: not a density
    assert not ok
    np.testing.assert_allclose(weight, np.linalg.inv(np.cov(draws, rowvar=False)))
    good = consensus.client_weights(draws, -draws)
    bad = consensus.client_weights(draws, draws)
    assert good.stein and not bad.stein
    info = {}
    with pytest.warns(consensus.CombinationWarning, match=r"client\(s\) \[1\]"):
        fm.ConsensusMC().stack_weights([good, bad], info)
    assert info["stein_fallback_clients"] == [1]
    with pytest.raises(ValueError, match="weights"):
        consensus.combine(np.zeros((1, 5, 2, 3)), "stein")


def test_too_few_draws_for_precision_weights_and_no_resume():
    fed = federation()
    with pytest.raises(ValueError, match="num_samples"):
        fm.sample(GAUSSIAN, fed, fm.ConsensusMC(), init=jnp.zeros(DIM), num_samples=1,
                  chains=2, progress=False)
    with pytest.raises(ValueError, match="start_draw"):
        fm.sample(GAUSSIAN, fed, fm.ConsensusMC(), init=jnp.zeros(DIM), num_samples=10,
                  chains=2, progress=False, start_draw=3)


def test_warmup_steps_default():
    assert fm.ConsensusMC().warmup_steps(burn_in=0, thin=1) == 200
    assert fm.ConsensusMC().warmup_steps(burn_in=50, thin=2) == 100
    assert fm.ConsensusMC(num_warmup=7).warmup_steps(burn_in=50, thin=2) == 7


def test_the_predicted_combination_error_is_the_weights_error():
    """consensus.combination_error: the error of the combined mean caused by weights
    estimated from draws, predicted by split halves, against its actual size over repeated
    exact Gaussian client draws (40 heterogeneous clients, 600 draws each)."""
    from fedmcmc.baselines import consensus

    generator = np.random.default_rng(1)
    clients, dim = 40, 4
    covariances, means = [], []
    for _ in range(clients):
        factor = generator.normal(size=(dim, dim)) * generator.uniform(0.3, 3.0)
        covariances.append(factor @ factor.T + 0.1 * np.eye(dim))
        means.append(3.0 * generator.normal(size=dim))
    precision = sum(np.linalg.inv(c) for c in covariances)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    errors, predicted = [], []
    for _ in range(12):
        draws = np.stack([generator.multivariate_normal(m, c, size=(4, 150))
                          for m, c in zip(means, covariances)], axis=2)
        sample_means = draws.reshape(-1, clients, dim).mean(axis=0)
        _, weights = consensus.combine(draws)
        estimated = np.linalg.solve(weights.sum(0), np.einsum("sij,sj->i", weights, sample_means))
        exact = np.linalg.solve(precision, sum(np.linalg.solve(c, m) for c, m in
                                               zip(covariances, sample_means)))
        errors.append((estimated - exact) / sd)
        predicted.append(consensus.combination_error(draws))
    actual = np.sqrt(np.mean(np.square(errors), axis=0))
    ratio = np.mean(predicted, axis=0) / actual
    assert np.all((ratio > 0.6) & (ratio < 1.6)), (actual, np.mean(predicted, axis=0))
    # "equal" weights estimate nothing
    assert np.all(consensus.combination_error(draws, "equal") == 0)
