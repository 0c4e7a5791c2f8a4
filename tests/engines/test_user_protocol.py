"""A federated sampler written outside the package: SGHMC (Chen, Fox & Guestrin, 2014), whose
momentum travels with the chain from client to client, in under 30 lines of protocol code.

It imports nothing from a family (``fedmcmc.langevin``, ``pdmp``, ``decentralised``,
``baselines``): the protocol base and the update's inputs come from ``fedmcmc.protocols``, the
minibatch estimator (4) from ``fedmcmc.minibatch``, and ``fm.HandoffAlgorithm`` runs it through
``fm.sample`` on ``engine="local"`` and ``engine="ray"`` with the same draws.

The federation has clients of very unequal size (4 to 61 rows) whose sample means are made
equal, and the batch is the largest client, so every client's estimator (4),
grad log p(theta) + (1/f_s) grad log p(x_s | theta), is the full posterior gradient: the only
errors left are SGHMC's discretisation, O(h). The test compares the draws with the exact
Gaussian posterior (tolerances from the effective sample size) and rejects two broken
variants with the same check: half the friction noise, and a momentum that does not travel
(reset to zero at every visit's start, which drains kinetic energy at each hand-off).
"""

import ast
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.minibatch import client_gradient_estimate
from fedmcmc.protocols import HandoffProtocol

from stats import check_gaussian_moments

# the checks below judge the draws themselves (the Ray run keeps 60 draws only)
pytestmark = pytest.mark.filterwarnings("ignore::fedmcmc.ConvergenceWarning")

DIM = 2
SIZES = (4, 9, 17, 30, 61)
MODEL = fm.Model(
    log_prior=lambda mu: -0.5 * jnp.sum(mu**2),
    log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    name="gaussian_mean",
)


# ------------------------------------------------------------------ the protocol (<= 30 lines)
class SGHMC(HandoffProtocol):
    """SGHMC (Chen et al., 2014, equation (15), unit mass, B_hat = 0) handed between clients:
    theta' = theta + h v;  v' = v + h g(theta') - h C v + N(0, 2 C h), g the estimator (4)."""

    name = "SGHMC"

    def __init__(self, step_size, friction, batch_size, local_steps, noise_factor=2.0,
                 carry_momentum=True):
        self.step_size, self.friction = float(step_size), float(friction)
        self.batch_size, self.local_steps = int(batch_size), int(local_steps)
        self.noise_factor = float(noise_factor)  # 2 is SGHMC; 1 is a broken variant
        self.carry_momentum = bool(carry_momentum)  # False: a broken variant

    def init_carry(self, position):
        return (position, np.zeros_like(position))  # the momentum travels with the position

    def build_update(self, client, parameters):
        h, friction = self.step_size, self.friction
        noise_sd = float(np.sqrt(self.noise_factor * friction * h))

        def update(step, carry):
            position, momentum = carry
            if not self.carry_momentum:
                momentum = jnp.where(step.visit_start, 0.0, momentum)
            position = position + h * momentum
            gradient = client_gradient_estimate(client, position, step.minibatch_key,
                                                self.batch_size, parameters.weight)
            noise = jax.random.normal(step.noise_key, position.shape, position.dtype)
            momentum = momentum + h * gradient - h * friction * momentum + noise_sd * noise
            return (position, momentum)

        return update
# ------------------------------------------------------------------ end of the protocol


def equal_mean_federation(seed=0, common_mean=(0.7, -0.4)):
    rng = np.random.default_rng(seed)
    clients = []
    for size in SIZES:
        rows = rng.normal(0.0, 1.0, size=(size, DIM))
        clients.append((rows - rows.mean(axis=0) + np.asarray(common_mean)).astype(np.float32))
    return fm.Federation(clients)


def posterior(federation):
    precision = federation.total_size + 1.0
    return federation.pooled().sum(axis=0) / precision, precision


# h sqrt(precision) = 0.02; friction = sqrt(precision) (critical damping): the autocorrelation
# time is about 1 / (h C) = 50 updates, two visits
STEP, FRICTION, LOCAL_STEPS, THIN = 0.002, 10.0, 25, 50


def run(num_samples=800, chains=4, seed=2, engine="local", **variant):
    protocol = SGHMC(STEP, FRICTION, batch_size=max(SIZES), local_steps=LOCAL_STEPS, **variant)
    return fm.sample(MODEL, equal_mean_federation(), fm.HandoffAlgorithm(protocol),
                     init=jnp.zeros(DIM), num_samples=num_samples, burn_in=100, thin=THIN,
                     chains=chains, seed=seed, engine=engine, visit_timeout=120.0)


def check(result):
    mean, precision = posterior(equal_mean_federation())
    assert precision == pytest.approx(sum(SIZES) + 1.0)
    # Euler SGHMC's O(h) bias on the variance is about 1% here: a 5% allowance
    return check_gaussian_moments(result.flat_samples(), mean, np.eye(DIM) / precision,
                                  extra_var_rtol=0.05)


@pytest.fixture(scope="module")
def sghmc_local():
    return run()


def test_the_protocol_is_short_and_imports_no_family():
    source = pathlib.Path(__file__).read_text()
    start = source.index("# " + "-" * 66 + " the protocol")
    end = source.index("# " + "-" * 66 + " end of the protocol")
    lines = [line for line in source[start:end].splitlines()[1:]
             if line.strip() and not line.strip().startswith("#")]
    docstring = len(inspect.getdoc(SGHMC).splitlines())
    assert len(lines) - docstring <= 30, len(lines)
    imported = [node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(ast.parse(source))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names]
    families = ("fedmcmc.langevin", "fedmcmc.pdmp", "fedmcmc.decentralised", "fedmcmc.baselines")
    assert not [name for name in imported if name and name.startswith(families)]


