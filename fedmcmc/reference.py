"""Reference posteriors to measure federated samplers against.

``fm.reference_posterior(model, federation)`` returns the posterior of the
*pooled* data (the target every federated algorithm aims at):

``"exact"``
    When the log posterior is quadratic in the flat parameter vector (a
    Gaussian prior times likelihoods Gaussian in theta: Gaussian mean, linear
    regression with known noise), the posterior is the Gaussian with precision
    ``-H`` (the Hessian of the log posterior, constant) and mean one Newton step
    from any point. Detected numerically, like ``surrogates.fit_exact``: the
    Hessian must agree at three distant points and the gradient must be affine.
    Computed in float64.
``"nuts"``
    Otherwise, BlackJAX NUTS with window adaptation (step size and diagonal
    mass matrix) on the pooled data, several chains.

``method="auto"`` (default) tries exact, then NUTS. A model that carries its
closed-form posterior (``Model(..., exact_posterior=data -> (mean, cov))``, as
the model zoo's conjugate models do) is used directly. Results are cached on disk
(``platformdirs.user_cache_dir("fedmcmc")/reference`` or ``~/.cache/fedmcmc``;
``FEDMCMC_CACHE_DIR`` overrides) under a SHA-256 of the pooled data, the
model's name, a fingerprint of its log density at fixed probe points, ``init``
and the settings, so a changed model or data set never reads a stale entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .algorithm import check_positive_int
from .federation import Federation
from .model import Model
from . import diagnostics

__all__ = ["ReferencePosterior", "reference_posterior", "cache_dir"]

METHODS = ("auto", "exact", "nuts")


@dataclasses.dataclass
class ReferencePosterior:
    """A reference posterior over the flat parameter vector.

    Attributes
    ----------
    method:
        ``"exact"`` or ``"nuts"``.
    mean, cov:
        Posterior mean ``(dim,)`` and covariance ``(dim, dim)`` (exact, or of the draws).
    draws:
        ``(num_samples, dim)`` float64 draws (exact: i.i.d. from the Gaussian; NUTS: pooled chains).
    info:
        Figures of the computation (wall time, NUTS step sizes, divergences, acceptance).
    from_cache:
        True when read from the disk cache.
    """

    method: str
    mean: np.ndarray
    cov: np.ndarray
    draws: np.ndarray
    info: Dict[str, Any]
    from_cache: bool = False

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def sd(self) -> np.ndarray:
        return np.sqrt(np.diag(self.cov))


def cache_dir() -> Path:
    """Where references are cached: $FEDMCMC_CACHE_DIR, else the user's cache dir."""
    env = os.environ.get("FEDMCMC_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("fedmcmc"))
    except ImportError:  # pragma: no cover - platformdirs is nearly always there
        return Path.home() / ".cache" / "fedmcmc"


# ----------------------------------------------------------------- helpers


def _resolve_init(model: Model, init: Any) -> Any:
    if init is None:
        init = model.attributes.get("init")
    if init is None:
        raise ValueError(
            "init is needed to know the parameter structure: pass init=params0 "
            "(or build the model with Model(..., init=params0))"
        )
    if callable(init):  # the model zoo stores init as a function key -> params
        init = init(jax.random.key(0))
    return init


def _log_posterior_fn(model: Model, unravel):
    """``(theta, data) -> log p(theta) + log p(data | theta)``: the rows are an argument, so
    the compiled programs below take them as arguments instead of embedding them as
    constants (compile time and memory that grew with the data; issue 45)."""
    def log_posterior(theta, data):
        params = unravel(theta)
        return model.log_prior(params) + model.log_likelihood_sum(params, data)

    return log_posterior


def _as_dtype(tree, dtype):
    def cast(leaf):
        leaf = np.asarray(leaf)
        return leaf.astype(dtype) if np.issubdtype(leaf.dtype, np.floating) else leaf

    return jax.tree_util.tree_map(cast, tree)


def _fingerprint(model: Model, init, data) -> list:
    """Log posterior and its gradient at fixed probe points: changes when the model does."""
    theta0, unravel = ravel_pytree(init)
    log_post = jax.jit(jax.value_and_grad(_log_posterior_fn(model, unravel)))
    rng = np.random.default_rng(12345)
    values = []
    for scale in (0.0, 0.1, 0.5):
        probe = np.asarray(theta0) + scale * rng.standard_normal(theta0.shape)
        value, grad = log_post(jnp.asarray(probe, dtype=theta0.dtype), data)
        values.append(float(value))
        values.append(float(jnp.sum(grad * (1.0 + jnp.arange(grad.shape[0])))))
    return [float(f"{v:.5g}") for v in values]


def _cache_key(model, federation, init, settings, fingerprint) -> str:
    digest = hashlib.sha256()
    for client in federation.clients:
        for leaf in jax.tree_util.tree_leaves(client):
            array = np.ascontiguousarray(np.asarray(leaf))
            digest.update(str((array.shape, array.dtype.str)).encode())
            digest.update(array.tobytes())
    theta0, _ = ravel_pytree(init)
    digest.update(np.asarray(theta0, dtype=np.float64).tobytes())
    digest.update(str(jax.tree_util.tree_structure(init)).encode())
    digest.update(json.dumps({"model": model.name, "settings": settings, "fingerprint": fingerprint},
                             sort_keys=True).encode())
    return digest.hexdigest()[:32]


def _save(path: Path, reference: ReferencePosterior) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, mean=reference.mean, cov=reference.cov, draws=reference.draws,
             method=np.asarray(reference.method), info=np.asarray(json.dumps(reference.info)))
    os.replace(tmp, path)


