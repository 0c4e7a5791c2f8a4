"""Programs traced once per model and shapes, not once per client or call (issue 18).

A Ray actor hosting several clients, a sweep, or a test suite fits surrogates and builds
visits again and again with the same model and shapes. These checks are structural, not
timed: the number of traces a jitted program keeps, and whether two clients' visits lower
to the same program text (then the persistent compilation cache compiles it once).
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc import surrogates
from fedmcmc.engines.handoff import HandoffClient
from fedmcmc.langevin import handoff as langevin_handoff
from fedmcmc.langevin.handoff import DSGLDParameters
from fedmcmc.protocols import client_context

MODEL = fm.Model(
    log_prior=lambda p: -0.5 * (jnp.sum(p["w"] ** 2) + p["b"] ** 2),
    log_likelihood=lambda p, ex: ex["y"] * (ex["x"] @ p["w"] + p["b"])
    - jnp.logaddexp(0.0, ex["x"] @ p["w"] + p["b"]),
)
INIT = {"w": jnp.zeros(3), "b": jnp.zeros(())}


def _rows(seed, n):
    rs = np.random.default_rng(seed)
    x = rs.normal(size=(n, 3)).astype(np.float32)
    y = (rs.random(n) < 0.5).astype(np.float32)
    return {"x": x, "y": y}


def test_flat_models_of_the_same_model_and_structure_are_equal():
    first, second = MODEL.flatten(INIT), MODEL.flatten({"w": jnp.ones(3), "b": jnp.ones(())})
    assert first == second and hash(first) == hash(second)
    assert first.unravel is not second.unravel
    # another structure, another dtype, another model: different
    assert MODEL.flatten({"w": jnp.zeros(4), "b": jnp.zeros(())}) != first
    assert MODEL.flatten({"w": jnp.zeros(3, jnp.float16), "b": jnp.zeros(())}) != first
    other = fm.Model(log_prior=MODEL.log_prior, log_likelihood=MODEL.log_likelihood)
    assert other.flatten(INIT) != first


@pytest.mark.filterwarnings("ignore::fedmcmc.surrogates.SurrogateMixingWarning")  # 50 draws
def test_surrogate_fits_reuse_their_trace_for_new_clients_of_the_same_shapes():
    def fit(seed, kind, **options):
        federation = fm.Federation([_rows(seed, 40)])
        flat = MODEL.flatten(INIT)  # a new flat view every call, as every client builds one
        return surrogates.fit_surrogates(kind, flat, federation, flat.ravel(INIT),
                                         jax.random.key(seed)[None], **options)

    sgld = dict(step_size=1e-3, batch_size=10, draws=50, burn_in=10)
    fit(0, "sgld", **sgld)
    fit(0, "laplace")
    traced = (surrogates._modes_program._cache_size(), surrogates._sgld_fit_program._cache_size(),
              surrogates._taylor_program._cache_size())
    first = fit(1, "sgld", **sgld)
    fit(2, "laplace")
    assert (surrogates._modes_program._cache_size(), surrogates._sgld_fit_program._cache_size(),
            surrogates._taylor_program._cache_size()) == traced
    # the reused program fits the new client's own rows (not the first client's)
    assert not np.allclose(np.asarray(first.shift), np.asarray(fit(0, "sgld", **sgld).shift))
    # a new shape is a new trace
    federation = fm.Federation([_rows(3, 41)])
    flat = MODEL.flatten(INIT)
    surrogates.fit_surrogates("laplace", flat, federation, flat.ravel(INIT))
    assert surrogates._modes_program._cache_size() == traced[0] + 1


def _client(index, rows, protocol, seed=0):
    spec = {"seed": seed, "chains": 2, "thin": 1, "num_clients": 3}
    return HandoffClient(index, rows, MODEL, INIT, protocol, spec)


def test_visits_of_same_shaped_clients_lower_to_one_program():
    protocol = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
    clients = [_client(s, _rows(s, n), protocol) for s, n in ((0, 30), (1, 30), (2, 31))]
    for client in clients:
        client.configure(DSGLDParameters(weight=np.float32(1 / 3)))

    def program(client):
        carry = protocol.init_carry(np.zeros(4, np.float32))
        return client._visit.lower(np.int32(0), carry, np.int32(0), client.parameters,
                                   client.context.data.data, client._root_key).as_text()

    texts = [program(client) for client in clients]
    assert texts[0] == texts[1]  # the rows are an argument, not constants of the program
    assert texts[0] != texts[2]  # 31 rows: another shape
    # DSGLD's update reads only the rows of its context: one traced visit for both
    assert protocol.update_reads_only_rows
    assert clients[0]._visit is clients[1]._visit and clients[2]._visit is not clients[0]._visit
    # and each visit still runs on its own client's rows
    carry = protocol.init_carry(np.zeros(4, np.float32))
    ends = [clients[s].visit(0, carry, 0)[0][0] for s in (0, 1)]
    assert not np.allclose(ends[0], ends[1])


def test_a_run_with_another_seed_keeps_the_traced_visit_and_makes_its_own_draws():
    # a reused Ray actor hosts the next run's clients: another seed must not trace the visit
    # again (the run's key is an argument), and its draws must be the new seed's
    protocol = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
    rows = _rows(0, 30)
    clients = [_client(0, rows, protocol, seed=seed) for seed in (0, 1, 0)]
    for client in clients:
        client.configure(DSGLDParameters(weight=np.float32(1 / 3)))
    assert clients[0]._visit is clients[1]._visit is clients[2]._visit
    carry = protocol.init_carry(np.zeros(4, np.float32))
    ends = [client.visit(0, carry, 0)[0][0] for client in clients]
    assert not np.allclose(ends[0], ends[1])  # seed 1's noise, not seed 0's
    np.testing.assert_array_equal(ends[0], ends[2])  # seed 0 again: the same draws
    # and a client built alone for seed 1 (its own trace) makes seed 1's draws
    fresh = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
    alone = _client(0, rows, fresh, seed=1)
    alone.configure(DSGLDParameters(weight=np.float32(1 / 3)))
    assert alone._visit is not clients[1]._visit
    np.testing.assert_array_equal(alone.visit(0, carry, 0)[0][0], ends[1])


def test_a_protocol_that_does_not_promise_it_gets_a_visit_per_client():
    protocol = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
    protocol.update_reads_only_rows = False  # e.g. an update that reads context.index
    clients = [_client(s, _rows(s, 30), protocol) for s in (0, 1)]
    for client in clients:
        client.configure(DSGLDParameters(weight=np.float32(1 / 3)))
    assert clients[0]._visit is not clients[1]._visit


def _fsgld_moments(index, rows):
    """FSGLD's trust-radius moments on a client (``client_estimator_moments``): the mean."""
    protocol = fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5, surrogate="sgld",
                        surrogate_draws=50, surrogate_burn_in=10).handoff_protocol()
    client = _client(index, rows, protocol)
    client.setup("fit_surrogate", np.zeros(4, np.float32))
    product = (np.eye(4, dtype=np.float32), np.zeros(4, np.float32))
    return client.setup("estimator_moments", 0.3, product, np.zeros(4, np.float32))[0]


