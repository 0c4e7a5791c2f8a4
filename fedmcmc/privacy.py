"""Differential privacy of a whole run: the specification, the accountant, the calibration.

A private run (``privacy=`` on ``fm.SGLD``, ``fm.DSGLD``, ``fm.FSGLD``, ``fm.FALD``,
``fm.QLSD``) protects each client's rows against everyone who sees what leaves the client
(the server, the other clients, whoever reads the draws), under the *replace-one* relation:
two data sets are neighbours when one row of one client differs.

**The mechanism** (one update on client s). Every update that touches client s's rows is,
for those rows, a Gaussian mechanism on the
sum ``S`` of the clipped per-example gradients of a minibatch of ``m_s = min(m, N_s)``
distinct rows drawn uniformly without replacement (:mod:`fedmcmc.clipping`): each
per-example gradient is scaled to norm at most ``C = clip_norm``, so replacing one row
moves ``S`` by at most ``2C`` (the L2 sensitivity). The update adds ``(h/2) k_s S`` to the
state with ``k_s = N_s / (w_s m_s)`` (``w_s`` the algorithm's client weight: 1 for SGLD, f_s
for DSGLD, FSGLD, FA-LD) together with Gaussian noise of standard deviation ``sigma_pos``;
seen in the units of ``S`` that noise has standard deviation
``sigma_pos / ((h/2) k_s)`` and the noise multiplier of the step is

    z_s = sigma_pos / ((h/2) k_s 2 C)                       (std over L2 sensitivity).

The Langevin noise the sampler injects anyway gives the floor ``z_L`` (``sigma_pos = sqrt(h)``
for SGLD, DSGLD, FSGLD; ``sqrt(h / f_s)`` for FA-LD's clients; QLSD's clients share the
server's ``N(0, h I)``, client s the variance ``f_s h``: see each algorithm). When the budget
needs more, the library multiplies the noise's standard deviation by ``a_s = z_s / z_L >= 1``
(``noise_inflation``): the chain then samples a wider law than the posterior (the price of
the privacy, reported). Everything else in an update (the prior's gradient, given
surrogates, the scheduler's draws) does not read the rows, and post-processing (thinning,
averaging, quantising, the state handed on) costs nothing.

**The accountant.** Google's ``dp-accounting`` (``pip install "fedmcmc[privacy]"``): the
Renyi-DP accountant
under ``REPLACE_ONE`` composes, per client, ``T_s`` events
``SampledWithoutReplacementDpEvent(N_s, m_s, GaussianDpEvent(z_s))`` (a plain
``GaussianDpEvent`` when ``m_s = N_s``), ``T_s`` the number of updates client s performs over
the whole run, burn-in included and summed over the chains (every intermediate state counted
as released: the bound covers every draw and every message). ``epsilon`` is the RDP
conversion at the run's ``delta``.

**What the library chooses.** ``privacy=(epsilon, delta)`` (or ``Privacy(epsilon=...,
delta=...)``): the smallest
``z_s >= z_L`` per client whose accounted epsilon over the planned run is at most the target
(:func:`calibrate_noise_multiplier`). ``Privacy(noise_multiplier=z)``: that noise (never
below the Langevin floor), accounted. Both: that noise, and a run longer than the budget
allows stops at the last draw within it (:class:`PrivacyBudgetExceeded`, with those draws).
So does a randomly scheduled run whose schedule visits a client more often than planned
(:func:`run_within_budget`): a run never reports an epsilon above its budget.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = ["Privacy", "as_privacy", "PrivacyBudgetExceeded", "DEFAULT_CLIP_NORM",
           "DEFAULT_DELTA", "RDP_ORDERS", "step_event", "run_events", "epsilon_of_events",
           "epsilon_of_steps", "calibrate_noise_multiplier", "langevin_noise_multiplier",
           "ClientPlan", "PrivacyPlan", "plan", "largest_run", "report", "require_accountant",
           "scheduled_steps", "run_within_budget", "SCHEDULE_TAIL",
           "refuse"]

#: the clip norm C of the per-example gradients when none is given: each row's gradient is
#: scaled to norm at most 1 (rescale the data or give ``clip_norm`` for other scales)
DEFAULT_CLIP_NORM = 1.0
#: delta when a noise multiplier alone is given
DEFAULT_DELTA = 1e-5
#: the Renyi orders of the accountant: dense near 1, up to 256 (epsilon is the minimum over
#: them of the RDP conversion, so fewer orders only loosen it; the subsampled mechanism's
#: RDP costs a sum over the order's terms, and these keep an accounting under a second)
RDP_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 10.0,
              12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 64.0, 96.0, 128.0)


class PrivacyBudgetExceeded(ValueError):
    """A private run stopped because its next step would spend more than the budget.
    ``result``: the draws taken within the budget (``None`` when not even the burn-in fits);
    ``result.info["privacy"]`` says what they cost."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


