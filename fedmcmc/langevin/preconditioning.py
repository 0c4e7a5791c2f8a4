"""Diagonal preconditioning of the Langevin family: pSGLD (Li, Chen, Carlson & Carin, AAAI 2016,
"Preconditioned stochastic gradient Langevin dynamics for deep neural networks").

The paper's preconditioned update (with its term Gamma) and its RMSprop estimates of V and G (its
Algorithm 1), in this library's step-size convention (``langevin/sgld.py``: h is the paper's
epsilon_t):

    G_t     = diag(1 / (lambda + sqrt(V_{t-1})))
    theta'  = theta + (h/2) [G_t v(theta) + Gamma(theta)] + N(0, h G_t)
    V_t     = beta V_{t-1} + (1 - beta) g_t * g_t                     (RMSprop's average)

with v(theta) the chain's gradient estimate (SGLD's (2), DSGLD's (4), FSGLD's (5) with the
conducive gradient), g_t = v(theta) / N its average over the N rows of the federation (the
paper's gbar, the minibatch's average gradient per example, when f_s = N_s / N; so lambda and
beta keep the paper's scale), beta = ``decay`` and lambda = ``epsilon``. V starts at the first
update's g * g (as the authors' code does: an average started at zero would make the first
updates' G up to 1 / sqrt(1 - beta) times too large).

**G is formed before V takes the update's own gradient** (from V_{t-1}; the first update from
its own g * g). The paper's Algorithm 1 updates V first, so the G that scales a gradient
contains (1 - beta) times that gradient's square: G is then smaller exactly when the gradient
noise is large, and with skewed gradient noise (unequal clients) the drift E[G_t v_t] is
biased by about (1 - beta) gamma sqrt(C / p) / 2 posterior sds (gamma the noise's skewness, C its
variance, p the posterior precision). Measured on the test's federation (clients of 6 to 280
rows, C / p about 60 to 100, 8 chains, bulk ESS about 4,000): mean z-scores -0.8 and 3.0 with
the paper's order, 0.1 and 0.7 with this one, on the same random numbers. G_t from V_{t-1} is
independent of the update's gradient noise, and both are pSGLD's G up to O(1 - beta).

**Gamma is dropped**, as the paper does in practice (its Algorithm 1 omits it):
Gamma_i(theta) = sum_j dG_ij / dtheta_j, the term that keeps the stationary law exact when G
depends on theta. G depends on theta here only through V, whose last update carries a weight
(1 - beta), so the term is of order (1 - beta), and the paper drops it on that ground (beta near
1). What dropping it leaves, concretely:

* when V is dominated by the gradient's noise (minibatches; the regime of Bayesian neural
  networks), G hardly depends on theta: the bias is of order (1 - beta). Measured on the
  tests' conjugate Gaussian federation (``tests/langevin/test_preconditioning.py``: gradient
  noise 60 to 100 times the posterior precision, condition number 100, beta = 0.99): variances
  2.5 % above the exact law of the chain with G held at its stationary value, means within
  0.5 of their Monte Carlo error (bulk ESS 3,400 and 7,800).
* when V is dominated by the mean gradient (exact gradients, a chain far slower than the
  1 / (1 - beta) updates V averages over), G follows the size of grad log p(theta) and the
  stationary law is no longer the posterior: its density is about the posterior's times
  1 / G(theta), wider tails, whatever h. pSGLD is an approximate sampler there, as Rensmeyer
  & Niggemann (2024, arXiv:2403.08609) find for such adaptive samplers on neural networks.
* in federation, a chain that stays on a client for many more than 1 / (1 - beta) updates
  adapts G to that client's gradient, so G correlates with the client and the client drifts no
  longer average out exactly (DSGLD's heterogeneity, which FSGLD's conducive gradient
  removes). Keep ``local_steps`` well below 1 / (1 - beta) (100 at the default decay) with
  DSGLD on non-IID clients.

Functional core: :class:`RMSPropPreconditioner` is immutable configuration with pure methods
(:meth:`~RMSPropPreconditioner.init`, :meth:`~RMSPropPreconditioner.update`,
:meth:`~RMSPropPreconditioner.diagonal`, :meth:`~RMSPropPreconditioner.move`); the average V is
part of the chain's state (``SGLDState.square_average``, ``FederatedChainState.square_average``)
and of the hand-off carry, so it travels with the chain from client to client, as
``fm.FedSGHMC``'s momentum does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

__all__ = ["RMSPropPreconditioner", "as_preconditioner", "describe_preconditioner",
           "check_combination", "check_run_request", "trust_radius_widening"]


@dataclasses.dataclass(frozen=True)
class RMSPropPreconditioner:
    """The diagonal RMSprop preconditioner of pSGLD (Li et al., 2016; module docstring).

    Parameters
    ----------
    decay:
        beta in (0, 1), the weight of the running average V of g * g (the paper's alpha,
        0.99 there). The bias of the dropped Gamma term is of order 1 - decay.
    epsilon:
        lambda > 0, added to sqrt(V): G is at most 1 / lambda (the paper's 1e-5).
    """

    decay: float = 0.99
    epsilon: float = 1e-5

    def __post_init__(self):
        for name, value in (("decay", self.decay), ("epsilon", self.epsilon)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {self.decay!r}")
        if not self.epsilon > 0.0:
            raise ValueError(f"epsilon must be positive, got {self.epsilon!r}")
        object.__setattr__(self, "decay", float(self.decay))
        object.__setattr__(self, "epsilon", float(self.epsilon))

    # ------------------------------------------------------------------ pure functions
    @staticmethod
    def init(position: jax.Array) -> jax.Array:
        """V before the first update (zeros; the first update replaces it by g * g)."""
        return jnp.zeros_like(position)

    def update(self, square_average, gradient, rows, first) -> jax.Array:
        """V_t = beta V_{t-1} + (1 - beta) g * g with g = ``gradient`` / ``rows``; g * g itself
        when ``first`` (the chain's first update)."""
        average = gradient / jnp.asarray(rows, gradient.dtype)
        squared = average * average
        decay = jnp.asarray(self.decay, gradient.dtype)
        return jnp.where(first, squared, decay * square_average + (1 - decay) * squared)

    def diagonal(self, square_average) -> jax.Array:
        """G = 1 / (lambda + sqrt(V)), the diagonal of the preconditioner."""
        return 1.0 / (jnp.asarray(self.epsilon, square_average.dtype) + jnp.sqrt(square_average))

    def move(self, position, gradient, step_size, normal, square_average, rows, first,
             noise: bool = True) -> Tuple[jax.Array, jax.Array]:
        """One preconditioned update: ``theta + (h/2) G v + sqrt(h G) xi`` with G from V_{t-1}
        (``square_average``; on the ``first`` update from ``gradient``'s own g * g), Gamma
        dropped, ``normal`` xi ~ N(0, I); without ``noise``, RMSprop's ascent step. Then V
        takes ``gradient``. Returns (theta', V_t)."""
        updated = self.update(square_average, gradient, rows, first)
        scale = self.diagonal(jnp.where(first, updated, square_average))
        position = position + 0.5 * step_size * scale * gradient
        if noise:
            position = position + jnp.sqrt(step_size * scale) * normal
        return position, updated


def as_preconditioner(value: Any, argument: str = "preconditioner"
                      ) -> Optional[RMSPropPreconditioner]:
    """``None`` (no preconditioning), ``"rmsprop"`` (the defaults) or an
    :class:`RMSPropPreconditioner`; ``ValueError`` naming ``argument`` otherwise."""
    if value is None or isinstance(value, RMSPropPreconditioner):
        return value
    if isinstance(value, str) and value == "rmsprop":
        return RMSPropPreconditioner()
    raise ValueError(f"{argument} must be None, 'rmsprop' or fm.RMSPropPreconditioner(...), "
                     f"got {value!r}")


def describe_preconditioner(preconditioner: Optional[RMSPropPreconditioner]):
    """What ``result.info["preconditioner"]`` records: ``None``, or its kind and settings."""
    if preconditioner is None:
        return None
    return {"kind": "rmsprop", "decay": preconditioner.decay, "epsilon": preconditioner.epsilon}


def trust_radius_widening(step_size: float, noise_trace: float, dim: int, rows: int) -> float:
    """FSGLD's ``trust_radius="auto"`` widening for a preconditioned chain.

    For the chain theta' = theta + (h/2) G (v + eps) + N(0, h G) with a fixed diagonal G on a
    posterior of precision P, the stationary covariance S satisfies, to first order in h,
    tr(P S) = d + (h/4) tr(G C) (C the covariance of the gradient noise eps), against
    d + (h/4) tr(C) without G (``fsgld.auto_trust_radius``). G is not known before the run, but
    V >= (its noise part) C_ii / N^2 on average, so G_i <~ N / sqrt(C_ii) and
    tr(G C) <~ N sum_i sqrt(C_ii) <= N sqrt(d tr C): the widening
    ``1 + h N sqrt(tr C / d) / 4`` bounds it from above (a larger radius: the safeguard acts
    less, never inside the stationary region)."""
    trace = max(float(noise_trace), 0.0) if math.isfinite(noise_trace) else 0.0
    return 1.0 + step_size * rows * math.sqrt(trace / dim) / 4.0


def check_combination(preconditioner: Optional[RMSPropPreconditioner], *, step_size: Any,
                      privacy: Any = None, control_variates: Any = None,
                      client_selection: Optional[str] = None) -> None:
    """Refuse (``ValueError`` naming the argument) what a preconditioned run cannot honour:

    * ``step_size="auto"``: its rule bounds the minibatch noise and the discretisation of the
      chain ``theta + (h/2) v + N(0, h I)`` from the posterior's curvature; under G the same
      ratios are those of h G, and G is only known once the chain runs;
    * ``privacy``: the accounting assumes the noise N(0, h I) on a clipped gradient sum;
    * ``control_variates`` and ``client_selection="variance"``: the set-up that measures them
      also checks the given h against the unpreconditioned chain.
    """
    if preconditioner is None:
        return
    if isinstance(step_size, str):
        raise ValueError("step_size='auto' cannot be combined with preconditioner: its rule "
                         "reads the unpreconditioned chain's curvature and noise (under G the "
                         "step is h G, known only once the chain runs); give step_size as a "
                         "number or a schedule")
    if privacy is not None:
        raise ValueError("privacy cannot be combined with preconditioner: the privacy "
                         "accounting assumes the injected noise N(0, h I)")
    if control_variates not in (None, False):
        raise ValueError(f"control_variates={control_variates!r} cannot be combined with "
                         "preconditioner: their set-up checks h against the unpreconditioned "
                         "chain; give control_variates=None")
    if client_selection == "variance":
        raise ValueError("client_selection='variance' cannot be combined with preconditioner: "
                         "its set-up checks h against the unpreconditioned chain")


def check_run_request(preconditioner: Optional[RMSPropPreconditioner], request) -> None:
    """Refuse ``thin="auto"`` / ``burn_in="auto"`` with a preconditioner (``ValueError`` naming
    the argument): they are read from the relaxation time 2 / (h lambda_min(P)) of the
    unpreconditioned chain, while a preconditioned one relaxes in 2 / (h min_i G_i P_ii)."""
    if preconditioner is None or request is None or not request.any_auto:
        return
    argument = "thin" if request.auto_thin else "burn_in"
    raise ValueError(f"{argument}='auto' cannot be combined with preconditioner: it reads the "
                     "relaxation time of the unpreconditioned chain; give thin and burn_in as "
                     "integers")