def _load(path: Path) -> ReferencePosterior:
    with np.load(path, allow_pickle=False) as data:
        return ReferencePosterior(
            method=str(data["method"]),
            mean=data["mean"],
            cov=data["cov"],
            draws=data["draws"],
            info=json.loads(str(data["info"])),
            from_cache=True,
        )


# ------------------------------------------------------------------- exact


def _exact(model, init, data, num_samples, seed, max_dim=2000) -> Optional[ReferencePosterior]:
    """The Gaussian posterior if the log posterior is quadratic, else None.

    A cheap test first (the gradient must be affine along two random lines:
    zero second differences), so that non-Gaussian models cost a few gradients;
    then the Hessian column by column (Hessian-vector products, memory of one
    gradient per example), checked at two more points.
    """
    started = time.perf_counter()
    with jax.enable_x64(True):
        init64 = _as_dtype(init, np.float64)
        data64 = _as_dtype(data, np.float64)
        theta0, unravel = ravel_pytree(init64)
        theta0 = jnp.asarray(theta0, dtype=jnp.float64)
        dim = theta0.shape[0]
        if dim > max_dim:
            return None
        log_post = _log_posterior_fn(model, unravel)
        rng = np.random.default_rng(0)
        spread = 1.0 + jnp.abs(theta0)
        try:
            grad_fn = jax.jit(jax.grad(log_post))
            g0 = np.asarray(grad_fn(theta0, data64))
            for scale in (0.5, -1.5):
                direction = spread * jnp.asarray(rng.standard_normal(dim))
                g1 = np.asarray(grad_fn(theta0 + scale * direction, data64))
                g2 = np.asarray(grad_fn(theta0 + 2 * scale * direction, data64))
                size = np.max(np.abs(g1 - g0)) + np.max(np.abs(g0)) * 1e-12 + 1e-300
                if not np.all(np.isfinite(g2)) or np.max(np.abs(g2 - 2 * g1 + g0)) > 1e-6 * size:
                    return None

            @jax.jit
            def hessian_at(theta, data):
                columns = jax.lax.map(
                    lambda e: jax.jvp(jax.grad(lambda t: log_post(t, data)), (theta,), (e,))[1],
                    jnp.eye(dim)
                )
                return columns.T

            points = [
                theta0,
                theta0 + spread,
                theta0 - 0.7 * spread * jnp.asarray(rng.standard_normal(dim)),
            ]
            hessians = [np.asarray(hessian_at(p, data64)) for p in points]
            grads = [g0] + [np.asarray(grad_fn(p, data64)) for p in points[1:]]
        except Exception:  # noqa: BLE001 - a model that does not run in float64: not exact
            return None
    hessian = hessians[0]
    if not np.all(np.isfinite(hessian)):
        return None
    scale = np.max(np.abs(hessian)) + 1e-300
    for other in hessians[1:]:
        if not np.allclose(other, hessian, rtol=1e-6, atol=1e-8 * scale):
            return None
    for point, grad in zip(points[1:], grads[1:]):
        predicted = grads[0] + hessian @ (np.asarray(point) - np.asarray(points[0]))
        if not np.allclose(grad, predicted, rtol=1e-6, atol=1e-8 * (np.max(np.abs(grad)) + scale)):
            return None
    precision = -0.5 * (hessian + hessian.T)
    try:
        chol = np.linalg.cholesky(precision)
    except np.linalg.LinAlgError:
        return None  # improper: a flat direction the prior does not fix
    mean = np.asarray(points[0]) + np.linalg.solve(precision, grads[0])
    cov = np.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    noise = np.random.default_rng(seed).standard_normal((num_samples, dim))
    # theta = mean + L^{-T} z has covariance (L L^T)^{-1} = precision^{-1}
    draws = mean + np.linalg.solve(chol.T, noise.T).T
    return ReferencePosterior(
        method="exact", mean=mean, cov=cov, draws=draws,
        info={"wall_time": time.perf_counter() - started, "dim": int(dim)},
    )


