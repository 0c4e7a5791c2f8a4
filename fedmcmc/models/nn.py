"""Neural-network classifiers: the FSGLD MLP (section 5.3) and LeNet-5 (GT-DULA, MNIST).

Written in plain JAX so that the parameters are a pytree of arrays only (dicts
and lists; no module objects), which every sampler can flatten directly.
``attributes["init"]`` is ``key -> params`` (a random initialisation from a
``jax.random`` key, an int seed or a numpy Generator), ``attributes["apply"]`` is
``(params, inputs) -> logits`` for a batch of inputs (leading axis), and
``attributes["predict"]`` returns class probabilities.

The per-example log likelihood is the log softmax probability of the label,
i.e. minus the cross-entropy loss of that example.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..model import Model
from ._common import LOG_2PI, positive_float, positive_int

__all__ = ["mlp_classifier", "lenet5"]


def _numpy_rng(key: Any) -> np.random.Generator:
    """A numpy Generator seeded from an int or a ``jax.random`` key.

    Initialisation uses numpy: compiling ``jax.random`` draws for every layer
    shape costs seconds on CPU, for a one-off draw.
    """
    if key is None:
        return np.random.default_rng(0)
    if isinstance(key, (int, np.integer)):
        return np.random.default_rng(int(key))
    if isinstance(key, np.random.Generator):
        return key
    if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key, dtype=np.uint32).ravel().tolist())


def _layer_prior(params: Any, scales: Any) -> jax.Array:
    """sum over leaves of log N(leaf | 0, scale^2) with a per-leaf scale (same tree)."""
    terms = jax.tree_util.tree_map(
        lambda leaf, s: -0.5 * jnp.sum(leaf**2) / s**2 - leaf.size * (np.log(s) + 0.5 * LOG_2PI),
        params,
        scales,
    )
    return sum(jax.tree_util.tree_leaves(terms))


# --------------------------------------------------------------------------- MLP


def mlp_classifier(
    input_dim: int,
    num_classes: int = 2,
    *,
    hidden: Sequence[int] = (18, 18, 8),
    prior_scale: float = 1.0,
) -> Model:
    """Multi-layer perceptron classifier (FSGLD section 5.3: 3 hidden ReLU layers 18-18-8, softmax).

    Parameters: ``{"layers": [{"w": (n_in, n_out), "b": (n_out,)}, ...]}`` with
    ``len(hidden) + 1`` layers (input -> hidden... -> ``num_classes`` logits).
    Example: ``{"x": (input_dim,), "y": ()}`` with an integer label y in
    ``0 .. num_classes - 1``.

    log p(y | x, params) = log softmax(f(x))_y (minus the cross-entropy).
    Prior: every weight and bias ~ N(0, prior_scale^2).
    """
    input_dim = positive_int(input_dim, "input_dim")
    num_classes = positive_int(num_classes, "num_classes")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    hidden = [positive_int(h, "hidden") for h in hidden]
    scale = positive_float(prior_scale, "prior_scale")
    sizes = [input_dim] + hidden + [num_classes]

    def apply(params, x):
        h = x
        layers = params["layers"]
        for layer in layers[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        return h @ layers[-1]["w"] + layers[-1]["b"]

    def log_prior(params):
        leaves = jax.tree_util.tree_leaves(params)
        count = sum(leaf.size for leaf in leaves)
        return -0.5 * sum(jnp.sum(leaf**2) for leaf in leaves) / scale**2 - count * (
            np.log(scale) + 0.5 * LOG_2PI
        )

    def log_likelihood(params, example):
        logits = apply(params, example["x"])
        return jax.nn.log_softmax(logits)[example["y"].astype(jnp.int32)]

    def init(key=None):
        rng = _numpy_rng(key)
        layers = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            bound = np.sqrt(6.0 / n_in)  # He (Kaiming) uniform for ReLU layers
            layers.append(
                {
                    "w": jnp.asarray(rng.uniform(-bound, bound, (n_in, n_out)), jnp.float32),
                    "b": jnp.zeros((n_out,), jnp.float32),
                }
            )
        return {"layers": layers}

    return Model(
        log_prior,
        log_likelihood,
        name="mlp_classifier",
        init=init,
        apply=apply,
        predict=lambda params, x: jax.nn.softmax(apply(params, x), axis=-1),
        layer_sizes=sizes,
    )


# --------------------------------------------------------------------------- LeNet-5

_LENET_SHAPES = {
    "conv1": {"w": (6, 1, 5, 5), "b": (6,)},
    "conv2": {"w": (16, 6, 5, 5), "b": (16,)},
    "fc1": {"w": (400, 120), "b": (120,)},
    "fc2": {"w": (120, 84), "b": (84,)},
    "fc3": {"w": (84, 10), "b": (10,)},
}
_LENET_FAN_IN = {"conv1": 25, "conv2": 150, "fc1": 400, "fc2": 120, "fc3": 84}


def _max_pool(x):  # (B, C, H, W) -> (B, C, H/2, W/2)
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def lenet5(*, num_classes: int = 10, prior_scale: Optional[float] = None) -> Model:
    """LeNet-5 (LeCun et al. 1998) for 28x28 grey images (GT-DULA section on MNIST).

    Architecture: conv 6@5x5 (padding 2) -> ReLU -> max-pool 2 -> conv 16@5x5 ->
    ReLU -> max-pool 2 -> dense 120 -> ReLU -> dense 84 -> ReLU -> dense
    ``num_classes`` (logits); the common modern variant (ReLU, max-pooling).

    Parameters: ``{"conv1": {"w": (6, 1, 5, 5), "b": (6,)}, "conv2": {"w": (16, 6, 5, 5),
    "b": (16,)}, "fc1": {"w": (400, 120), "b": (120,)}, "fc2": {"w": (120, 84), "b": (84,)},
    "fc3": {"w": (84, C), "b": (C,)}}`` (61,706 numbers for C = 10).
    Example: ``{"image": (28, 28) or (784,), "label": ()}`` with integer label.

    Prior: independent Gaussians. ``prior_scale=None`` (default) uses the
    Kaiming scale of each layer, sd sqrt(2 / fan_in) for weights and biases
    (GT-DULA: "Kaiming ... prior"; a Gaussian instead of a uniform so that the
    log prior is smooth); a number uses that sd everywhere. ``init`` draws
    PyTorch's default Kaiming-uniform initialisation.
    """
    num_classes = positive_int(num_classes, "num_classes")
    scale = positive_float(prior_scale, "prior_scale", allow_none=True)
    shapes = {name: dict(shape) for name, shape in _LENET_SHAPES.items()}
    shapes["fc3"] = {"w": (84, num_classes), "b": (num_classes,)}
    scales = {
        name: {
            "w": scale if scale is not None else float(np.sqrt(2.0 / _LENET_FAN_IN[name])),
            "b": scale if scale is not None else float(np.sqrt(2.0 / _LENET_FAN_IN[name])),
        }
        for name in shapes
    }
    dimension = ("NCHW", "OIHW", "NCHW")

    def apply(params, images):
        x = jnp.reshape(images, (-1, 1, 28, 28)).astype(jnp.float32)
        x = jax.lax.conv_general_dilated(
            x, params["conv1"]["w"], (1, 1), ((2, 2), (2, 2)), dimension_numbers=dimension
        )
        x = _max_pool(jax.nn.relu(x + params["conv1"]["b"][None, :, None, None]))
        x = jax.lax.conv_general_dilated(
            x, params["conv2"]["w"], (1, 1), "VALID", dimension_numbers=dimension
        )
        x = _max_pool(jax.nn.relu(x + params["conv2"]["b"][None, :, None, None]))
        x = x.reshape((x.shape[0], -1))
        x = jax.nn.relu(x @ params["fc1"]["w"] + params["fc1"]["b"])
        x = jax.nn.relu(x @ params["fc2"]["w"] + params["fc2"]["b"])
        return x @ params["fc3"]["w"] + params["fc3"]["b"]

    def log_prior(params):
        return _layer_prior(params, scales)

    def log_likelihood(params, example):
        logits = apply(params, example["image"])[0]
        return jax.nn.log_softmax(logits)[example["label"].astype(jnp.int32)]

    def init(key=None):
        rng = _numpy_rng(key)
        params = {}
        for name, shape in shapes.items():
            bound = 1.0 / np.sqrt(_LENET_FAN_IN[name])  # PyTorch default (kaiming_uniform, a=sqrt(5))
            params[name] = {
                "w": jnp.asarray(rng.uniform(-bound, bound, shape["w"]), jnp.float32),
                "b": jnp.asarray(rng.uniform(-bound, bound, shape["b"]), jnp.float32),
            }
        return params

    def predict(params, images):
        return jax.nn.softmax(apply(params, images), axis=-1)

    return Model(log_prior, log_likelihood, name="lenet5", init=init, apply=apply, predict=predict)
