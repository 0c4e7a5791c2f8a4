"""A federation's rows are arguments of the compiled programs, never constants (issue 45).

A program that closes over the rows embeds them in its text: XLA then folds them as constants
(9 s for a scatter-add over the Table 1 MLP's 30 x 90,000 rows), and compile time and memory
grow with the data. These checks are structural, not timed: every module JAX lowers during a
run is dumped (``jax_dump_ir_to``, written before the compilation cache is consulted, so a
cached program is dumped too), and the constants of the modules of a run with 10x the rows must
be no larger than those of the run with 1x (and smaller than 10x a client's rows): no constant
grows with the rows, so compiling takes about the same time. A deliberately leaky program (a jitted closure over the rows) is caught by the same check.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from compiled_programs import dump_programs_to

# a Gaussian mean (FSGLD's exact surrogates apply: no L-BFGS fit in the default suite) and a
# logistic regression (Laplace fits, control variates' anchors: the slow runs)
GAUSSIAN = fm.Model(
    log_prior=lambda p: -0.5 * jnp.sum(p ** 2),
    log_likelihood=lambda p, ex: -0.5 * jnp.sum((ex["x"] - p) ** 2),
)
LOGISTIC = fm.Model(
    log_prior=lambda p: -0.5 * jnp.sum(p ** 2),
    log_likelihood=lambda p, ex: ex["y"] * (ex["x"] @ p) - jnp.logaddexp(0.0, ex["x"] @ p),
)
# rows per client at 1x: unlike any shape elsewhere in the suite, so JAX's in-memory caches hold
# no program of these shapes and each run lowers its own
ROWS = (23, 29, 31)
CONSTANT = re.compile(r"stablehlo\.constant\b[^\n]*?:\s*tensor<([^>]*)>")


def _federation(scale):
    clients = []
    for client, rows in enumerate(ROWS):
        rs = np.random.default_rng(client)
        x = rs.normal(size=(rows * scale, 3)).astype(np.float32)
        y = (x.sum(axis=1) + rs.normal(size=rows * scale) > 0).astype(np.float32)
        clients.append({"x": x, "y": y})
    return fm.Federation(clients)


def _constant_sizes(directory):
    """(module, elements) of every constant of the modules dumped in ``directory``."""
    sizes = []
    for path in sorted(directory.glob("*.mlir")):
        for match in CONSTANT.finditer(path.read_text()):
            dims = match.group(1).split("x")[:-1]  # the last part is the dtype
            sizes.append((path.name, int(np.prod([int(d) for d in dims]))))
    return sizes


def _lowered_constants(tmp_path, name, run):
    """The constants of every module lowered while ``run()`` runs."""
    directory = tmp_path / name
    directory.mkdir()
    with dump_programs_to(directory):
        run()
    return _constant_sizes(directory)


def _assert_no_constant_grows(tmp_path, run_with):
    small = _lowered_constants(tmp_path, "rows-1x", lambda: run_with(_federation(1)))
    large = _lowered_constants(tmp_path, "rows-10x", lambda: run_with(_federation(10)))
    # the modules whose shapes depend on the rows are lowered in both runs (the others may be
    # in JAX's in-memory caches the second time)
    assert small and large, "no module was lowered: the check would pass vacuously"
    largest_1x = max(size for _, size in small)
    grown = [(module, size) for module, size in large
             if size > largest_1x or size >= 10 * min(ROWS)]
    assert not grown, (f"constants that grow with the rows (module, elements; the largest "
                       f"with 1x the rows had {largest_1x}): {grown[:5]}")


ALGORITHMS = {  # name: (model, algorithm)
    "SGLD": (GAUSSIAN, lambda: fm.SGLD(step_size=1e-3, batch_size=10)),
    "DSGLD": (GAUSSIAN, lambda: fm.DSGLD(step_size=1e-3, batch_size=10, local_steps=5)),
    "FSGLD": (GAUSSIAN, lambda: fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5,
                                         surrogate="exact")),
    "FALD": (GAUSSIAN, lambda: fm.FALD(step_size=1e-3, batch_size=10, local_steps=5)),
    "GTDULA": (GAUSSIAN, lambda: fm.GTDULA(step_size=1e-4, beta=0.3, gamma=0.3,
                                           spread_limit=None)),
}
# the set-up programs that fit or tune from the rows (tens of seconds of compiling on 2 cores)
SET_UP_ALGORITHMS = {
    # the control variates' anchor gradients (langevin.setup._anchor_gradients)
    "DSGLD-control-variates": (LOGISTIC, lambda: fm.DSGLD(
        step_size=1e-3, batch_size=10, local_steps=5, control_variates="global")),
    # Laplace surrogates: every client's L-BFGS fit and Hessian
    "FSGLD-laplace": (LOGISTIC, lambda: fm.FSGLD(step_size=1e-3, batch_size=10, local_steps=5)),
    "FSGLD-auto": (LOGISTIC, lambda: fm.FSGLD(step_size="auto", batch_size=10, local_steps=5)),
    # the global mode of the control variates (baselines.common.global_mode)
    "FALD-variance-reduction": (LOGISTIC, lambda: fm.FALD(
        step_size=1e-3, batch_size=10, local_steps=5, variance_reduction=True)),
    "QLSD-variance-reduction": (LOGISTIC, lambda: fm.QLSD(
        step_size=1e-3, batch_size=10, variance_reduction=True)),
    "FedZigZag": (LOGISTIC, lambda: fm.FedZigZag(sample_interval=0.1)),
}


def _check_algorithm(tmp_path, model, algorithm):
    def run_with(federation):
        fm.sample(model, federation, algorithm=algorithm(), init=jnp.zeros(3), num_samples=2,
                  burn_in=0, thin=1, chains=1, seed=0, progress=False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two draws do not converge
        _assert_no_constant_grows(tmp_path, run_with)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_compiled_programs_do_not_grow_with_the_rows(tmp_path, name):
    _check_algorithm(tmp_path, *ALGORITHMS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SET_UP_ALGORITHMS))
def test_set_up_programs_do_not_grow_with_the_rows(tmp_path, name):
    _check_algorithm(tmp_path, *SET_UP_ALGORITHMS[name])


def test_the_check_catches_rows_captured_as_constants(tmp_path):
    """The same check rejects a program that closes over the rows (the bug it guards)."""
    def run_with(federation):
        rows = federation.concatenated().data["x"]
        jax.jit(lambda theta: jnp.sum(rows @ theta))(jnp.ones(3)).block_until_ready()

    with pytest.raises(AssertionError, match="grow with the rows"):
        _assert_no_constant_grows(tmp_path, run_with)