def _dsgld_noise(index, rows):
    """``step_size="auto"``'s noise statistics on a client (``client_noise``): the mean."""
    protocol = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
    center = np.zeros(4, np.float32)
    points = np.stack([center, center + 0.1]).astype(np.float32)
    return _client(index, rows, protocol).setup("noise", None, center, points, None)[1]


@pytest.mark.filterwarnings("ignore::fedmcmc.surrogates.SurrogateMixingWarning")  # 50 draws
@pytest.mark.parametrize("ask,program", [
    (_fsgld_moments, langevin_handoff._client_moments),
    (_dsgld_noise, langevin_handoff._client_noise_statistics),
], ids=["estimator-moments", "noise-statistics"])
def test_client_set_up_of_same_shaped_clients_reuses_one_trace(ask, program):
    """A second client of the same shapes in the process reuses the first one's trace of the
    set-up program, on its own rows; a client of another shape traces it again."""
    first = ask(0, _rows(0, 30))
    traced = program._cache_size()
    second = ask(1, _rows(1, 30))
    assert program._cache_size() == traced
    assert not np.allclose(first, second)  # each on its own rows
    ask(2, _rows(2, 31))  # another shape: another trace
    assert program._cache_size() == traced + 1


def test_clients_of_one_process_share_one_share_model():
    rows = _rows(0, 20)
    contexts = [client_context(s, rows, 20, MODEL, INIT, 4, 0) for s in range(2)]
    shares = [langevin_handoff._own_share(context)[0] for context in contexts]
    assert shares[0] == shares[1]
    assert langevin_handoff._share_model(MODEL, 5) is not langevin_handoff._share_model(MODEL, 4)