def test_sghmc_defined_outside_the_package_samples_the_posterior(sghmc_local):
    figures = check(sghmc_local)
    assert figures["ok"], figures
    info = sghmc_local.info
    assert info["algorithm"] == "SGHMC" and info["engine"] == "local"
    assert info["local_steps"] == LOCAL_STEPS and info["num_clients"] == len(SIZES)
    # every client was visited, in proportion to its size
    visits = np.asarray(info["visits_per_client"], float)
    assert np.all(visits > 0)
    np.testing.assert_allclose(visits / visits.sum(), np.asarray(SIZES) / sum(SIZES), atol=0.03)
    assert set(np.unique(sghmc_local.sample_stats["client"])) == set(range(len(SIZES)))


@pytest.mark.parametrize("variant", [{"noise_factor": 1.0}, {"carry_momentum": False}],
                         ids=["half-friction-noise", "momentum-not-carried"])
def test_the_same_check_rejects_broken_variants(variant):
    figures = check(run(**variant))
    assert not figures["ok"], figures


def test_the_update_is_told_where_visits_start():
    """``step.visit_start`` is true exactly at the first update of every visit, and
    ``step.iteration`` counts the chain's updates across clients."""

    class Marks(HandoffProtocol):
        name, local_steps = "marks", 3

        def init_carry(self, position):
            return (position,)

        def build_update(self, client, parameters):
            def update(step, carry):
                return (jnp.stack([step.iteration.astype(jnp.float32),
                                   step.visit_start.astype(jnp.float32)]),)
            return update

    result = fm.sample(MODEL, equal_mean_federation(), fm.HandoffAlgorithm(Marks()),
                       init=jnp.zeros(DIM), num_samples=12, thin=1, chains=2, seed=0,
                       convergence=False)
    draws = result.flat_samples()
    np.testing.assert_array_equal(draws[..., 0], np.tile(np.arange(12.0), (2, 1)))
    np.testing.assert_array_equal(draws[..., 1], np.tile(np.arange(12) % 3 == 0, (2, 1)))


def test_handoff_algorithm_checks_its_protocol():
    with pytest.raises(ValueError, match="protocol must be"):
        fm.HandoffAlgorithm(object())
    algorithm = fm.HandoffAlgorithm(SGHMC(STEP, FRICTION, 5, 5))
    assert algorithm.name == "SGHMC" and algorithm.message_passing  # local and every engine
    with pytest.raises(ValueError, match="engine"):
        fm.sample(MODEL, equal_mean_federation(), algorithm, init=jnp.zeros(DIM),
                  num_samples=2, engine="spark")


def test_sghmc_on_ray_equals_the_in_process_run(local_ray, sghmc_local):
    """The same protocol on Ray (the test module's classes are pickled by value, as a user's
    script's would be): the same draws as in-process."""
    import sys

    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    on_ray = run(num_samples=60, engine="ray")
    assert on_ray.info["engine"] == "ray" and on_ray.info["algorithm"] == "SGHMC"
    np.testing.assert_array_equal(on_ray.flat_samples(), sghmc_local.flat_samples()[:, :60])
    np.testing.assert_array_equal(on_ray.sample_stats["client"],
                                  sghmc_local.sample_stats["client"][:, :60])


def test_a_config_names_the_protocol_by_import_path(tmp_path, monkeypatch):
    """``algorithms[].name: "package.module:Protocol"`` in a YAML config builds
    ``fm.HandoffAlgorithm(Protocol(**params))``, labelled by the class name."""
    from fedmcmc.config import build_experiment, parse_config

    (tmp_path / "my_samplers.py").write_text(
        "from fedmcmc.protocols import HandoffProtocol\n"
        "class MySampler(HandoffProtocol):\n"
        "    name = 'mine'\n"
        "    def __init__(self, local_steps):\n"
        "        self.local_steps = local_steps\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = {"name": "user-protocol", "model": {"name": "gaussian_mean", "params": {"dim": 2}},
              "data": {"generate": {"num_examples": 30, "seed": 0}},
              "partition": {"method": "iid", "num_clients": 3},
              "algorithms": [{"name": "my_samplers:MySampler", "params": {"local_steps": 4}}],
              "num_samples": 10, "reference": {"method": "none"}}
    [(label, _, algorithm)] = build_experiment(parse_config(config, base_dir=tmp_path)).algorithms
    assert label == "MySampler" and isinstance(algorithm, fm.HandoffAlgorithm)
    assert type(algorithm.protocol).__name__ == "MySampler"
    assert algorithm.protocol.local_steps == 4 and algorithm.name == "mine"


def test_the_public_fed_sghmc_gives_the_same_draws_on_ray(local_ray):
    """fm.FedSGHMC, the library's own SGHMC protocol (its statistical checks are in
    tests/langevin/test_sghmc.py), on both engines with minibatches smaller than most clients."""
    algorithm = fm.FedSGHMC(step_size=STEP, friction=FRICTION, batch_size=10, local_steps=7)
    common = dict(init=jnp.zeros(DIM), num_samples=30, burn_in=10, thin=10, chains=2, seed=5,
                  visit_timeout=120.0)
    local = fm.sample(MODEL, equal_mean_federation(), algorithm, engine="local", **common)
    on_ray = fm.sample(MODEL, equal_mean_federation(), algorithm, engine="ray", **common)
    assert on_ray.info["algorithm"] == "FedSGHMC" and on_ray.info["engine"] == "ray"
    assert np.isfinite(local.flat_samples()).all()
    np.testing.assert_array_equal(on_ray.flat_samples(), local.flat_samples())
    np.testing.assert_array_equal(on_ray.sample_stats["client"], local.sample_stats["client"])
