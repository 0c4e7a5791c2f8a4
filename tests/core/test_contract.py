"""The public API exactly as CONTRACT.md writes it, for every algorithm class."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    clients = [
        {"x": rng.normal(c, 1.0, size=(n, 2)).astype(np.float32)}
        for c, n in zip((-1.0, 0.0, 1.5), (30, 40, 50))
    ]
    model = fm.Model(
        log_prior=lambda p: -0.5 * jnp.sum(p["mu"] ** 2),
        log_likelihood=lambda p, example: -0.5 * jnp.sum((example["x"] - p["mu"]) ** 2),
    )
    return model, fm.Federation(clients, weights=None), {"mu": jnp.zeros(2)}


ALGORITHMS = [
    fm.SGLD(step_size=1e-3, batch_size=10),
    fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5),
    fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5),
    fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5, surrogate="exact", alpha=0.5),
    fm.FedZigZag(sample_interval=0.05),
    fm.FedBPS(sample_interval=0.05),
    fm.DULA(step_size=1e-4, beta=0.2),
    fm.GTDULA(step_size=1e-4, beta=0.2, gamma=0.2),
]


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: type(a).__name__)
def test_contract_call(problem, algorithm):
    model, federation, init = problem
    result = fm.sample(
        model, federation, algorithm=algorithm, init=init, num_samples=20, burn_in=5, thin=2,
        chains=2, seed=0, engine="local",
    )
    assert result.samples["mu"].shape == (2, 20, 2)
    assert np.isfinite(np.asarray(result.samples["mu"])).all()
    assert isinstance(result.info, dict)
    idata = result.to_arviz()
    assert idata.posterior["mu"].shape == (2, 20, 2)
    if isinstance(algorithm, (fm.DULA, fm.GTDULA)):
        agents = result.info["agent_samples"]
        agents = agents["mu"] if isinstance(agents, dict) else agents
        assert np.asarray(agents).shape == (2, 20, 3, 2)