# The start of a fresh process's script that lists the programs JAX compiles (or loads) in
# ``names``, and a linear-regression model for it to run
_PROGRAM_NAMES = r"""
import logging
import jax, jax.numpy as jnp, numpy as np
import fedmcmc as fm

names = []

class Names(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            names.append(message.split(" ")[1])

logging.getLogger("jax").addHandler(Names())
jax.config.update("jax_log_compiles", True)
model = fm.Model(log_prior=lambda p: -0.5 * jnp.sum(p["w"] ** 2),
                 log_likelihood=lambda p, ex: -0.5 * (ex["y"] - ex["x"] @ p["w"]) ** 2)
"""

# A hand-off client's set-up messages in a fresh process (each Ray client is one): the names
# of the programs JAX compiles (or loads), printed one per line
CLIENT_SETUP = _PROGRAM_NAMES + r"""
from fedmcmc.engines.handoff import HandoffClient

init = {"w": np.zeros(3, np.float32)}
rs = np.random.default_rng(0)
rows = {"x": rs.normal(size=(30, 3)).astype(np.float32), "y": rs.normal(size=30).astype(np.float32)}
spec = {"seed": 0, "chains": 2, "thin": 2, "num_clients": 3}
fsgld = fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5, surrogate="sgld",
                 surrogate_draws=50, surrogate_burn_in=10).handoff_protocol()
client = HandoffClient(1, rows, model, init, fsgld, spec)
precision, shift = client.setup("fit_surrogate", np.zeros(3, np.float32))
client.setup("estimator_moments", 0.3, (precision, shift), np.zeros(3, np.float32))
dsgld = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
from fedmcmc.langevin.handoff import DSGLDParameters
HandoffClient(1, rows, model, init, dsgld, spec).configure(DSGLDParameters(weight=np.float32(0.5)))
print("\n".join(names))
"""

#: what a client's surrogate fit, estimator moments and visit compile: the library's own
#: programs, no eager operation (conversions, new axes, indexing, key splits each compile a
#: small program of their own in every new process)
CLIENT_PROGRAMS = {"_seed_key_program", "fold_in_compiled", "_client_fit_key",
                   "_modes_program", "_sgld_fit_program", "_client_moments", "visit"}


