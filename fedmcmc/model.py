"""Models: a log prior over a parameter pytree and the log likelihood of one example.

The per-example likelihood is the only thing a user writes; batching (``vmap``),
masking of padded rows, flattening of the parameter pytree for the kernels and
the gradients are derived here once, so that every algorithm family sees the
same model.

Kernels work on *flat* parameter vectors (``jax.flatten_util.ravel_pytree``):
surrogates are Gaussians over the flat vector, PDMP velocities live in the same
space. :class:`FlatModel` is that view; results are unflattened back into the
user's pytree structure.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

PyTree = Any

__all__ = ["Model", "FlatModel", "unravel_draws_numpy"]


class Model:
    """A Bayesian model with a factorised likelihood.

    Parameters
    ----------
    log_prior:
        ``params -> scalar``, the log prior density (up to a constant) of a
        parameter pytree.
    log_likelihood:
        ``(params, example) -> scalar``, the log likelihood of ONE example. An
        example is one row of a client's data pytree: the same structure with
        the leading (example) axis removed.
    name:
        Optional human-readable name used in reports.
    **attributes:
        Optional model-specific extras that some algorithms use when present,
        for example closed-form surrogates or PDMP rate bounds. They are kept in
        :attr:`attributes` and never required.

    Examples
    --------
    >>> import jax.numpy as jnp, fedmcmc as fm
    >>> model = fm.Model(
    ...     log_prior=lambda mu: -0.5 * jnp.sum(mu ** 2),
    ...     log_likelihood=lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2),
    ... )
    """

    def __init__(
        self,
        log_prior: Callable[[PyTree], jax.Array],
        log_likelihood: Callable[[PyTree, PyTree], jax.Array],
        *,
        name: Optional[str] = None,
        **attributes: Any,
    ) -> None:
        if not callable(log_prior):
            raise ValueError("log_prior must be callable: params -> scalar log density")
        if not callable(log_likelihood):
            raise ValueError(
                "log_likelihood must be callable: (params, example) -> scalar log likelihood"
            )
        self.log_prior = log_prior
        self.log_likelihood = log_likelihood
        self.name = name or "model"
        self.attributes = dict(attributes)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"Model(name={self.name!r})"

    # ------------------------------------------------------------------ batched
    def log_likelihood_per_example(self, params: PyTree, batch: PyTree) -> jax.Array:
        """Vector of per-example log likelihoods for a batch (leading axis = examples)."""
        return jax.vmap(self.log_likelihood, in_axes=(None, 0))(params, batch)

    def log_likelihood_sum(
        self, params: PyTree, batch: PyTree, weights: Optional[jax.Array] = None
    ) -> jax.Array:
        """Sum of per-example log likelihoods, optionally weighted (0 = padded row)."""
        values = self.log_likelihood_per_example(params, batch)
        if weights is not None:
            values = jnp.where(weights > 0, values * weights, 0.0)
        return jnp.sum(values)

    # --------------------------------------------------------------- validation
    def check_params(self, params: PyTree, example: PyTree, argument: str = "init") -> None:
        """Raise ``ValueError`` naming ``argument`` if ``params`` does not fit the model.

        The model is evaluated abstractly (``jax.eval_shape``) on ``params`` and
        one example; any failure, or a non-scalar output, is reported as a
        wrong structure of ``argument``.
        """
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:
            raise ValueError(f"{argument} is empty: expected a parameter pytree with array leaves")
        for leaf in leaves:
            array = np.asarray(leaf)  # NumPy: jnp.asarray of a host value compiles a program
            if not jnp.issubdtype(array.dtype, jnp.floating):
                raise ValueError(
                    f"{argument} must have floating-point leaves, got dtype {array.dtype}"
                )
            if not np.all(np.isfinite(array)):
                raise ValueError(f"{argument} contains NaN or infinite values")
        try:
            prior_shape = jax.eval_shape(self.log_prior, params)
            lik_shape = jax.eval_shape(self.log_likelihood, params, example)
        except Exception as error:  # noqa: BLE001 - re-raised with context
            raise ValueError(
                f"{argument} does not have the structure the model expects "
                f"({type(error).__name__}: {error})"
            ) from error
        for what, shape in (("log_prior", prior_shape), ("log_likelihood", lik_shape)):
            if getattr(shape, "shape", None) != ():
                raise ValueError(
                    f"{argument}: model.{what} must return a scalar for these parameters, "
                    f"got shape {getattr(shape, 'shape', shape)}"
                )

    def flatten(self, params: PyTree) -> "FlatModel":
        """The flat view of this model around the structure of ``params``."""
        # ravel_pytree's unravel holds only the leaves' shapes and dtypes, so it can be taken
        # from a trace of the flattening: no concatenation runs (eagerly, it would compile
        # two small programs in every new process)
        unravels = []

        def flat_of(tree):
            flat, unravel = ravel_pytree(tree)
            unravels.append(unravel)
            return flat

        flat = jax.eval_shape(flat_of, params)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        structure = (treedef, tuple((tuple(np.shape(leaf)), str(jnp.result_type(leaf)))
                                    for leaf in leaves))
        return FlatModel(model=self, unravel=unravels[0], dim=int(flat.shape[0]),
                         dtype=flat.dtype, structure=structure)


@dataclasses.dataclass(frozen=True)
class FlatModel:
    """A model seen as a function of a flat parameter vector ``theta``.

    All kernel code uses this view; ``unravel`` maps a flat vector back to the
    user's pytree. Two flat views of the same :class:`Model` around parameters of the same
    structure (tree, leaf shapes and dtypes) are equal and hash alike, whatever ``unravel``
    closure each holds (``unravel`` is determined by ``structure``): compiled programs that
    take the flat model as a static argument are then traced once per model and structure,
    not once per ``model.flatten`` call.
    """

    model: Model
    unravel: Callable[[jax.Array], PyTree] = dataclasses.field(compare=False)
    dim: int
    dtype: Any
    structure: Any = None  # (treedef, ((shape, dtype), ...)) of the parameter pytree

    def __post_init__(self):
        if self.structure is None:  # built by hand: only its own unravel is known to match
            object.__setattr__(self, "structure", ("unravel", self.unravel))

    def ravel(self, params: PyTree) -> jax.Array:
        """``params`` as one flat vector (the order of ``jax.tree_util.tree_leaves``). Concrete
        leaves are concatenated in NumPy and put on the device, which compiles nothing; inside
        a trace, ``ravel_pytree``."""
        leaves = jax.tree_util.tree_leaves(params)
        if not leaves or any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return ravel_pytree(params)[0]
        flat = np.concatenate([np.ravel(np.asarray(leaf)).astype(self.dtype) for leaf in leaves])
        return jax.device_put(flat)

    def log_prior(self, theta: jax.Array) -> jax.Array:
        return self.model.log_prior(self.unravel(theta))

    def log_likelihood(self, theta: jax.Array, example: PyTree) -> jax.Array:
        return self.model.log_likelihood(self.unravel(theta), example)

    def log_likelihood_sum(
        self, theta: jax.Array, batch: PyTree, weights: Optional[jax.Array] = None
    ) -> jax.Array:
        return self.model.log_likelihood_sum(self.unravel(theta), batch, weights)

    def grad_log_prior(self, theta: jax.Array) -> jax.Array:
        return jax.grad(self.log_prior)(theta)

    def grad_log_likelihood_sum(
        self, theta: jax.Array, batch: PyTree, weights: Optional[jax.Array] = None
    ) -> jax.Array:
        """Gradient of sum_i w_i log p(x_i | theta) over a (weighted / masked) batch."""
        return jax.grad(self.log_likelihood_sum)(theta, batch, weights)

    def grad_log_likelihood_per_client(self, positions: jax.Array, rows: PyTree,
                                       owner: jax.Array) -> jax.Array:
        """``(S, d)``: client s's gradient sum_{i owned by s} grad log p(x_i | theta_s), each at
        its own position ``positions[s]``, from rows stacked client after client
        (:meth:`fedmcmc.federation.PaddedData.unpadded`; ``owner`` sorted). The likelihood
        is differentiated with respect to the positions through the row -> client gather,
        whose transpose is a sorted segment sum: the work of the real rows only."""
        def total(positions):
            return jnp.sum(jax.vmap(self.log_likelihood)(positions[owner], rows))

        return jax.grad(total)(positions)

    def unravel_draws(self, draws: jax.Array) -> PyTree:
        """Unflatten an array of draws with arbitrary leading axes (..., dim)."""
        lead = draws.shape[:-1]
        flat = draws.reshape((-1, self.dim))
        tree = jax.vmap(self.unravel)(flat)
        return jax.tree_util.tree_map(lambda leaf: leaf.reshape(lead + leaf.shape[1:]), tree)


def unravel_draws_numpy(flat_model, draws: np.ndarray):
    """``flat_model.unravel_draws`` in NumPy: slices of the flat axis reshaped to each leaf
    (``ravel_pytree`` concatenates the leaves in ``tree_leaves`` order). Avoids compiling
    small XLA programs for what is only slicing."""
    template = jax.eval_shape(flat_model.unravel, jax.ShapeDtypeStruct((flat_model.dim,), flat_model.dtype))
    leaves, treedef = jax.tree_util.tree_flatten(template)
    lead = draws.shape[:-1]
    out, offset = [], 0
    for leaf in leaves:
        size = int(np.prod(leaf.shape, dtype=np.int64))
        out.append(draws[..., offset:offset + size].reshape(lead + tuple(leaf.shape)).astype(leaf.dtype))
        offset += size
    return jax.tree_util.tree_unflatten(treedef, out)
