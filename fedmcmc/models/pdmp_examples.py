"""AR(1) with Student-t noise and the log-Gaussian Cox process: re-exported from
:mod:`fedmcmc.pdmp.models`, where they carry the PDMP rate bounds.

These two models exist for the Fed-PDMC experiments (sections 6.3, E.1 and
Appendix F.3-F.4), so the PDMP family owns them; the zoo gives them their zoo
names, adds an ``init`` attribute, and imports them only when built (so the
zoo imports without the PDMP family).
"""

from __future__ import annotations

import jax.numpy as jnp

from ..model import Model

__all__ = ["ar1_student_t", "lgcp", "ar1_data", "lgcp_data"]


def _pdmp_models():
    try:
        from ..pdmp import models
    except ImportError as error:  # pragma: no cover - only without the PDMP family
        raise ImportError(
            "this model is defined in fedmcmc.pdmp.models (the PDMP family), which failed to "
            f"import: {error}"
        ) from error
    return models


def ar1_student_t(nu: float = 3.0, prior_scale: float = None) -> Model:
    """AR(1) Y_k = c + x Y_{k-1} + eps_k with Student-t(nu) noise (Fed-PDMC 6.3, F.3).

    :func:`fedmcmc.pdmp.models.ar1_model`: parameters ``{"c": (), "x": ()}`` (x the
    AR coefficient, the paper's name); one example is one transition
    ``{"prev": y_{k-1}, "next": y_k}`` of an observed trajectory (data from
    :func:`ar1_data`); flat prior unless ``prior_scale``; per-example elementwise
    ``hessian_bound`` (``(nu+1)/nu |(y, 1)(y, 1)^T|``). Its log likelihood omits the
    Student-t normalising constant log Gamma((nu+1)/2) - log Gamma(nu/2) - log(nu pi)/2
    per example (immaterial for sampling; add it for predictive log-likelihoods).
    """
    model = _pdmp_models().ar1_model(nu=nu, prior_scale=prior_scale)
    model.attributes.setdefault(
        "init", lambda key=None: {"c": jnp.zeros((), jnp.float32), "x": jnp.zeros((), jnp.float32)}
    )
    return model


def lgcp(side: int = 4, alpha: float = 0.1, beta: float = 1.0, horizon: float = 0.5) -> Model:
    """Log-Gaussian Cox process on a side x side grid (Fed-PDMC E.1, F.4).

    :func:`fedmcmc.pdmp.models.lgcp_model`: the parameter is the flat latent field
    x of shape ``(side * side,)`` (row-major cells) with prior N(0, (beta (I - alpha A))^{-1});
    one example is one cell ``{"cell": k, "y": count}`` with log likelihood
    y x_k - exp(x_k) (the constant -log y! omitted); data and spatial blocks
    from :func:`lgcp_data`; carries the F.4 Zig-Zag slope bound and the worker
    coordinates (Remark 3.1).
    """
    model = _pdmp_models().lgcp_model(side, alpha=alpha, beta=beta, horizon=horizon)
    d = int(side) * int(side)
    model.attributes.setdefault("init", lambda key=None: jnp.zeros((d,), jnp.float32))
    return model


def ar1_data(*args, **kwargs):
    """:func:`fedmcmc.pdmp.models.ar1_data` (seed, num_series, length, ..., num_workers) -> client list."""
    return _pdmp_models().ar1_data(*args, **kwargs)


def lgcp_data(*args, **kwargs):
    """:func:`fedmcmc.pdmp.models.lgcp_data` (seed, side, ..., num_workers) -> (client list, field)."""
    return _pdmp_models().lgcp_data(*args, **kwargs)