def test_a_clients_set_up_compiles_no_eager_operation():
    env = dict(os.environ, FEDMCMC_COMPILATION_CACHE="0")
    run = subprocess.run([sys.executable, "-c", CLIENT_SETUP], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = {line.strip()[len("jit("):-1] for line in run.stdout.splitlines() if line.strip()}
    assert {"_sgld_fit_program", "_client_moments", "visit"} <= compiled
    assert compiled <= CLIENT_PROGRAMS, sorted(compiled - CLIENT_PROGRAMS)


#: every family's fm.sample on the in-process engine, printing what each compiled
# (blackjax imported first: its own import-time operations are not the library's)
SAMPLE_SETUP = "import blackjax\n" + _PROGRAM_NAMES + r"""
init = {"w": np.zeros(2, np.float32)}
rs = np.random.default_rng(0)
federation = fm.Federation([{"x": rs.normal(size=(n, 2)).astype(np.float32),
                             "y": rs.normal(size=n).astype(np.float32)} for n in (12, 5, 20)])
algorithms = [
    fm.SGLD(step_size=1e-3, batch_size=8), fm.DSGLD(step_size=1e-3, batch_size=8, local_steps=4),
    fm.FSGLD(step_size=1e-3, batch_size=8, local_steps=4), fm.FedZigZag(sample_interval=0.5),
    fm.FedBPS(sample_interval=0.5), fm.FedBoomerang(sample_interval=0.5), fm.DULA(), fm.GTDULA(),
    fm.FALD(step_size=1e-3, batch_size=8, local_steps=4),
    fm.QLSD(step_size=1e-3, batch_size=8, variance_reduction=True),
    fm.ConsensusMC(num_warmup=20), fm.ConsensusMC(num_warmup=0, step_size=0.1),
]
for index, algorithm in enumerate(algorithms):
    before = len(names)
    fm.sample(model, federation, algorithm, init=init, num_samples=4, chains=2, seed=0,
              progress=False)
    print(f"{index}:{type(algorithm).__name__}", " ".join(names[before:]))
# the hand-off protocols on the in-process transport: the Ray engine's driver (the server's
# scheduler, FSGLD's product and trust region) with its clients in this process
from fedmcmc.engines.handoff import sample_protocol
handoffs = [fm.DSGLD(step_size=1e-3, batch_size=8, local_steps=4),
            fm.FSGLD(step_size=1e-3, batch_size=8, local_steps=4, surrogate="sgld",
                     surrogate_draws=40, surrogate_burn_in=10)]
for index, algorithm in enumerate(handoffs, start=len(algorithms)):
    before = len(names)
    sample_protocol(algorithm.handoff_protocol(), model, federation, engine="local", init=init,
                    num_samples=4, burn_in=0, thin=1, chains=2, seed=0)
    print(f"{index}:handoff-{type(algorithm).__name__}", " ".join(names[before:]))
"""

#: the programs of the families' set-up and runs: the library's own functions (and its
#: jitted lambdas and derivatives), no eager operation of jax.numpy or jax.random
SAMPLE_PROGRAMS = {
    "_seed_key_program", "run_chunk", "initial_states", "fold_in_compiled", "_modes_program",
    "_taylor_program", "_curving_down", "product", "_laplace_of_product", "laplace_points", "every_client",
    "_conducive_terms", "<lambda>", "hess", "stage", "potential", "_terms", "_third",
    "warm_up_keys", "chain", "untuned_states", "client_gradients"} | CLIENT_PROGRAMS | {
    "next_client"}


@pytest.mark.slow
def test_no_family_runs_an_eager_operation_in_its_set_up():
    """Every family's fm.sample compiles only the library's programs in a new process, and so
    do the hand-off protocols' driver and clients: an eager conversion, broadcast, cumulative
    sum, indexing or factorisation at set-up would be a small program of its own, compiled (or
    read from the cache) in every new process."""
    env = dict(os.environ, FEDMCMC_COMPILATION_CACHE="0")
    run = subprocess.run([sys.executable, "-c", SAMPLE_SETUP], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = {}
    for line in run.stdout.splitlines():
        family, *programs = line.split()
        compiled[family] = {name[len("jit("):-1] for name in programs}
    assert len(compiled) == 14 and "run_chunk" in compiled["0:SGLD"], compiled
    assert "next_client" in compiled["12:handoff-DSGLD"], compiled
    strays = {family: sorted(names - SAMPLE_PROGRAMS) for family, names in compiled.items()
              if names - SAMPLE_PROGRAMS}
    assert not strays, strays


@pytest.mark.parametrize("lengths", [(330, 370), (1000, 1200)])
def test_runs_of_nearly_the_same_length_compile_nothing_new(tmp_path, restore_cache_settings,
                                                           lengths):
    """The default chunk length is rounded to 2^k or 3 * 2^k draws, so a second run of
    another length (here 330 then 370 draws: 17 and 19 per chunk before rounding, both 16
    after) reads every program from the persistent cache; the draws do not depend on it."""
    from fedmcmc.engines.local import shared_chunk_size

    directory = fm.cache.enable(tmp_path / "jax")
    federation = fm.Federation([_rows(0, 40), _rows(1, 25)])
    algorithm = fm.SGLD(step_size=1e-3, batch_size=10)
    written = []
    for num_samples in lengths:
        result = fm.sample(MODEL, federation, algorithm, INIT, num_samples=num_samples,
                           chains=2, seed=0, progress=False)
        written.append(sorted(p.name for p in directory.glob("*-cache")))
    assert written[0] and written[1] == written[0]
    assert shared_chunk_size(lengths[0]) == shared_chunk_size(lengths[1])
    # the longer run's first draws are the shorter run's
    shorter = fm.sample(MODEL, federation, algorithm, INIT, num_samples=lengths[0], chains=2,
                        seed=0, progress=False)
    np.testing.assert_array_equal(np.asarray(result.samples["w"])[:, :lengths[0]],
                                  np.asarray(shorter.samples["w"]))


@pytest.mark.parametrize("total", [1, 5, 19, 20, 21, 41, 290, 999, 1001, 12345, 10**6])
def test_shared_chunk_size_rounds_down_by_at_most_a_third(total):
    from fedmcmc.engines.driver import default_chunk_size
    from fedmcmc.engines.local import shared_chunk_size

    size, plain = shared_chunk_size(total), default_chunk_size(total)
    assert 2 * plain <= 3 * size and size <= plain  # never a larger buffer than before
    odd = size
    while odd % 2 == 0:
        odd //= 2
    assert odd in (1, 3)  # 2^k or 3 * 2^k
    chunks = -(-total // size)
    assert chunks <= 30 and (chunks >= 20 or total < 1000)


# One family per case; the set-up programs each exercises: FSGLD (surrogate fits, the trust
# radius from the data, the clients' estimator moments), Fed Boomerang (the Newton fit of its
# reference), DULA (the tuning terms behind its spread limit, its initial states), Fed Zig-Zag
# (the workers' bounds). The others share the same engine program and run in the slow suite.
# (A step size of "auto" is still a constant of the run program: other data, another h.)
SHARING_CASES = [
    pytest.param(lambda: fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=20), id="FSGLD"),
    pytest.param(lambda: fm.FedZigZag(sample_interval=0.5), id="FedZigZag",
                 marks=pytest.mark.slow),
    pytest.param(lambda: fm.FedBoomerang(sample_interval=0.5), id="FedBoomerang",
                 marks=pytest.mark.slow),
    pytest.param(lambda: fm.DULA(step_size=1e-3, beta=0.3), id="DULA"),
    pytest.param(lambda: fm.SGLD(step_size=1e-3, batch_size=10), id="SGLD",
                 marks=pytest.mark.slow),
    pytest.param(lambda: fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=20), id="DSGLD",
                 marks=pytest.mark.slow),
    pytest.param(lambda: fm.FedBPS(sample_interval=0.5), id="FedBPS", marks=pytest.mark.slow),
    pytest.param(lambda: fm.GTDULA(step_size=1e-3, beta=0.3, gamma=0.3), id="GTDULA",
                 marks=pytest.mark.slow),
]


@pytest.mark.filterwarnings("ignore::fedmcmc.surrogates.SurrogateMixingWarning")
@pytest.mark.parametrize("make", SHARING_CASES)
def test_another_seed_and_other_data_of_the_same_shapes_compile_nothing_new(
        tmp_path, restore_cache_settings, make):
    """A second run with another seed, on other rows of the same shapes, reads every program
    (set-up and sampling) from the persistent cache: the key, the rows and what the set-up
    computes from them (fits, bounds, a trust radius, a spread limit) are arguments of the
    programs, not constants in their text. The same check sees the new programs of a run
    whose shapes differ (one more row), so it can fail."""
    first, again, reshaped = _cache_entries_of_three_runs(
        tmp_path, lambda federation, seed: fm.sample(
            MODEL, federation, make(), INIT, num_samples=20, burn_in=5, chains=2, seed=seed,
            progress=False))
    assert any(name.startswith("jit_run_chunk-") for name in first)
    assert again == first, sorted(set(again) - set(first))
    # other shapes are other programs, and the check sees them
    assert set(reshaped) > set(first)


def _federation(seed, extra_row=0):
    """Three clients of 30, 12 and 45 rows (the first with ``extra_row`` more), drawn from
    ``seed``: another seed, other rows of the same shapes."""
    return fm.Federation([_rows(10 * seed + i, n + (extra_row if i == 0 else 0))
                          for i, n in enumerate((30, 12, 45))])


def _cache_entries_of_three_runs(tmp_path, run):
    """The entries of a private persistent cache after ``run(federation, seed)`` with seed 0
    on three clients of 30, 12 and 45 rows, after a second run with seed 1 on other rows of
    the same shapes, and after a third with one more row; every run's draws are finite."""
    directory = fm.cache.enable(tmp_path / "jax")

    def cache_after(seed, extra_row=0):
        assert np.isfinite(run(_federation(seed, extra_row), seed).flat_samples()).all()
        return sorted(p.name for p in directory.glob("*-cache"))

    return cache_after(0), cache_after(1), cache_after(2, extra_row=1)


def _over_transport(engine: str):
    """A run of each protocol engine with its clients as in-process endpoints (their programs
    are the ones a Ray actor compiles): ``run(federation, seed)``."""
    from fedmcmc.engines.engine import InProcessEngine
    from fedmcmc.engines.handoff import sample_protocol

    common = dict(init=INIT, num_samples=20, burn_in=2, thin=2, chains=2)

    def run(federation, seed):
        if engine == "hand-off":
            protocol = fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5).handoff_protocol()
            return sample_protocol(protocol, MODEL, federation, engine="local", seed=seed,
                                   **common)
        if engine == "broadcast":
            algorithm = fm.FedZigZag(sample_interval=0.3)
            return algorithm.sample_distributed(MODEL, federation, InProcessEngine(),
                                                seed=seed, progress=False, **common)
        if engine == "neighbour":
            algorithm = fm.DULA(step_size=1e-3, beta=0.3)
            return algorithm.sample_distributed(MODEL, federation, InProcessEngine(),
                                                seed=seed, progress=False, **common)
        algorithm = fm.FALD(step_size=1e-3, batch_size=10, local_steps=2)
        return algorithm.sample_distributed(MODEL, federation, InProcessEngine(), seed=seed,
                                            progress=False, **common)

    return run


