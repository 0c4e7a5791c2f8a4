"""Train/test log-likelihood reports from posterior draws (FSGLD Figure 5, Table 1)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Model
from ._common import pooled

__all__ = ["predictive_log_likelihood", "log_likelihood_matrix"]


def _draws(samples: Any, sample_axes: int):
    """Samples (pytree with ``sample_axes`` leading axes) -> (chains, draws, ...) pytree."""
    samples = getattr(samples, "samples", samples)  # accept an fm.Result
    leaves = jax.tree_util.tree_leaves(samples)
    if not leaves:
        raise ValueError("samples has no array leaves")
    if sample_axes not in (1, 2):
        raise ValueError(f"sample_axes must be 1 (draws) or 2 (chains, draws), got {sample_axes!r}")
    lead = {tuple(np.shape(leaf)[:sample_axes]) for leaf in leaves}
    if len(lead) != 1 or len(next(iter(lead))) != sample_axes:
        raise ValueError(
            f"samples: every leaf needs the same {sample_axes} leading sample axes, got {sorted(lead)}"
        )
    if sample_axes == 1:
        samples = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf)[None], samples)
    return samples, next(iter(lead)) if sample_axes == 2 else (1,) + next(iter(lead))


def log_likelihood_matrix(
    model: Model, samples: Any, data: Any, *, sample_axes: int = 2, batch_size: int = 2048
) -> np.ndarray:
    """log p(x_i | theta_{c,d}) for every draw and example: shape (chains, draws, N).

    ``samples``: a pytree whose leaves have ``sample_axes`` leading axes
    ((chains, draws) as in ``result.samples``, or (draws,)), or an ``fm.Result``.
    ``data``: a data pytree (leading example axis) or an ``fm.Federation``
    (pooled). Examples are processed ``batch_size`` at a time.
    """
    samples, (chains, draws) = _draws(samples, sample_axes)
    rows = pooled(data)
    n = int(np.shape(jax.tree_util.tree_leaves(rows)[0])[0])
    flat = jax.tree_util.tree_map(
        lambda leaf: jnp.asarray(leaf).reshape((chains * draws,) + np.shape(leaf)[2:]), samples
    )

    block = _block_for(model)
    batch_size = max(1, min(int(batch_size), n))
    rows = jax.tree_util.tree_map(np.asarray, rows)  # on the host once, sliced per block
    pieces = []
    for start in range(0, n, batch_size):
        # every block has batch_size rows (the last one padded with copies of its first row,
        # whose values are dropped), so one compiled program serves the whole call
        stop = min(start + batch_size, n)
        take = np.concatenate([np.arange(start, stop), np.full(batch_size - (stop - start), start)])
        batch = jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf[take]), rows)
        pieces.append(np.asarray(block(flat, batch), dtype=np.float64)[:, : stop - start])
    return np.concatenate(pieces, axis=1).reshape(chains, draws, n)


@functools.lru_cache(maxsize=16)
def _block_for(model: Model):
    """The compiled (draws x rows) log-likelihood block of ``model``, kept across calls (a
    train and a test evaluation, or one per chain, reuse it instead of recompiling)."""

    @jax.jit
    def block(theta_all, batch):
        per_draw = lambda theta: model.log_likelihood_per_example(theta, batch)  # noqa: E731
        return jax.lax.map(per_draw, theta_all)

    return block


def predictive_log_likelihood(
    model: Model,
    samples: Any,
    data: Any,
    *,
    method: str = "predictive",
    sample_axes: int = 2,
    cumulative: bool = False,
    batch_size: int = 2048,
):
    """Average log-likelihood of ``data`` under posterior draws.

    ``method="predictive"`` (default): the log posterior-predictive density per
    example, averaged over examples,
    (1/N) sum_i log((1/S) sum_s p(x_i | theta_s)), S = chains x draws;
    ``method="expected"``: (1/N) sum_i (1/S) sum_s log p(x_i | theta_s).
    FSGLD reports the "average log-likelihood" on train and test data
    (Figure 5, Table 1); both readings are offered.

    ``cumulative=True`` returns a numpy array over draws whose entry k uses the
    draws 0..k of every chain (Figure 5's curves against the number of samples);
    otherwise a float. Arguments as in :func:`log_likelihood_matrix`.
    """
    if method not in ("predictive", "expected"):
        raise ValueError(f"method must be 'predictive' or 'expected', got {method!r}")
    values = log_likelihood_matrix(
        model, samples, data, sample_axes=sample_axes, batch_size=batch_size
    )
    chains, draws, _ = values.shape
    if method == "expected":
        per_draw = values.mean(axis=(0, 2))  # (draws,)
        if cumulative:
            return np.cumsum(per_draw) / np.arange(1, draws + 1)
        return float(per_draw.mean())
    # log sum over chains of p, per (draw, example)
    top = values.max(axis=0)
    over_chains = top + np.log(np.exp(values - top).sum(axis=0))  # (draws, N)
    if cumulative:
        running = np.logaddexp.accumulate(over_chains, axis=0)
        counts = chains * np.arange(1, draws + 1)[:, None]
        return (running - np.log(counts)).mean(axis=1)
    top = over_chains.max(axis=0)
    total = top + np.log(np.exp(over_chains - top).sum(axis=0))
    return float((total - np.log(chains * draws)).mean())