def require_accountant():
    """The ``dp_accounting`` package (the ``privacy`` extra), or a clear error."""
    try:
        import dp_accounting  # noqa: F401
        from dp_accounting import rdp  # noqa: F401
    except ImportError as error:  # pragma: no cover - the extra is installed in the tests
        raise ImportError("privacy= needs Google's dp-accounting: pip install "
                          "'fedmcmc[privacy]' (dp-accounting==0.6.0)") from error
    return dp_accounting


def _positive(value, name: str, *, allow_inf: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"privacy: {name} must be a positive number, got {value!r}") from None
    if isinstance(value, bool) or not (number > 0) or math.isnan(number) or (
            math.isinf(number) and not allow_inf):
        raise ValueError(f"privacy: {name} must be a positive finite number, got {value!r}")
    return number


@dataclasses.dataclass(frozen=True)
class Privacy:
    """What a private run must achieve, or the noise it runs with.

    Parameters
    ----------
    epsilon:
        The budget: every client's accounted epsilon over the whole run stays at most this.
        ``None``: no budget (``noise_multiplier`` required; the run reports what it spent).
    delta:
        The delta of every (epsilon, delta) statement, in (0, 1) (default 1e-5; choose it
        below one over the largest client's number of rows).
    noise_multiplier:
        The noise of every step, as standard deviation over the L2 sensitivity ``2 C``
        (module docstring). ``None`` (default): the library calibrates it to ``epsilon``.
        Given with ``epsilon``: the run stops at the budget (:class:`PrivacyBudgetExceeded`).
    clip_norm:
        C: every per-example log-likelihood gradient is scaled to norm at most C before it
        enters a minibatch sum (default 1.0). Larger C biases less and costs more noise.
    """

    epsilon: Optional[float] = None
    delta: float = DEFAULT_DELTA
    noise_multiplier: Optional[float] = None
    clip_norm: float = DEFAULT_CLIP_NORM

    def __post_init__(self):
        if self.epsilon is None and self.noise_multiplier is None:
            raise ValueError("privacy needs epsilon (a budget) or noise_multiplier (a noise "
                             "level), or both")
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", _positive(self.epsilon, "epsilon"))
        delta = _positive(self.delta, "delta")
        if delta >= 1:
            raise ValueError(f"privacy: delta must be in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "delta", delta)
        if self.noise_multiplier is not None:
            object.__setattr__(self, "noise_multiplier",
                               _positive(self.noise_multiplier, "noise_multiplier"))
        object.__setattr__(self, "clip_norm",
                           _positive(self.clip_norm, "clip_norm", allow_inf=True))


def as_privacy(value: Any, clip_norm: Optional[float] = None) -> Optional[Privacy]:
    """``privacy=`` as given to an algorithm: ``None``, ``(epsilon, delta)`` or a
    :class:`Privacy`. ``clip_norm``: the algorithm's own ``clip_norm=`` argument, if any."""
    if value is None:
        if clip_norm is not None:
            raise ValueError("clip_norm is a privacy setting: give privacy= too")
        return None
    if isinstance(value, Privacy):
        spec = value
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        spec = Privacy(epsilon=value[0], delta=value[1])
    else:
        raise ValueError(f"privacy must be (epsilon, delta) or fm.Privacy(...), got {value!r}")
    if clip_norm is not None:
        spec = dataclasses.replace(spec, clip_norm=clip_norm)
    return spec


def refuse(condition: bool, algorithm: str, what: str) -> None:
    """A clear ``ValueError`` naming ``privacy`` for a setting the accountant cannot count."""
    if condition:
        raise ValueError(f"{algorithm}: privacy= cannot account {what}")


# --------------------------------------------------------------------------- accountant


def step_event(noise_multiplier: float, population: int, sample_size: int):
    """One update's event for one client: the Gaussian mechanism on the clipped sum of
    ``sample_size`` distinct rows out of ``population`` (sampled without replacement)."""
    dp_accounting = require_accountant()
    z = float(noise_multiplier)
    if not (z > 0) or math.isinf(z):
        raise ValueError(f"privacy: noise_multiplier must be positive and finite, got {z!r}")
    gaussian = dp_accounting.GaussianDpEvent(z)
    if sample_size >= population:
        return gaussian
    return dp_accounting.SampledWithoutReplacementDpEvent(
        source_dataset_size=int(population), sample_size=int(sample_size), event=gaussian)


def run_events(noise_multiplier: float, population: int, sample_size: int, steps: int):
    """The ``steps`` updates of one client over a run, self-composed."""
    dp_accounting = require_accountant()
    return dp_accounting.SelfComposedDpEvent(
        step_event(noise_multiplier, population, sample_size), int(steps))


def epsilon_of_events(event, delta: float) -> float:
    """epsilon at ``delta`` of a ``dp_accounting`` event, by the RDP accountant under the
    replace-one relation."""
    dp_accounting = require_accountant()
    from dp_accounting import rdp
    accountant = rdp.RdpAccountant(
        list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(event)
    return float(accountant.get_epsilon(float(delta)))


def epsilon_of_steps(noise_multiplier: float, population: int, sample_size: int, steps: int,
                     delta: float) -> float:
    """A client's epsilon after ``steps`` updates (0 when it performed none)."""
    if int(steps) <= 0:
        return 0.0
    return _epsilon_of_steps(float(noise_multiplier), int(population), int(sample_size),
                             int(steps), float(delta))


def _epsilon_of_steps(noise_multiplier, population, sample_size, steps, delta) -> float:
    # the accountant's own composition (RDP adds over the steps) and conversion, with the
    # one step's RDP curve computed once per mechanism
    from dp_accounting.rdp import rdp_privacy_accountant
    rdp = steps * _step_rdp(noise_multiplier, population, sample_size)
    return float(rdp_privacy_accountant.compute_epsilon(list(RDP_ORDERS), rdp, delta)[0])


@functools.lru_cache(maxsize=1024)
def _step_rdp(noise_multiplier, population, sample_size) -> np.ndarray:
    """One step's RDP at :data:`RDP_ORDERS` (``dp_accounting``'s RDP accountant)."""
    dp_accounting = require_accountant()
    from dp_accounting import rdp
    accountant = rdp.RdpAccountant(
        list(RDP_ORDERS), dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(step_event(noise_multiplier, population, sample_size))
    return np.asarray(accountant._rdp, np.float64)


def calibrate_noise_multiplier(epsilon: float, delta: float, population: int,
                               sample_size: int, steps: int, floor: float,
                               relative_tolerance: float = 1e-2) -> float:
    """The smallest noise multiplier ``z >= floor`` whose ``steps`` updates spend at most
    ``epsilon`` (bisection on log z; the returned z always satisfies the budget)."""
    def spent(z):
        return epsilon_of_steps(z, population, sample_size, steps, delta)

    if steps <= 0 or spent(floor) <= epsilon:
        return float(floor)
    low, high = float(floor), float(floor) * 2.0
    while spent(high) > epsilon:
        low, high = high, high * 2.0
        if high > 1e12:
            raise ValueError(f"privacy: no noise reaches epsilon={epsilon} at delta={delta} "
                             f"over {steps} steps")
    while high / low > 1.0 + relative_tolerance:
        middle = math.sqrt(low * high)
        if spent(middle) <= epsilon:
            high = middle
        else:
            low = middle
    return high


def langevin_noise_multiplier(position_noise_std: float, step_size: float,
                              drift_scale: float, clip_norm: float) -> float:
    """``z_L = sigma_pos / ((h/2) k_s 2 C)``: the noise multiplier the Langevin noise of
    standard deviation ``position_noise_std`` gives a step adding ``(h/2) k_s S``
    (``drift_scale = k_s = N_s / (w_s m_s)``), S the sum of per-example gradients clipped at
    C (module docstring). Unbounded sensitivity (C infinite) cannot be accounted."""
    if not math.isfinite(clip_norm):
        raise ValueError("privacy: clip_norm is infinite (clipping switched off): the "
                         "sensitivity of a step is unbounded, no epsilon can be accounted")
    return float(position_noise_std) / (0.5 * float(step_size) * float(drift_scale)
                                        * 2.0 * float(clip_norm))


# --------------------------------------------------------------------------- plans


@dataclasses.dataclass(frozen=True)
class ClientPlan:
    """One client's mechanism: its rows ``population``, the rows per update
    ``sample_size``, the Langevin floor ``floor`` of the noise multiplier."""

    population: int
    sample_size: int
    floor: float


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """A private run's chosen noise: per client the noise multiplier ``noise_multipliers``
    and ``noise_inflation = z / z_L`` (the factor on the Langevin noise's standard
    deviation), for ``planned_steps`` updates per client."""

    privacy: Privacy
    clients: tuple
    noise_multipliers: tuple
    planned_steps: tuple
    steps_rule: str

    @property
    def noise_inflation(self) -> np.ndarray:
        return np.asarray([z / c.floor for z, c in zip(self.noise_multipliers, self.clients)],
                          np.float64)


def plan(privacy: Privacy, clients: Sequence[ClientPlan], planned_steps: Sequence[int],
         steps_rule: str) -> PrivacyPlan:
    """The noise of a private run: the given ``noise_multiplier`` (at least each client's
    floor) or, with a budget alone, each client's calibrated one for ``planned_steps``."""
    require_accountant()
    if privacy.noise_multiplier is not None:
        chosen = [max(privacy.noise_multiplier, c.floor) for c in clients]
    else:
        calibrated = {}  # identical clients (SGLD's pooled data) calibrated once
        chosen = []
        for c, t in zip(clients, planned_steps):
            key = (c.population, c.sample_size, int(t), c.floor)
            if key not in calibrated:
                calibrated[key] = calibrate_noise_multiplier(
                    privacy.epsilon, privacy.delta, c.population, c.sample_size, int(t),
                    c.floor)
            chosen.append(calibrated[key])
    return PrivacyPlan(privacy=privacy, clients=tuple(clients), noise_multipliers=tuple(chosen),
                       planned_steps=tuple(int(t) for t in planned_steps),
                       steps_rule=steps_rule)


def largest_run(the_plan: PrivacyPlan, steps_for_draws: Callable[[int], Sequence[int]],
                num_samples: int) -> int:
    """The most kept draws (at most ``num_samples``) whose planned steps keep every client
    within the budget (``steps_for_draws(n)``: planned steps per client of a run of n kept
    draws, burn-in included); -1 when not even the burn-in fits."""
    budget = the_plan.privacy.epsilon

    def fits(n):
        return all(epsilon_of_steps(z, c.population, c.sample_size, t, the_plan.privacy.delta)
                   <= budget for z, c, t in zip(the_plan.noise_multipliers, the_plan.clients,
                                                steps_for_draws(n)))

    if fits(num_samples):
        return num_samples
    if not fits(0):
        return -1
    low, high = 0, num_samples  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def report(the_plan: PrivacyPlan, steps: Sequence[int], **extra) -> dict:
    """``result.info["privacy"]``: what the run spent, per client, on its actual steps."""
    p = the_plan.privacy
    spent = [epsilon_of_steps(z, c.population, c.sample_size, int(t), p.delta)
             for z, c, t in zip(the_plan.noise_multipliers, the_plan.clients, steps)]
    info = {
        "epsilon": spent,
        "delta": p.delta,
        "target_epsilon": p.epsilon,
        "noise_multiplier": list(the_plan.noise_multipliers),
        "langevin_noise_multiplier": [c.floor for c in the_plan.clients],
        "noise_inflation": the_plan.noise_inflation.tolist(),
        "noise_chosen_by": "given" if p.noise_multiplier is not None else "calibrated",
        "clip_norm": p.clip_norm,
        "sensitivity": 2.0 * p.clip_norm,
        "neighbouring_relation": "replace one row of one client",
        "steps": [int(t) for t in steps],
        "planned_steps": list(the_plan.planned_steps),
        "steps_rule": the_plan.steps_rule,
        "client_rows": [c.population for c in the_plan.clients],
        "rows_per_step": [c.sample_size for c in the_plan.clients],
        "sampling": "without replacement, fixed size",
        "accountant": "rdp",
        "dp_accounting": "0.6.0",
    }
    info.update(extra)
    return info


#: the probability, per client, that a randomly scheduled run (DSGLD, FSGLD: the clients a
#: chain visits are drawn) performs more updates on the client than its plan counts
SCHEDULE_TAIL = 1e-6


def scheduled_steps(rounds: int, chains: int, weights: Sequence[float],
                    local_steps: int) -> list:
    """Planned updates per client when each of ``chains`` chains visits ``rounds`` clients
    drawn with probabilities ``weights``, ``local_steps`` updates a visit: the visits are
    Binomial(chains * rounds, f_s); the plan counts their 1 - :data:`SCHEDULE_TAIL`
    quantile (the run then accounts the visits it made)."""
    from scipy import stats

    trials = int(chains) * int(rounds)
    visits = [min(trials, int(stats.binom.ppf(1.0 - SCHEDULE_TAIL, trials, float(f))))
              if trials > 0 else 0 for f in weights]
    return [v * int(local_steps) for v in visits]


def run_within_budget(the_plan: PrivacyPlan, *, name: str, num_samples: int,
                      steps_for_draws: Callable[[int], Sequence[int]],
                      run: Callable[[int], Any], steps_of: Callable[[Any, int], Sequence[int]]):
    """A private run: ``run(n)`` for the ``n`` kept draws the plan allows (all of
    ``num_samples`` unless a given noise meets a budget first), ``result.info["privacy"]`` on
    the steps the run made (``steps_of(result, n)``). Stops with :class:`PrivacyBudgetExceeded`
    (which keeps the draws) when the budget ends the run early.

    A randomly scheduled run (DSGLD, FSGLD) can visit a client more often than its plan
    counts (probability below :data:`SCHEDULE_TAIL` per client); its epsilon would then exceed
    the budget. Such a run stops at its last draw within the budget instead: ``run(n)`` is the
    first ``n`` draws of ``run(num_samples)`` (the same seed gives the same chain, schedule
    included), so the largest ``n`` whose steps, as made, fit (a bisection over re-runs) is
    what a run that stopped there would have sent. A run's reported epsilon never exceeds the
    budget."""
    p = the_plan.privacy
    draws = num_samples
    if p.epsilon is not None and p.noise_multiplier is not None:
        draws = largest_run(the_plan, steps_for_draws, num_samples)
        if draws <= 0:
            raise PrivacyBudgetExceeded(
                f"{name}: privacy budget epsilon={p.epsilon} (delta={p.delta}) at "
                f"noise_multiplier={p.noise_multiplier} does not cover the burn-in and one "
                "draw; raise the noise or the budget, or shorten the run")

    def accounted(n):
        result = run(n)
        steps = [int(t) for t in steps_of(result, n)]
        result.info["privacy"] = report(the_plan, steps, draws_within_budget=n)
        return result

    def within(result) -> bool:
        return p.epsilon is None or max(result.info["privacy"]["epsilon"]) <= p.epsilon

    result = accounted(draws)
    if not within(result):
        over = [s for s, e in enumerate(result.info["privacy"]["epsilon"]) if e > p.epsilon]
        low, kept, high = 0, None, draws  # run(high) overspends; run(low) fits (or low = 0)
        while high - low > 1:
            middle = (low + high) // 2
            candidate = accounted(middle)
            if within(candidate):
                low, kept = middle, candidate
            else:
                high = middle
        raise PrivacyBudgetExceeded(
            f"{name}: the scheduler visited client(s) {over} more often than planned "
            f"(probability below {SCHEDULE_TAIL} per client): the budget epsilon={p.epsilon} "
            + (f"ends the run after {low} of {num_samples} draws; they are in error.result"
               if kept is not None else "does not cover the burn-in and one draw; nothing "
               "is released (error.result is None)"), kept)
    if draws < num_samples:
        raise PrivacyBudgetExceeded(
            f"{name}: privacy budget epsilon={p.epsilon} (delta={p.delta}) at "
            f"noise_multiplier={p.noise_multiplier} ends the run after {draws} of "
            f"{num_samples} draws; they are in error.result", result)
    return result