@pytest.mark.parametrize("engine", [
    "hand-off",
    pytest.param("broadcast", marks=pytest.mark.slow),
    pytest.param("neighbour", marks=pytest.mark.slow),
    pytest.param("baselines", marks=pytest.mark.slow),
])
def test_client_programs_do_not_depend_on_the_seed_or_the_rows_values(
        tmp_path, restore_cache_settings, engine):
    """What a client endpoint compiles (a hand-off visit, a Fed-PDMC worker's proposal, an
    agent's step, an FA-LD client's local steps) takes the run's key and the client's rows as
    arguments: a Ray actor serving a second run with another seed on other rows of the same
    shapes reads its programs from the cache. A run with other shapes compiles anew."""
    first, again, reshaped = _cache_entries_of_three_runs(tmp_path, _over_transport(engine))
    assert again == first, sorted(set(again) - set(first))
    assert set(reshaped) > set(first)


# ------------------------------------------------------------------ programs shared in a process


class _Lowerings:
    """Counts the programs JAX lowers (each lowering precedes a compile or a persistent-cache
    read) while the context is open."""

    def __enter__(self):
        self.count = 0
        self._open = True

        def listener(event, duration, **kwargs):
            if self._open and event.endswith("jaxpr_to_mlir_module_duration"):
                self.count += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        self._open = False  # JAX keeps its listeners: this one stops counting