def _from_closed_form(exact_fn, federation, num_samples, seed) -> Optional[ReferencePosterior]:
    """A model's own closed-form posterior (``Model(..., exact_posterior=data -> (mean, cov))``)."""
    started = time.perf_counter()
    try:
        mean, cov = exact_fn(federation)
    except Exception:  # noqa: BLE001 - fall back to the numerical detection
        return None
    mean = np.atleast_1d(np.asarray(mean, dtype=np.float64))
    cov = np.atleast_2d(np.asarray(cov, dtype=np.float64))
    if cov.shape != (mean.shape[0], mean.shape[0]) or not np.all(np.isfinite(cov)):
        return None
    draws = np.random.default_rng(seed).multivariate_normal(mean, cov, size=num_samples)
    return ReferencePosterior(
        method="exact", mean=mean, cov=cov, draws=draws,
        info={"wall_time": time.perf_counter() - started, "dim": int(mean.shape[0]),
              "source": "model.attributes['exact_posterior']"},
    )


# -------------------------------------------------------------------- NUTS


def _nuts(model, init, data, num_samples, num_warmup, chains, seed, progress) -> ReferencePosterior:
    try:
        import blackjax
    except ImportError as error:  # pragma: no cover - blackjax is in the extras
        raise ImportError(
            "the NUTS reference needs blackjax: pip install 'fedmcmc[reference]'"
        ) from error
    started = time.perf_counter()
    theta0, unravel = ravel_pytree(init)
    data = jax.tree_util.tree_map(jnp.asarray, data)
    log_posterior = _log_posterior_fn(model, unravel)
    keys = jax.random.split(jax.random.key(seed), chains)

    def one_chain(key, data):
        # Each chain adapts its own step size and diagonal mass matrix; chains are vmapped.
        log_post = lambda theta: log_posterior(theta, data)  # noqa: E731
        key_init, key_warm, key_sample = jax.random.split(key, 3)
        start = theta0 + 0.1 * jax.random.normal(key_init, theta0.shape, theta0.dtype)
        adaptation = blackjax.window_adaptation(
            blackjax.nuts, log_post,
            adaptation_info_fn=lambda state, info, adaptation_state: None,
        )
        (state, parameters), _ = adaptation.run(key_warm, start, num_steps=num_warmup)
        kernel = blackjax.nuts(log_post, **parameters)

        def one(state, k):
            state, info = kernel.step(k, state)
            return state, (state.position, info.is_divergent, info.acceptance_rate)

        _, out = jax.lax.scan(one, state, jax.random.split(key_sample, num_samples))
        return out, parameters["step_size"]

    if progress:
        print(f"reference: NUTS on the pooled data ({chains} chains)...", flush=True)
    # the vmap inside the jit: one program (a jitted chain vmapped outside compiled a transpose
    # of its draws as a second one); the rows an argument, not a constant
    (positions, divergent, accept), step_size = jax.jit(
        jax.vmap(one_chain, in_axes=(0, None)))(keys, data)
    all_draws = np.asarray(positions, dtype=np.float64)
    step_sizes = np.asarray(step_size).tolist()
    divergences = int(np.sum(np.asarray(divergent)))
    acceptance = np.asarray(accept).mean(axis=1).tolist()
    stacked = np.stack(all_draws)  # (chains, n, dim)
    draws = stacked.reshape(-1, stacked.shape[-1])

    ess = diagnostics.ess(stacked)
    rhat = diagnostics.rhat(stacked) if num_samples >= 4 and chains > 1 else np.full(ess.shape, np.nan)
    return ReferencePosterior(
        method="nuts",
        mean=draws.mean(axis=0),
        cov=np.atleast_2d(np.cov(draws, rowvar=False)),
        draws=draws,
        info={
            "wall_time": time.perf_counter() - started,
            "chains": chains,
            "num_samples": num_samples,
            "num_warmup": num_warmup,
            "step_size": step_sizes,
            "divergences": divergences,
            "acceptance_rate": acceptance,
            "min_ess": float(np.min(ess)),
            "max_rhat": float(np.nanmax(rhat)) if np.isfinite(rhat).any() else None,
            "dim": int(draws.shape[1]),
        },
    )


