"""The relaxation time of a federated PDMP in process time, from the posterior's Laplace fit
and the workers' gradients: what ``sample_interval="auto"`` and ``burn_in="auto"`` use
(:mod:`fedmcmc.run_length`, issue 44; item 3 of issue 48).

The derivation (Bierkens & Duncan 2022, "Fed-PDMC": dynamics (1), rates of Examples 2.4 and
2.5, the federated rate ``lambda_fed = sum_m lambda_m`` of Section 3.1 and Remark 4.1).
Along a direction ``u`` a PDMP moves at the velocity component ``w = <v, u>``, with
``E w^2 = 1`` for all three samplers here (Zig-Zag ``v in {-1, +1}^d``, Example 2.1; BPS
``v ~ N(0, I)``, not normalised, Example 2.2; the Boomerang in the coordinates whitened by
its reference). Each velocity change shrinks ``E[w' | w]``:

* a Zig-Zag flip of coordinate ``i`` (Example 2.4) sends ``v_i -> -v_i``: ``E[v_i' | v_i] =
  -v_i``, a decrease of ``2 v_i``. Worker ``m`` flips it at rate ``(v_i d_i U_m)_+``, whose
  part even in ``v`` is ``|d_i U_m| / 2``; the excess rate ``gamma_i`` (``refresh_rate``) and
  the privacy rate ``rho`` of equation (7) spread over the worker's coordinates flip it too.
  So ``v_i`` decorrelates at ``kappa_i = sum_m E|d_i U_m(x)| + 2 gamma_i``;
* a BPS reflection on ``g = grad U_m`` (Example 2.5, ``Sigma = I``) sends ``w -> w - 2 y a``
  (``n = g / |g|``, ``y = <v, n>``, ``a = <n, u>``) at rate ``<v, g>_+ = |g| y_+``. The
  velocity's decorrelation rate is the regression of the expected change on ``w``:
  ``-E[|g| y_+ (-2 y a) w] = 2 a^2 |g| E[y^3; y > 0] = 2 sqrt(2 / pi) a^2 |g|`` (``w = a y +``
  an independent part, ``E w^2 = 1``; the same computation gives ``|d_i U_m|`` for the
  Zig-Zag above). A refreshment (rate ``refresh_rate``, and the privacy rate ``rho`` of every
  worker, whose events are refreshments) draws ``w`` afresh. So the velocity decorrelates at
  the matrix rate ``K = (refresh_rate + M rho) I + 2 sqrt(2 / pi) sum_m E[g_m g_m^T / |g_m|]``;
* the Boomerang is the BPS in the coordinates whitened by its reference ``N(mu, Sigma_ref)``
  (``z = L^{-1}(x - mu)``, ``L L^T = Sigma_ref``): its reflections (Example 2.5 with
  ``Sigma = Sigma_ref``) are reflections on ``L^T g`` there, and its dynamics (1) with
  ``psi(x) = -(x - mu)`` a rotation of period ``2 pi``.

Worker ``m``'s gradient ``g_m(x)`` is what the sampler's rates use (its data, its prior
share, the Boomerang's reference share, minus its control-variate shift, Remark 4.3),
linearised at the Laplace centre ``g_m(x) = g_m(mode) + H_m (x - mode)`` and averaged over
``x ~ N(mode, P^{-1})`` (``P`` the Laplace precision) by a fixed Monte Carlo sample. The
heterogeneity of the workers enters here: ``sum_m |d_i U_m|`` is larger than
``|d_i U|`` (Section 4.1), and Remark 4.1's "more diffusive" trajectories are a larger
``kappa``.

With a velocity that decorrelates at ``K``, the position is, on time scales longer than
``1 / K``, the overdamped Langevin diffusion of diffusion matrix ``D = K^{-1}``
(``E[v v^T] = I``), an Ornstein-Uhlenbeck process on the Gaussian posterior whose slowest
mode relaxes in

``R = lambda_max(Sigma^{1/2} K Sigma^{1/2})``  (``Sigma = P^{-1}``).

For one coordinate, ``R = kappa sigma^2``. For a one-dimensional Zig-Zag on ``N(0,
sigma^2)`` with excess rate ``gamma`` this is **exact** for the integrated autocorrelation of
``x``: the Poisson equation ``L f = -x`` of its generator is solved by ``f(x, v) = x |x| / 2 +
2 gamma x + v``, so ``int_0^inf corr(x_0, x_t) dt = E[x f] / sigma^2 = sqrt(2 / pi) sigma +
2 gamma sigma^2 = kappa sigma^2`` with ``kappa = E|x| / sigma^2 + 2 gamma``. In several
dimensions and for the BPS it is the diffusive approximation, checked on Gaussians by
``tests/pdmp/test_pdmp_run_length.py``.

A slower clock is added where the dynamics keep a quantity that only refreshments change
(Example 2.5: "without this refreshment the process will in general not be ergodic"). The
BPS's reflections on the full gradient keep the speed ``|v|`` and, on a Gaussian, more (the
BPS without refreshment is not ergodic there); reflections on one worker's gradient that
the full gradient would not make (the federated excess ``lambda_fed - lambda_can`` of
Section 4.1) act as partial refreshments, so its clock is ``1 / (refresh_rate + M rho +
sum_m E<v, g_m>_+ - E<v, g>_+)``. The Boomerang's reflections and rotation keep the energy
``|z|^2 + |w|^2`` in the whitened frame: its clock is ``1 / (refresh_rate + M rho)``, and it
takes at least a quarter turn ``pi / 2`` (``cos(pi / 2) = 0``). ``R = max(R_diffusive,
clock)``; the Zig-Zag has no such clock (it is ergodic without excess rate, and its flips
are all the velocity changes there are).

Measured (``tests/pdmp/test_pdmp_run_length.py``, the bulk ESS of draws one predicted ``R``
apart read as the AR(1) of :mod:`fedmcmc.run_length`): on the PDMP Gaussian with 8 non-IID
workers, Zig-Zag 3.6 for 3.8 predicted, BPS 5.7 for 6.5, Boomerang 11.9 for 16.3 (its clock);
on the real federations with control variates the bulk ESS was 0.75 to 1.2 times the
predicted one (the least: BPS on grouseticks). The predicted event rate was within 2 % of the
events counted (10 % for the BPS on the real federations).

The same averages give the predicted **event rate** (velocity changes per unit of process
time, per chain): ``sum_m E (v_i d_i U_m)_+ = sum_m E|d_i U_m| / 2`` per Zig-Zag coordinate,
``sum_m E <v, g_m>_+ = sum_m E|g_m| / sqrt(2 pi)`` for the BPS (``|L^T g_m|`` for the
Boomerang), plus refreshments and privacy events: the cost of a run of a given length.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["Prediction", "WorkerTerms", "predict", "initial_offset", "MONTE_CARLO_POINTS"]

#: points of the fixed Monte Carlo sample of the Laplace fit the averages are taken over
MONTE_CARLO_POINTS = 256
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class WorkerTerms(NamedTuple):
    """The rate holders' gradients as the sampler sees them, linearised at the Laplace
    centre: ``g (J, d)`` at the centre and ``H (J, d, d)`` (``J``: the data workers and, with
    ``prior="server"`` or ``"worker"``, the prior's proposer); ``coords (J, d)`` the
    coordinates each holds (Remark 3.1)."""

    g: np.ndarray
    H: np.ndarray
    coords: np.ndarray


class Prediction(NamedTuple):
    """What :func:`predict` returns (process-time units)."""

    relaxation_time: float  # R
    event_rate: float  # predicted velocity changes per unit of process time, one chain
    diffusive: float  # lambda_max(Sigma^{1/2} K Sigma^{1/2})
    refresh_clock: float  # 1 / refreshment-type rate (BPS, Boomerang; 0 for Zig-Zag)
    largest_sd: float  # sqrt(lambda_max(Sigma)): the posterior's largest sd


def _sqrtm_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(0.5 * (matrix + matrix.T))
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def predict(sampler: str, mode: np.ndarray, precision: np.ndarray, terms: WorkerTerms, *,
            refresh_rate: float, rho: float, num_workers: int,
            reference_chol: Optional[np.ndarray] = None,
            points: int = MONTE_CARLO_POINTS) -> Prediction:
    """The relaxation time ``R`` and event rate of ``sampler`` (``"zigzag"``, ``"bps"`` or
    ``"boomerang"``) on the posterior ``N(mode, precision^{-1})`` (module docstring).
    ``rho``: every worker's privacy/excess rate; ``reference_chol``: the Boomerang's ``L``."""
    mode = np.asarray(mode, np.float64)
    d = mode.shape[0]
    precision = 0.5 * (np.asarray(precision, np.float64) + np.asarray(precision, np.float64).T)
    cov = np.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    chol_cov = np.linalg.cholesky(cov)
    # a fixed sample of the Laplace fit: the prediction is a deterministic function of it
    offsets = np.random.default_rng(20221124).standard_normal((points, d)) @ chol_cov.T
    g = np.asarray(terms.g, np.float64)
    H = np.asarray(terms.H, np.float64)
    grads = g[None] + np.einsum("jab,pb->pja", H, offsets)  # (points, J, d)
    grads = grads * np.asarray(terms.coords, np.float64)[None]
    largest_sd = float(math.sqrt(max(np.linalg.eigvalsh(cov).max(), 0.0)))
    M = num_workers
    if sampler == "zigzag":
        mean_abs = np.abs(grads).mean(axis=0).sum(axis=0)  # (d,) sum_m E|d_i U_m|
        coords = np.asarray(terms.coords[:M], np.float64)
        per_coordinate = np.where(coords.sum(axis=1, keepdims=True) > 0,
                                  coords / np.maximum(coords.sum(axis=1, keepdims=True), 1.0),
                                  0.0).sum(axis=0)
        gamma = refresh_rate + rho * per_coordinate  # excess flips per coordinate
        kappa = mean_abs + 2.0 * gamma
        root = np.sqrt(kappa)
        diffusive = float(np.linalg.eigvalsh(root[:, None] * cov * root[None, :]).max())
        rate = float(0.5 * mean_abs.sum() + refresh_rate * d + rho * M)
        return Prediction(diffusive, rate, diffusive, 0.0, largest_sd)
    if sampler == "boomerang":
        if reference_chol is None:
            raise ValueError("the Boomerang's prediction needs its reference (reference_chol)")
        L = np.asarray(reference_chol, np.float64)
        grads = grads @ L  # L^T g (rows): the gradients in the whitened frame
        whitened_cov = np.linalg.solve(L, np.linalg.solve(L, cov).T)  # L^{-1} Sigma L^{-T}
        cov_for_r = 0.5 * (whitened_cov + whitened_cov.T)
    elif sampler == "bps":
        cov_for_r = cov
    else:
        raise ValueError(f"sampler must be 'zigzag', 'bps' or 'boomerang', got {sampler!r}")
    norms = np.linalg.norm(grads, axis=-1)  # (points, J)
    safe = np.where(norms > 0, norms, 1.0)
    outer = np.einsum("pja,pjb->ab", grads / safe[..., None], grads) / points
    refresh = refresh_rate + rho * M
    K = refresh * np.eye(d) + 2.0 * _SQRT_2_OVER_PI * outer
    root = _sqrtm_psd(cov_for_r)
    diffusive = float(np.linalg.eigvalsh(root @ K @ root).max())
    breaking = refresh
    if sampler == "bps":  # the federated excess reflections: partial refreshments
        total = grads.sum(axis=1)  # (points, d): the full gradient
        breaking += float(norms.mean(axis=0).sum() - np.linalg.norm(total, axis=-1).mean()
                          ) / math.sqrt(2.0 * math.pi)
    clock = 1.0 / breaking if breaking > 0 else math.inf
    relaxation = max(diffusive, clock)
    if sampler == "boomerang":
        relaxation = max(relaxation, 0.5 * math.pi)
    rate = float(norms.mean(axis=0).sum() / math.sqrt(2.0 * math.pi) + refresh)
    return Prediction(relaxation, rate, diffusive, clock, largest_sd)


def initial_offset(theta0: np.ndarray, mode: np.ndarray, precision: np.ndarray) -> float:
    """The chains' start in posterior sds, ``sqrt((theta0 - m)^T P (theta0 - m))``."""
    delta = np.asarray(theta0, np.float64) - np.asarray(mode, np.float64)
    return float(math.sqrt(max(float(delta @ np.asarray(precision, np.float64) @ delta), 0.0)))