def _sum_closure(values, scale=2.0):
    values = jnp.asarray(values)
    return lambda x: scale * jnp.sum(values) + x


def test_closures_of_the_same_structure_share_one_program_and_keep_their_own_values():
    shared = fm.cache._SHARED_PROGRAMS
    shared.clear()
    first = fm.cache.jit_with_constants_as_arguments(_sum_closure(np.arange(3.0)))
    second = fm.cache.jit_with_constants_as_arguments(_sum_closure(np.ones(3)))
    assert float(first(jnp.float32(1.0))) == 7.0  # 2 * (0 + 1 + 2) + 1
    with _Lowerings() as lowered:
        assert float(second(jnp.float32(1.0))) == 7.0  # 2 * (1 + 1 + 1) + 1, its own values
    assert lowered.count == 0 and len(shared) == 1
    # another literal (scale) is another program
    third = fm.cache.jit_with_constants_as_arguments(_sum_closure(np.ones(3), scale=3.0))
    with _Lowerings() as lowered:
        assert float(third(jnp.float32(1.0))) == 10.0
    assert lowered.count == 1 and len(shared) == 2
    # under a transformation each trace keeps its own program (and its own derivative rules)
    assert float(jax.grad(lambda x: second(x) ** 2)(jnp.float32(1.0))) == 14.0
    assert np.allclose(jax.vmap(second)(jnp.arange(2.0)), [6.0, 7.0])