# ------------------------------------------------------------------- public


def reference_posterior(
    model: Model,
    federation: Federation,
    init: Any = None,
    *,
    method: str = "auto",
    num_samples: int = 2000,
    num_warmup: int = 1000,
    chains: int = 2,
    seed: int = 0,
    cache: bool = True,
    progress: bool = False,
) -> ReferencePosterior:
    """The posterior of the pooled data: exact when Gaussian, else BlackJAX NUTS; cached on disk.

    Parameters
    ----------
    model, federation:
        As for :func:`fedmcmc.sample`. The clients' data are pooled: this is the
        centralised target the federated algorithms approximate.
    init:
        A parameter pytree (structure, and NUTS's starting point). ``None``
        uses ``model.attributes["init"]`` when the model carries one.
    method:
        ``"auto"`` (exact if the log posterior is quadratic, else NUTS),
        ``"exact"`` (a ``ValueError`` if it is not quadratic) or ``"nuts"``.
    num_samples:
        Draws returned (per NUTS chain; i.i.d. Gaussian draws for exact).
    num_warmup:
        NUTS window-adaptation steps per chain.
    chains:
        NUTS chains, each adapted separately.
    seed:
        Seed of the draws.
    cache:
        Read and write the on-disk cache (see :func:`cache_dir`).
    """
    if not isinstance(model, Model):
        raise ValueError(f"model must be a fedmcmc.Model, got {type(model).__name__}")
    if not isinstance(federation, Federation):
        raise ValueError(f"federation must be a fedmcmc.Federation, got {type(federation).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    num_samples = check_positive_int(num_samples, "num_samples")
    num_warmup = check_positive_int(num_warmup, "num_warmup")
    chains = check_positive_int(chains, "chains")
    init = _resolve_init(model, init)
    model.check_params(init, federation.example(), argument="init")
    data = federation.pooled()
    settings = {"method": method, "num_samples": num_samples, "num_warmup": num_warmup,
                "chains": chains, "seed": int(seed), "version": 1}
    path = None
    if cache:
        key = _cache_key(model, federation, init, settings, _fingerprint(model, init, data))
        path = cache_dir() / "reference" / f"{key}.npz"
        if path.exists():
            try:
                return _load(path)
            except Exception:  # noqa: BLE001 - a corrupt cache entry is recomputed
                pass
    result = None
    exact_fn = model.attributes.get("exact_posterior")
    if method in ("auto", "exact") and callable(exact_fn):
        result = _from_closed_form(exact_fn, federation, num_samples * (chains if method == "auto" else 1), seed)
    if result is None and method in ("auto", "exact"):
        result = _exact(model, init, data, num_samples * (chains if method == "auto" else 1), seed)
        if result is None and method == "exact":
            raise ValueError(
                "method='exact' needs a log posterior quadratic in the parameters (Gaussian "
                "prior and likelihood Gaussian in theta); this model's is not. Use method='nuts'."
            )
    if result is None:
        result = _nuts(model, init, data, num_samples, num_warmup, chains, seed, progress)
    if path is not None:
        _save(path, result)
    return result