def _nested_closure(values):
    inner = jax.jit(lambda x: x + jnp.sum(jnp.asarray(values)))  # not inline: its own constant
    return lambda x: inner(x) * 1.0


def test_what_the_jaxpr_text_does_not_show_is_not_shared():
    """Values a jaxpr's text does not print would make two equal texts compute different
    things: an inner jit's own constants and a callback's Python function. Such programs are
    compiled per trace (if they were shared, the second closure would return the first's
    value, and would lower nothing)."""
    fm.cache._SHARED_PROGRAMS.clear()
    one = fm.cache.jit_with_constants_as_arguments(_nested_closure(np.zeros(4)))
    two = fm.cache.jit_with_constants_as_arguments(_nested_closure(np.ones(4)))
    assert float(one(jnp.float32(1.0))) == 1.0
    with _Lowerings() as lowered:
        assert float(two(jnp.float32(1.0))) == 5.0
    assert lowered.count == 1

    def with_callback(offset):
        def function(x):
            shape = jax.ShapeDtypeStruct((), jnp.float32)
            return jax.pure_callback(lambda v: np.float32(v + offset), shape, x)
        return function

    add_one = fm.cache.jit_with_constants_as_arguments(with_callback(1.0))
    add_two = fm.cache.jit_with_constants_as_arguments(with_callback(2.0))
    assert float(add_one(jnp.float32(0.0))) == 1.0
    with _Lowerings() as lowered:
        assert float(add_two(jnp.float32(0.0))) == 2.0
    assert lowered.count == 1


SAME_PROCESS_CASES = [
    pytest.param(lambda: fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=20), id="FSGLD"),
    pytest.param(lambda: fm.FedZigZag(sample_interval=0.5), id="FedZigZag"),
    pytest.param(lambda: fm.DULA(step_size=1e-3, beta=0.3), id="DULA", marks=pytest.mark.slow),
    pytest.param(lambda: fm.FedBoomerang(sample_interval=0.5), id="FedBoomerang",
                 marks=pytest.mark.slow),
]


@pytest.mark.filterwarnings("ignore::fedmcmc.surrogates.SurrogateMixingWarning")
@pytest.mark.parametrize("make", SAME_PROCESS_CASES)
def test_a_second_run_in_the_process_lowers_no_program_and_draws_as_a_first(make):
    """The next ``fm.sample`` in a process (another seed, other rows of the same shapes) traces
    again but lowers nothing: its set-up and run programs are the ones the first run compiled.
    Its draws are those of the same run in a process that had not compiled them."""
    def run(seed):
        return fm.sample(MODEL, _federation(seed), make(), INIT, num_samples=20, burn_in=5,
                         chains=2, seed=seed, progress=False).flat_samples()

    fm.cache._SHARED_PROGRAMS.clear()
    run(0)
    with _Lowerings() as lowered:
        again = run(1)
    assert lowered.count == 0
    fm.cache._SHARED_PROGRAMS.clear()
    with _Lowerings() as lowered:
        fresh = run(1)
    assert lowered.count > 0  # the same count sees a run that compiles
    np.testing.assert_array_equal(again, fresh)
