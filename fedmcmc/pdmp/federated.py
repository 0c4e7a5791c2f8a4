"""Federated event simulation: Algorithm 2 with per-worker thinning (Algorithm 3) and
dynamic prior redistribution (Appendix D, Algorithm 4).

One *event iteration* from the skeleton point (T_k, X_k, V_k):

1. *Locally* every worker m (on its own data) simulates the
   first event time tau_m of its own rate lambda_m (+ its privacy rate rho_m)
   by Poisson thinning against an affine bound (Appendix A), touching only its
   own potential ``U_m + alpha_m U_0 - <s_m, x>`` (alpha_m: its prior share, s_m: the
   control-variate shift of Remark 4.3, zero by default), and proposes its
   velocity change (Zig-Zag flip, reflection on grad U_m, or a refreshment for
   the privacy events).
2. *Centrally* the server takes the minimum together with its own clocks
   (refreshment / excess switching, prior redistribution, the next sample time)
   and moves the state. A worker's search stops at the server's earliest clock
   (``cap``): a proposal later than that could not win. In-process, where a chain's
   workers search side by side (:func:`first_events`), a worker also stops once another
   has accepted an earlier event, and with clients of unequal size the gradients of a
   pass are summed over each worker's own rows rather than the padded layout.

Bound violations (true rate above the bound at a proposed time) are detected at
every proposal, counted per worker, and the worker's bound scale doubled; the
worker then re-draws from its last anchor.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..arrays import device_array
from .events import affine_first_time
from ..rng import exponential64, fold_in, split_key, uniform64

__all__ = ["Workers", "PriorPart", "FedConfig", "FedState", "FedProtocol", "WorkerProposal",
           "ThinningCarry", "SuperpositionCarry", "first_events", "superposed_first_event",
           "build", "select_lanes"]

PyTree = Any
EXCESS = 1


class Workers(NamedTuple):
    """Per-worker arrays, leading axis = data workers (M)."""

    data: PyTree  # (M, n_max, ...)
    mask: jax.Array  # (M, n_max)
    coords: jax.Array  # (M, d) 1 on the coordinates worker m holds (Remark 3.1)
    q: jax.Array  # (M, d, d) elementwise bound |Hessian of U_m| <= q
    l: jax.Array  # (M,) spectral bound
    lw: jax.Array  # (M,) whitened spectral bound (Boomerang)
    rho: jax.Array  # (M,) privacy / excess rate (Section 5)
    cv_weight: jax.Array  # (M,) w_m in the control-variate shift (sum 1)
    g_ref: jax.Array  # (M, d) grad U_m at the reference point (control variates)


class PriorPart(NamedTuple):
    """The potential U_0 (minus the Boomerang reference potential) and its bounds."""

    q: jax.Array  # (d, d)
    l: jax.Array  # ()
    lw: jax.Array  # ()
    g_ref: jax.Array  # (d,) grad of this part at the reference point
    g_total_ref: jax.Array  # (d,) grad of the full potential at the reference point
    # prior="split" Boomerang: worker m's whitened bound is max(alpha_m lw_floor, lw_m +
    # alpha_m lw) (setup.build_sampler; 0 unless the model gives Loewner curvature bounds)
    lw_floor: Any = 0.0


@dataclasses.dataclass(frozen=True, eq=False)
class FedConfig:
    spec: Any
    dim: int
    num_workers: int
    prior_worker: bool  # U_0 simulated by its own channels (server or extra worker)
    exact: bool  # affine rates (quadratic potentials): no thinning needed
    data_grad: Callable  # (x, data_m, mask_m) -> grad of worker m's data potential
    prior_grad: Callable  # x -> grad of U_0 (minus reference for Boomerang)
    custom_slope: Optional[Callable] = None  # (x, v, horizon, data_m, mask_m) -> (d,) slopes
    # X (M, d) -> (M, d): every worker's data_grad at its own row of X at once, from the rows
    # without padding (in-process, clients of unequal size); None: data_grad vmapped
    workers_data_grad: Optional[Callable] = None
    horizon: float = float("inf")
    refresh_rate: float = 0.0
    redistribution_rate: float = 0.0
    control_variates: bool = False
    reference: Any = None
    max_thinning: int = 100_000
    max_iterations_per_draw: int = 1_000_000
    # "per_worker": every worker thins its own rate until its first event (Algorithm 3, what a
    # distributed engine runs); "superposition": one thinning of the summed bounds
    # (superposed_first_event), in-process only. Same law; exact rates (F.1) need neither.
    thinning: str = "per_worker"
    skeleton_size: int = 0
    sample_interval: float = 1.0
    burn_in: int = 0
    rate_diagnostics: bool = True
    has_excess: bool = False  # some worker has rho > 0 (static: skips the clock otherwise)
    # Boomerang with control variates: the whitened distance |L^{-1}(x* - mu)| of their centre
    # x* from the reference mean; its anchors may then take the orbit's constant bound
    # (BoomerangSpec.anchor, issue 48). None: no constant bound (every other sampler)
    centre_distance: Optional[float] = None


class WorkerProposal(NamedTuple):
    """A worker's answer to one event iteration (Algorithm 3): its first event time and what
    the server needs to apply it. Leaves have a leading axis per worker (and per chain) once
    gathered."""

    tau: jax.Array  # float64, first event time relative to the state's t (inf: none before cap)
    kind: jax.Array  # int32, 0 (its own rate) or EXCESS (its rho clock)
    channel: jax.Array  # int32, the rate channel (coordinate for Zig-Zag) that fired
    gradient_at_event: jax.Array  # (d,) its gradient at the event point
    scale: jax.Array  # its bound-enlargement factor after the thinning
    proposals: jax.Array  # int32, thinning proposals made
    rejections: jax.Array  # int32, proposals rejected
    violations: jax.Array  # int32, bound violations met (each doubles the scale)
    overflow: jax.Array  # bool, max_thinning reached without an answer


class ThinningCarry(NamedTuple):
    """The loop state of Algorithm 3's thinning (Poisson thinning with affine bounds
    a + b (t - s) anchored at ``anchor_time``, re-anchored at every rejection)."""

    key: jax.Array
    anchor_time: jax.Array  # s: where the current bound was anchored
    a: jax.Array  # (C,) bound intercepts per channel
    b: jax.Array  # (C,) bound slopes per channel
    horizon_end: jax.Array  # the current bound is trusted up to this time
    scale: jax.Array
    done: jax.Array  # bool
    tau: jax.Array
    kind: jax.Array
    channel: jax.Array
    gradient_at_event: jax.Array
    proposals: jax.Array
    rejections: jax.Array
    violations: jax.Array


#: The per-draw rate diagnostics (``draw_end``'s stats, in ``rates_from_gradients``' order):
#: the federated rate, the plain rate (no control variates) and the canonical rate.
RATE_KEYS = ("rate_federated", "rate_plain", "rate_canonical")


class FedProtocol(NamedTuple):
    """The pieces of :func:`build` that a distributed engine composes: ``propose`` runs on
    a worker (its own data), everything else on the server. ``event_step`` and
    ``draw_step`` of :func:`build` are exactly ``draw_begin``, a loop of
    ``event_keys``/``event_cap``/``propose`` (every worker)/``apply_proposals`` while
    ``t < t_next``, and ``draw_end``."""

    propose: Callable
    propose_all: Callable  # all workers of a chain side by side (the in-process step 1)
    worker_gradient: Callable
    event_keys: Callable
    event_cap: Callable
    apply_proposals: Callable
    draw_begin: Callable
    draw_end: Callable
    prior_gradient_row: Callable
    rates_from_gradients: Callable
    silent_proposal: Callable  # (chains, scale_m) -> WorkerProposal of a dropped worker
    rate_names: tuple = RATE_KEYS  # the stats of rates_from_gradients' values, in order


class FedState(NamedTuple):
    t: jax.Array
    x: jax.Array
    v: jax.Array
    alpha: jax.Array  # (M,) prior shares
    scale: jax.Array  # (P,) bound scale per proposer (workers, then the prior worker)
    next_refresh: jax.Array
    next_redist: jax.Array
    n_draws: jax.Array
    events: jax.Array  # (P,) accepted gradient events per proposer
    excess_events: jax.Array  # (P,)
    refreshes: jax.Array
    redistributions: jax.Array
    iterations: jax.Array  # server event iterations (communication rounds)
    thinning: jax.Array  # (P,) thinning proposals evaluated
    rejections: jax.Array  # (P,)
    violations: jax.Array  # (P,)
    overflow: jax.Array  # thinning or per-draw iteration limit hit
    sum_x: jax.Array  # (d,) int x dt over the kept window
    sum_xx: jax.Array  # (d, d)
    kept_time: jax.Array
    interval_x: jax.Array  # (d,) int x dt over the current draw interval
    sk_t: jax.Array  # (K,)
    sk_x: jax.Array  # (K, d)
    sk_v: jax.Array  # (K, d)
    sk_n: jax.Array


def batched_like(reference, carry):
    """``carry`` with every array leaf made to depend on the scalar ``reference`` (same values).

    Under ``vmap`` (chains, workers) a while loop's carry that starts as constants (counters,
    flags) but becomes batched in the body makes JAX batch the body again until the carry's
    batching settles, and a nested loop is re-batched on every pass of the outer one: about
    three quarters of tracing a Fed-PDMC draw. A carry batched like ``reference`` from the
    start is batched once. Outside ``vmap`` this is the identity (``select(p, a, a)``, which
    the compiler removes)."""
    keep = jnp.isnan(reference)

    def leaf(value):
        if jnp.issubdtype(jnp.result_type(value), jax.dtypes.prng_key):
            return value
        return jnp.where(keep, value, value)

    return jax.tree_util.tree_map(leaf, carry)


def _exp_time(key, rate):
    rate = jnp.asarray(rate)
    e = exponential64(key)
    return jnp.where(rate > 0, e / jnp.where(rate > 0, rate, 1.0), jnp.inf)


def _exact_gradients(x0, v0, grad_fn, grad_args, proposers: int, lanes_grad=None):
    """Each proposer's potential gradient ``g0`` at ``x0`` and its Hessian-vector product
    ``hv`` along ``v0`` (leading axis L): one gradient and one forward-mode derivative per
    proposer, or with ``lanes_grad`` (the in-process engine's unpadded rows) one of each for
    all ``proposers`` at once."""
    if lanes_grad is not None:
        shape = (proposers,) + x0.shape
        X0, V0 = jnp.broadcast_to(x0, shape), jnp.broadcast_to(v0, shape)
        return jax.jvp(lambda X: lanes_grad(X, *grad_args), (X0,), (V0,))

    def one(args):
        grad = lambda y: grad_fn(y, *args)  # noqa: E731
        return grad(x0), jax.jvp(grad, (x0,), (v0,))[1]

    # axis_size: a proposer may have no arguments (the prior's own channels)
    return jax.vmap(one, axis_size=proposers)(grad_args)


def _exact_first_event(cfg: FedConfig, key, x0, v0, cap, g0, hv, q, l, lw, coords, rho,
                       scale):
    """F.1 for one proposer of a quadratic potential: its rate is exactly ``(a + b t)_+``
    along the flow, so its first event time is the inverse of the integrated rate (no
    thinning). ``g0``, ``hv``: its gradient at ``x0`` and Hessian-vector product along ``v0``
    (:func:`_exact_gradients`). Returns its :class:`WorkerProposal`."""
    spec, ref = cfg.spec, cfg.reference
    C = spec.channels(cfg.dim)
    a0, b0 = spec.anchor(x0, v0, g0, hv, q, l, lw, coords, ref, True)
    k1, k2 = split_key(key)
    tc = affine_first_time(a0, b0, exponential64(k1, (C,)))
    ch = jnp.argmin(tc)
    tau = tc[ch]
    kind = jnp.int32(0)
    if cfg.has_excess:
        te = _exp_time(k2, rho)
        kind = jnp.where(te < tau, EXCESS, 0).astype(jnp.int32)
        tau = jnp.minimum(tau, te)
    tau = jnp.where(tau < cap, tau, jnp.inf)
    g_event = g0 + jnp.where(jnp.isfinite(tau), tau, 0.0) * hv  # exact: the gradient is affine
    one, zero_i = jnp.int32(1), jnp.int32(0)
    return WorkerProposal(tau, kind, ch.astype(jnp.int32), g_event, scale, one, zero_i,
                          zero_i, jnp.array(False))


def select_lanes(active, new, old):
    """``new`` on the lanes (leading axis) where ``active``, ``old`` elsewhere; key arrays too."""
    def leaf(n, o):
        return jax.lax.select(jnp.broadcast_to(active.reshape(active.shape + (1,) * (n.ndim - 1)),
                                               n.shape), n, o)
    return jax.tree_util.tree_map(leaf, new, old)


def _centre(cfg: FedConfig, offset_i, scale_i) -> dict:
    """The keyword of ``spec.anchor`` for the Boomerang's constant bound around the control
    variates' centre (none without ``offset``)."""
    if offset_i is None:
        return {}
    return {"centre": (offset_i, cfg.centre_distance, scale_i)}


def _enlarged_intercept(a, b, violated, constant_bounds: bool):
    """A violated bound is enlarged through its slope (doubled); a constant one (slope 0, the
    Boomerang's orbit bound) through its intercept. Without constant bounds: ``a`` as it was
    (the draws of those runs unchanged)."""
    if not constant_bounds:
        return a
    return jnp.where(violated & (b == 0), 2.0 * a, a)


class _Candidate(NamedTuple):
    """A proposer's next candidate event of one thinning pass, before its gradient."""

    key: jax.Array  # the proposer's key after this pass
    accept_key: jax.Array
    channel: jax.Array
    t_prop: jax.Array
    beyond: jax.Array  # past the current bound's horizon: re-anchor there
    capped: jax.Array  # not before the limit: the search ends without an event
    excess_first: jax.Array
    t_safe: jax.Array  # where the gradient is evaluated
    x: jax.Array
    v: jax.Array


def first_events(cfg: FedConfig, keys, x0, v0, cap, grad_fn, grad_args, q, l, lw, coords, rho,
                 scale, slope_fn=None, stop_at_earliest=False,
                 lanes_grad=None, offset=None) -> WorkerProposal:
    """Algorithm 3 for L proposers at once: each one's first event time before ``cap`` (or
    inf), by Poisson thinning of its own rates against affine bounds (Appendix A).

    ``keys``, every leaf of ``grad_args`` and ``q, l, lw, coords, rho, scale`` have a leading
    axis of L proposers; ``x0, v0, cap`` are shared. Proposer i's gradient is
    ``grad_fn(x, *grad_args_i)`` and its extra bound slope ``slope_fn(x, v, *grad_args_i)``;
    ``lanes_grad(X, *grad_args)``, if given, computes the L gradients at the rows of ``X``
    (L, d) at once (the in-process engine's unpadded sum over all workers' rows).
    Returns a :class:`WorkerProposal` with that leading axis. ``offset`` (L,), with
    ``cfg.centre_distance``: each proposer's ``|L^T G_i(x*)|`` at the control variates' centre
    (:meth:`BoomerangSpec.anchor`'s constant bound); None: none.

    The proposers search in one loop, one thinning proposal each per pass (a proposer whose
    search has ended waits). With ``stop_at_earliest`` a proposer also stops once its search
    has passed the earliest event time another one has accepted: the server takes the
    earliest proposal, so a later one cannot win -- the same argument as the server's cap
    (the first event of a thinned process is not earlier than its first candidate), applied
    within the round. Only the in-process engine, where all workers of a chain search side
    by side, can use it; the winner (its time, channel and gradient) is the same either way,
    only the losers' searches are shorter (so a bound violation in the part a loser skips does
    not double its scale, the one way the draws can then differ from a distributed run's).
    """
    spec, ref = cfg.spec, cfg.reference
    C = spec.channels(cfg.dim)
    lanes = (keys, grad_args, q, l, lw, coords, rho, scale)
    if cfg.exact:
        gradients0, products = _exact_gradients(x0, v0, grad_fn, grad_args, keys.shape[0],
                                                lanes_grad)
        return jax.vmap(lambda lane, g0, hv: _exact_first_event(cfg, lane[0], x0, v0, cap, g0,
                                                                hv, *lane[2:]))(
            lanes, gradients0, products)
    single = keys.shape[0] == 1
    lanes = lanes + (offset,)  # lane[8]: None without the constant bound

    def gradients(X):
        """The proposers' gradients at the rows of ``X`` (L, d)."""
        if lanes_grad is not None:
            return lanes_grad(X, *grad_args)
        return jax.vmap(grad_fn)(X, *grad_args)

    def anchor(xs, vs, gs, sc, lane):
        _, args, q_i, l_i, lw_i, coords_i, _, _, offset_i = lane
        a, b = spec.anchor(xs, vs, gs, None, q_i, l_i, lw_i, coords_i, ref, False,
                           **_centre(cfg, offset_i, sc))
        if slope_fn is not None:
            b = b + slope_fn(xs, vs, *args) * coords_i
        return a, b * sc

    def start(lane, g0) -> ThinningCarry:
        key, scale_i = lane[0], lane[7]
        a0, b0 = anchor(x0, v0, g0, scale_i, lane)
        zero = jnp.zeros((), jnp.float64)
        carry = ThinningCarry(
            key=key, anchor_time=zero, a=a0, b=b0, horizon_end=zero + cfg.horizon,
            scale=scale_i, done=jnp.array(False), tau=zero + jnp.inf, kind=jnp.int32(0),
            channel=jnp.int32(0), gradient_at_event=g0, proposals=jnp.int32(0),
            rejections=jnp.int32(0), violations=jnp.int32(0))
        return batched_like(a0[0], carry)

    def candidate(c: ThinningCarry, lane, limit) -> _Candidate:
        """The next candidate of one proposer's bound (its rate channels and its privacy
        clock), or the horizon of the bound, or the limit."""
        rho_i = lane[6]
        s, a, b, hend = c.anchor_time, c.a, c.b, c.horizon_end
        key, k1, k2, k3 = split_key(c.key, 4)
        e = exponential64(k1, (C,))
        tc = affine_first_time(a, b, e)
        ch = jnp.argmin(tc)
        tmin = tc[ch]
        if cfg.has_excess:
            te = _exp_time(k2, rho_i)
            excess_first = te < tmin
        else:
            te, excess_first = jnp.inf, jnp.array(False)
        t_prop = s + jnp.minimum(tmin, te)
        beyond = t_prop > hend
        t_eval = jnp.where(beyond, hend, t_prop)
        capped = ~(t_eval < limit)
        t_safe = jnp.where(jnp.isfinite(t_eval), t_eval, s)
        xe, ve = spec.flow(x0, v0, t_safe, ref)
        return _Candidate(key, k3, ch, t_prop, beyond, capped, excess_first, t_safe, xe, ve)

    def resolve(c: ThinningCarry, lane, cand: _Candidate, ge) -> ThinningCarry:
        """Accept the candidate (rate / bound), reject it (re-anchor the bound there), or end
        the search at the limit; a violated bound doubles the proposer's scale."""
        coords_i = lane[5]
        s, a, b, hend, sc = c.anchor_time, c.a, c.b, c.horizon_end, c.scale
        ch, t_safe, beyond, capped = cand.channel, cand.t_safe, cand.beyond, cand.capped
        rate = spec.rate(cand.x, cand.v, ge, coords_i, ref)[ch]
        bound = jnp.maximum(a[ch] + b[ch] * (t_safe - s), 0.0)
        check = ~capped & ~beyond & ~cand.excess_first
        tol = 1e-6 * (jnp.abs(a[ch]) + jnp.abs(b[ch]) * (t_safe - s)) + 1e-9
        violated = check & (rate > bound + tol)
        u = uniform64(cand.accept_key)
        accept = check & ~violated & (u * bound < rate)
        is_excess = ~capped & ~beyond & cand.excess_first
        reanchor = ~capped & ~violated & ~accept & ~is_excess
        an, bn = anchor(cand.x, cand.v, ge, sc, lane)
        sc_new = jnp.where(violated, 2.0 * sc, sc)
        b_enlarged = jnp.where(b >= 0, 2.0 * b + 1e-12, 0.5 * b)
        a_enlarged = _enlarged_intercept(a, b, violated, offset is not None)
        return ThinningCarry(
            key=cand.key,
            anchor_time=jnp.where(reanchor, t_safe, s),
            a=jnp.where(reanchor, an, a_enlarged),
            b=jnp.where(reanchor, bn, jnp.where(violated, b_enlarged, b)),
            horizon_end=jnp.where(reanchor, t_safe + cfg.horizon, hend),
            scale=sc_new,
            done=capped | accept | is_excess,
            tau=jnp.where(accept | is_excess, cand.t_prop, jnp.inf),
            kind=jnp.where(is_excess, EXCESS, 0).astype(jnp.int32),
            channel=ch.astype(jnp.int32),
            gradient_at_event=ge,
            proposals=c.proposals + 1,
            rejections=c.rejections + (reanchor & ~beyond).astype(jnp.int32),
            violations=c.violations + violated.astype(jnp.int32),
        )

    def limit(c: ThinningCarry):
        """How far the searches go: the server's cap, or the earliest accepted time."""
        if not stop_at_earliest:
            return cap
        return jnp.minimum(cap, jnp.min(c.tau))  # tau is inf until a proposer accepts

    def searching(c: ThinningCarry):
        active = ~c.done & (c.proposals < cfg.max_thinning)
        if stop_at_earliest:
            active = active & (c.anchor_time < limit(c))
        return active

    if single:
        # one proposer (a distributed worker, the prior's channels): no lane axis in the loop,
        # which traces faster (the loop ends with its search: nothing to hold)
        lane = jax.tree_util.tree_map(lambda leaf: leaf[0], lanes)

        def body_one(c: ThinningCarry) -> ThinningCarry:
            cand = candidate(c, lane, limit(c))
            return resolve(c, lane, cand, grad_fn(cand.x, *lane[1]))

        out = jax.lax.while_loop(searching, body_one, start(lane, grad_fn(x0, *lane[1])))
        out = jax.tree_util.tree_map(lambda leaf: leaf[None], out)
    else:
        def body(c: ThinningCarry) -> ThinningCarry:
            cand = jax.vmap(candidate, in_axes=(0, 0, None))(c, lanes, limit(c))
            new = jax.vmap(resolve)(c, lanes, cand, gradients(cand.x))
            return select_lanes(searching(c), new, c)

        initial = jax.vmap(start)(lanes, gradients(jnp.broadcast_to(x0, keys.shape + x0.shape)))
        out = jax.lax.while_loop(lambda c: jnp.any(searching(c)), body, initial)
    finished = out.done
    if stop_at_earliest:
        finished = finished | (out.anchor_time >= limit(out))  # passed the earliest: no event
    return WorkerProposal(out.tau, out.kind, out.channel, out.gradient_at_event, out.scale,
                          out.proposals, out.rejections, out.violations, ~finished)


class SuperpositionCarry(NamedTuple):
    """The loop state of superposition thinning (:func:`superposed_first_event`): every data
    worker's affine bounds (anchored at its own ``anchor_time``) and the next point of its
    bounding Poisson process; the round's answer once ``done``."""

    key: jax.Array
    anchor_time: jax.Array  # (M,)
    a: jax.Array  # (M, C)
    b: jax.Array  # (M, C)
    horizon_end: jax.Array  # (M,)
    scale: jax.Array  # (M,)
    next_time: jax.Array  # (M,) the next point of worker m's bounding process
    next_channel: jax.Array  # (M,) int32, the channel of that point
    next_excess: jax.Array  # (M,) bool, the point is from m's privacy clock rho_m
    done: jax.Array  # bool
    winner: jax.Array  # int32, the worker whose event was accepted
    tau: jax.Array
    kind: jax.Array
    channel: jax.Array
    gradient_at_event: jax.Array  # (d,)
    proposals: jax.Array  # (M,) int32
    rejections: jax.Array  # (M,)
    violations: jax.Array  # (M,)
    passes: jax.Array  # int32, proposals of the superposed process


def next_bound_point(key, anchor_time, a, b, rho, has_excess: bool):
    """The first point after ``anchor_time`` of one worker's bounding Poisson process: its
    channels' affine bounds ``(a_c + b_c (t - anchor_time))_+`` superposed with its privacy
    clock ``rho`` (Appendix A). Returns ``(time, channel, from_the_privacy_clock)``."""
    k1, k2 = split_key(key)
    tc = affine_first_time(a, b, exponential64(k1, a.shape))
    channel = jnp.argmin(tc).astype(jnp.int32)
    t_rate = tc[channel]
    if not has_excess:
        return anchor_time + t_rate, channel, jnp.array(False)
    te = _exp_time(k2, rho)
    return anchor_time + jnp.minimum(t_rate, te), channel, te < t_rate


def proposing_worker(key, next_time):
    """The worker whose bound proposes the next point of the superposed process, and that
    point's time: the earliest of the workers' next points. The first point of a superposition
    of independent Poisson processes is the earliest of their first points, and it belongs to
    process m with probability ``Lambda_m(t) / sum_s Lambda_s(t)``. (``key`` is unused: the
    choice is the argmin; the signature lets a test put a wrong choice in its place.)"""
    del key
    worker = jnp.argmin(next_time).astype(jnp.int32)
    return worker, next_time[worker]


def superposed_first_event(cfg: FedConfig, key, x0, v0, cap, grad_fn, grad_args, q, l, lw,
                           coords, rho, scale, gradients0, slope_fn=None,
                           offset=None) -> WorkerProposal:
    """Step 1 of Algorithm 2 by *superposition thinning*: the first event of the federated rate
    ``sum_m lambda_m`` before ``cap``, thinned against the sum of the workers' bounds.

    Each of the M data workers holds its affine bounds ``Lambda_m`` (Appendix A, anchored at its
    own last rejection, as in :func:`first_events`) and the next point of its bounding Poisson
    process. A pass takes the earliest point over all workers (:func:`proposing_worker`): that is
    the next point of the process of rate ``sum_m Lambda_m(t)``, proposed by worker m with
    probability ``Lambda_m(t) / sum_s Lambda_s(t)``. Only that worker evaluates its gradient and
    accepts with probability ``lambda_m(t) / Lambda_m(t)``; on a rejection it re-anchors its bound
    there and draws its next point (the other workers' points after t are still points of their
    Poisson processes: their bounds did not change). The accepted event therefore has the law of
    the earliest of the workers' own first events -- the per-worker scheme's winner -- while a
    pass costs one worker's gradient instead of every worker's, and no worker searches past the
    event. A point past a bound's horizon re-anchors there; a bound violation doubles that
    worker's scale and it redraws from its last anchor, as in :func:`first_events`.

    ``grad_args`` leaves, ``q, l, lw, coords, rho, scale`` have a leading axis of M workers;
    ``gradients0`` (M, d) are their gradients at ``x0``; ``offset``: as in :func:`first_events`.
    Returns a :class:`WorkerProposal` with
    that leading axis: the accepting worker's row has the event (tau < inf), every other row
    ``tau = inf``; ``proposals``/``rejections``/``violations`` count each worker's own.
    """
    spec, ref = cfg.spec, cfg.reference
    M = q.shape[0]
    lanes = (grad_args, q, l, lw, coords, rho, offset)

    def anchor(xs, vs, gs, sc, lane):
        args, q_i, l_i, lw_i, coords_i, _, offset_i = lane
        a, b = spec.anchor(xs, vs, gs, None, q_i, l_i, lw_i, coords_i, ref, False,
                           **_centre(cfg, offset_i, sc))
        if slope_fn is not None:
            b = b + slope_fn(xs, vs, *args) * coords_i
        return a, b * sc

    k_start, key = split_key(key)
    zero = jnp.zeros((), jnp.float64)
    a0, b0 = jax.vmap(lambda g, sc, lane: anchor(x0, v0, g, sc, lane))(gradients0, scale, lanes)
    t0, ch0, ex0 = jax.vmap(lambda k, a, b, r: next_bound_point(k, zero, a, b, r, cfg.has_excess))(
        split_key(k_start, M), a0, b0, rho)
    zM = jnp.zeros((M,), jnp.int32)
    initial = SuperpositionCarry(
        key=key, anchor_time=jnp.zeros((M,), jnp.float64), a=a0, b=b0,
        horizon_end=jnp.zeros((M,), jnp.float64) + cfg.horizon, scale=scale, next_time=t0,
        next_channel=ch0, next_excess=ex0, done=jnp.array(False), winner=jnp.int32(0),
        tau=zero + jnp.inf, kind=jnp.int32(0), channel=jnp.int32(0),
        gradient_at_event=gradients0[0], proposals=zM, rejections=zM, violations=zM,
        passes=jnp.int32(0))
    initial = batched_like(t0[0], initial)
    max_passes = cfg.max_thinning * M

    def searching(c: SuperpositionCarry):
        return ~c.done & (c.passes < max_passes)

    def body(c: SuperpositionCarry) -> SuperpositionCarry:
        key, k_choice, k_accept, k_next = split_key(c.key, 4)
        w, t_point = proposing_worker(k_choice, c.next_time)
        lane = jax.tree_util.tree_map(lambda leaf: leaf[w], lanes)
        s, a, b, hend, sc = c.anchor_time[w], c.a[w], c.b[w], c.horizon_end[w], c.scale[w]
        ch = c.next_channel[w]
        beyond = t_point > hend
        t_eval = jnp.where(beyond, hend, t_point)
        capped = ~(t_eval < cap)
        t_safe = jnp.where(jnp.isfinite(t_eval), t_eval, s)
        xe, ve = spec.flow(x0, v0, t_safe, ref)
        ge = grad_fn(xe, *lane[0])
        rate = spec.rate(xe, ve, ge, lane[4], ref)[ch]
        bound = jnp.maximum(a[ch] + b[ch] * (t_safe - s), 0.0)
        excess_first = c.next_excess[w]
        check = ~capped & ~beyond & ~excess_first
        tol = 1e-6 * (jnp.abs(a[ch]) + jnp.abs(b[ch]) * (t_safe - s)) + 1e-9
        violated = check & (rate > bound + tol)
        accept = check & ~violated & (uniform64(k_accept) * bound < rate)
        is_excess = ~capped & ~beyond & excess_first
        reanchor = ~capped & ~violated & ~accept & ~is_excess
        an, bn = anchor(xe, ve, ge, sc, lane)
        b_enlarged = jnp.where(b >= 0, 2.0 * b + 1e-12, 0.5 * b)
        a_w = jnp.where(reanchor, an, _enlarged_intercept(a, b, violated, offset is not None))
        b_w = jnp.where(reanchor, bn, jnp.where(violated, b_enlarged, b))
        s_w = jnp.where(reanchor, t_safe, s)
        # the worker's next point: from the new anchor (rejection, horizon) or, after a
        # violation, from its last anchor with the enlarged bound
        t_n, ch_n, ex_n = next_bound_point(k_next, s_w, a_w, b_w, lane[5], cfg.has_excess)
        event = accept | is_excess
        redraw = reanchor | violated
        onehot = jax.nn.one_hot(w, M, dtype=jnp.int32)
        return SuperpositionCarry(
            key=key,
            anchor_time=c.anchor_time.at[w].set(s_w),
            a=c.a.at[w].set(a_w), b=c.b.at[w].set(b_w),
            horizon_end=c.horizon_end.at[w].set(jnp.where(reanchor, t_safe + cfg.horizon, hend)),
            scale=c.scale.at[w].set(jnp.where(violated, 2.0 * sc, sc)),
            next_time=c.next_time.at[w].set(jnp.where(redraw, t_n, c.next_time[w])),
            next_channel=c.next_channel.at[w].set(jnp.where(redraw, ch_n, ch)),
            next_excess=c.next_excess.at[w].set(jnp.where(redraw, ex_n, excess_first)),
            done=capped | event,
            winner=w,
            tau=jnp.where(event, t_point, jnp.inf),
            kind=jnp.where(is_excess, EXCESS, 0).astype(jnp.int32),
            channel=ch,
            gradient_at_event=ge,
            proposals=c.proposals + onehot,
            rejections=c.rejections + onehot * (reanchor & ~beyond).astype(jnp.int32),
            violations=c.violations + onehot * violated.astype(jnp.int32),
            passes=c.passes + 1,
        )

    out = jax.lax.while_loop(searching, body, initial)
    mine = jnp.arange(M) == out.winner
    return WorkerProposal(
        tau=jnp.where(mine, out.tau, jnp.inf),
        kind=jnp.where(mine, out.kind, 0).astype(jnp.int32),
        channel=jnp.where(mine, out.channel, 0).astype(jnp.int32),
        gradient_at_event=jnp.where(mine[:, None], out.gradient_at_event, 0.0),
        scale=out.scale, proposals=out.proposals, rejections=out.rejections,
        violations=out.violations, overflow=mine & ~out.done)


def build(cfg: FedConfig, workers: Workers, prior: PriorPart, *, with_protocol: bool = False):
    """Kernels of the federated sampler: ``init(key, x0) -> FedState``,
    ``event_step(key, state, t_stop, counting) -> state`` (one server iteration of
    Algorithm 2/4) and ``draw_step(key, state) -> (state, draw, stats)`` (advance to
    the next sample time; the engine's per-chain step). With ``with_protocol=True`` a fourth
    item: the :class:`FedProtocol` pieces a distributed engine composes (``workers.data``
    and ``workers.mask`` are then read only by ``propose``, which takes one worker's slice).
    """
    spec, ref, d, M = cfg.spec, cfg.reference, cfg.dim, cfg.num_workers
    P = M + (1 if cfg.prior_worker else 0)
    all_coords = workers.coords
    if cfg.prior_worker:
        # on the host: an eager jnp.concatenate compiles three small programs in a new process
        coords_host = np.asarray(workers.coords)
        all_coords = device_array(np.concatenate([coords_host,
                                                  np.ones((1, d), coords_host.dtype)]))
    refresh_total = spec.refresh_total_rate(cfg.refresh_rate, d)

    def worker_potential_grad(data_gradient, x, g_ref_m, w_m, alpha_m):
        """Worker m's gradient from the one of its data potential: plus its prior share,
        minus its control-variate shift."""
        g = data_gradient + alpha_m * cfg.prior_grad(x)
        if cfg.control_variates:
            g = g - (g_ref_m + alpha_m * prior.g_ref - w_m * prior.g_total_ref)
        return g

    # jitted: its trace (the user's likelihood gradient) is made once and shared by every
    # call site (each worker's thinning loop, its first anchor, the rate diagnostics);
    # inlined, so that the arrays it closes over are the run program's, passed in
    # (cache.jit_with_constants_as_arguments)
    @functools.partial(jax.jit, inline=True)
    def data_worker_grad(x, data_m, mask_m, g_ref_m, w_m, alpha_m):
        return worker_potential_grad(cfg.data_grad(x, data_m, mask_m), x, g_ref_m, w_m, alpha_m)

    def prior_worker_grad(x):
        g = cfg.prior_grad(x)
        if cfg.control_variates:
            g = g - prior.g_ref
        return g

    def data_grads(x, alpha):
        """The M data workers' gradients at ``x`` (M, d)."""
        if cfg.workers_data_grad is not None:  # unequal clients: their own rows, no padding
            return every_worker_grad(jnp.broadcast_to(x, (M, d)), workers.data, workers.mask,
                                     workers.g_ref, workers.cv_weight, alpha)
        return jax.vmap(data_worker_grad, in_axes=(None, 0, 0, 0, 0, 0))(
            x, workers.data, workers.mask, workers.g_ref, workers.cv_weight, alpha)

    def all_grads(x, alpha):
        g = data_grads(x, alpha)
        if cfg.prior_worker:
            g = jnp.concatenate([g, prior_worker_grad(x)[None]])
        return g

    def plain_shift(alpha):
        """The control-variate shifts s_m (zero without control variates)."""
        if not cfg.control_variates:
            return jnp.zeros((P, d))
        s = workers.g_ref + alpha[:, None] * prior.g_ref - workers.cv_weight[:, None] * prior.g_total_ref
        if cfg.prior_worker:
            s = jnp.concatenate([s, prior.g_ref[None]])
        return s

    def init(key, x0) -> FedState:
        kv, kr, kd = split_key(key, 3)
        x0 = jnp.asarray(x0, jnp.float64)
        v0 = spec.init_velocity(kv, d, ref).astype(jnp.float64)
        K = max(cfg.skeleton_size, 1)
        zP = jnp.zeros((P,), jnp.int32)
        alpha0 = jnp.zeros((M,)) if cfg.prior_worker else workers.cv_weight
        return FedState(
            t=jnp.zeros((), jnp.float64), x=x0, v=v0,
            alpha=jnp.asarray(alpha0, jnp.float64),
            scale=jnp.ones((P,), jnp.float64),
            next_refresh=_exp_time(kr, refresh_total),
            next_redist=_exp_time(kd, cfg.redistribution_rate),
            n_draws=jnp.int32(0), events=zP, excess_events=zP,
            refreshes=jnp.int32(0), redistributions=jnp.int32(0), iterations=jnp.int32(0),
            thinning=zP, rejections=zP, violations=zP, overflow=jnp.array(False),
            sum_x=jnp.zeros((d,)), sum_xx=jnp.zeros((d, d)), kept_time=jnp.zeros(()),
            interval_x=jnp.zeros((d,)),
            sk_t=jnp.zeros((K,)), sk_x=jnp.zeros((K, d)), sk_v=jnp.zeros((K, d)),
            sk_n=jnp.int32(0),
        )

    def worker_offsets(cv_weight):
        """``|L^T G_m(x*)|`` per data worker (None without the Boomerang's constant bound): the
        shifted gradient at the centre is ``w_m grad(U - U_ref)(x*)`` (Remark 4.3's shift)."""
        if cfg.centre_distance is None:
            return None
        return cv_weight * jnp.linalg.norm(ref.chol.T @ prior.g_total_ref)

    def worker_whitened_bounds(lw, alpha):
        """The Boomerang's whitened Hessian bounds of the workers' potentials with their prior
        shares ``alpha`` (``PriorPart.lw_floor``)."""
        return jnp.maximum(alpha * prior.lw_floor, lw + alpha * prior.lw)

    def data_worker_slope(y, u, data_m, mask_m, g_ref_m, w_m, alpha_m):
        return cfg.custom_slope(y, u, cfg.horizon, data_m, mask_m)

    # traced once for its call sites (the first anchors, every thinning pass); inlined (above)
    @functools.partial(jax.jit, inline=True)
    def every_worker_grad(X, data, mask, g_ref, w, alpha):
        """``data_worker_grad`` of all M workers (in order) at the rows of ``X`` at once, the
        data part from ``cfg.workers_data_grad`` (no padded rows)."""
        return jax.vmap(worker_potential_grad)(cfg.workers_data_grad(X), X, g_ref, w, alpha)

    def propose_all(keys, x, v, cap, workers_: Workers, alpha, scale, stop_at_earliest,
                    all_workers=False):
        """Step 1 of Algorithm 2 for data workers side by side (leading axis of ``keys``,
        ``workers_``, ``alpha``, ``scale``): their :class:`WorkerProposal` rows.
        ``all_workers``: ``workers_`` are all M workers in order (their gradients may then
        come from ``cfg.workers_data_grad``)."""
        lanes_grad = None
        if all_workers and cfg.workers_data_grad is not None:
            lanes_grad = every_worker_grad
        return first_events(
            cfg, keys, x, v, cap, data_worker_grad,
            (workers_.data, workers_.mask, workers_.g_ref, workers_.cv_weight, alpha),
            workers_.q + alpha[:, None, None] * prior.q, workers_.l + alpha * prior.l,
            worker_whitened_bounds(workers_.lw, alpha), workers_.coords, workers_.rho, scale,
            slope_fn=None if cfg.custom_slope is None else data_worker_slope,
            stop_at_earliest=stop_at_earliest, lanes_grad=lanes_grad,
            offset=worker_offsets(workers_.cv_weight))

    def propose(key_m, x, v, cap, worker_m: Workers, alpha_m, scale_m):
        """Step 1 of Algorithm 2 for ONE data worker (client side): its first event time
        before ``cap`` from its own potential and data (``worker_m``: its slice of
        :class:`Workers`, data included). Returns its :class:`WorkerProposal`."""
        one = lambda leaf: jnp.asarray(leaf)[None]  # noqa: E731
        rows = propose_all(one(key_m), x, v, cap, jax.tree_util.tree_map(one, worker_m),
                           one(alpha_m), one(scale_m), stop_at_earliest=False)
        return jax.tree_util.tree_map(lambda leaf: leaf[0], rows)

    def event_keys(key):
        """The keys of one event iteration: ``(worker keys (M,), server key)``; worker m's
        proposal uses ``worker_keys[m]`` on every engine (identical random streams)."""
        kw = split_key(key, 7)[0]
        return split_key(kw, M), key

    def event_cap(st: FedState, t_stop):
        """The server's earliest own clock (refreshment, redistribution, next sample time),
        relative to ``st.t``: a worker's proposal later than this cannot win."""
        cap_abs = jnp.minimum(jnp.minimum(st.next_refresh, st.next_redist), t_stop)
        return cap_abs - st.t

    def superposed_step(key, st: FedState, t_stop, counting) -> FedState:
        """One server iteration with superposition thinning of the data workers' rates (the
        prior's own channels, if any, are added by ``apply_proposals`` as on every engine)."""
        cap = event_cap(st, t_stop)
        alpha = st.alpha
        res = superposed_first_event(
            cfg, split_key(key, 7)[0], st.x, st.v, cap, data_worker_grad,
            (workers.data, workers.mask, workers.g_ref, workers.cv_weight, alpha),
            workers.q + alpha[:, None, None] * prior.q, workers.l + alpha * prior.l,
            worker_whitened_bounds(workers.lw, alpha), workers.coords, workers.rho, st.scale[:M],
            data_grads(st.x, alpha),
            slope_fn=None if cfg.custom_slope is None else data_worker_slope,
            offset=worker_offsets(workers.cv_weight))
        return apply_proposals(key, st, res, t_stop, counting)

    def event_step(key, st: FedState, t_stop, counting) -> FedState:
        if cfg.thinning == "superposition" and not cfg.exact:
            return superposed_step(key, st, t_stop, counting)
        worker_keys, _ = event_keys(key)
        cap = event_cap(st, t_stop)
        # all workers of the chain side by side: a worker stops once another has proposed
        # an earlier event (the winner is the same as on the distributed engines)
        res = propose_all(worker_keys, st.x, st.v, cap, workers, st.alpha, st.scale[:M],
                          stop_at_earliest=True, all_workers=True)
        return apply_proposals(key, st, res, t_stop, counting)

    def apply_proposals(key, st: FedState, res: WorkerProposal, t_stop, counting) -> FedState:
        """Step 2 of Algorithm 2 (server side): add the prior's own proposal (if it has its
        own channels), take the earliest of all proposals and the server's clocks, and move
        the state (Algorithm 4's redistribution and the refreshment included)."""
        res = WorkerProposal(*res)  # a distributed engine gathers a plain tuple
        _, kp, kj, kr, kr2, ka, ka2 = split_key(key, 7)
        cap_abs = jnp.minimum(jnp.minimum(st.next_refresh, st.next_redist), t_stop)
        cap = cap_abs - st.t
        x, v = st.x, st.v
        if cfg.prior_worker:
            # the prior's own channels search up to the workers' earliest proposal: a later
            # one cannot win (on every engine: the server has all proposals by then)
            prior_cap = jnp.minimum(cap, jnp.min(res.tau))
            pres = first_events(
                cfg, kp[None], x, v, prior_cap, prior_worker_grad, (), prior.q[None],
                prior.l[None], prior.lw[None], jnp.ones((1, d)), jnp.zeros((1,)),
                st.scale[M:], stop_at_earliest=False,
                # its shifted gradient vanishes at the centre: grad U_0(x*) - grad U_0(x*)
                offset=None if cfg.centre_distance is None else jnp.zeros((1,)))
            res = jax.tree_util.tree_map(lambda r, p: jnp.concatenate([r, p]), res, pres)
        w = jnp.argmin(res.tau)
        tau = res.tau[w]
        event = tau < cap
        dt = jnp.where(event, tau, cap)
        x1, v1 = spec.flow(x, v, dt, ref)
        is_excess = res.kind[w] == EXCESS
        v_jump = spec.jump(kj, x1, v1, res.gradient_at_event[w], res.channel[w], ref)
        v_event = v_jump
        if cfg.has_excess:
            v_event = jnp.where(is_excess, spec.excess(kj, v1, all_coords[w], ref), v_jump)
        refresh_now = ~event & (st.next_refresh <= st.next_redist) & (st.next_refresh <= t_stop)
        redist_now = ~event & ~refresh_now & (st.next_redist <= t_stop)
        v_ref = spec.refresh(kr, v1, ref) if refresh_total > 0 else v1
        v_new = jnp.where(event, v_event, jnp.where(refresh_now, v_ref, v1))
        t_new = jnp.where(event, st.t + tau, cap_abs)
        next_refresh = jnp.where(refresh_now, t_new + _exp_time(kr2, refresh_total), st.next_refresh)
        next_redist = jnp.where(redist_now, t_new + _exp_time(ka2, cfg.redistribution_rate),
                                st.next_redist)
        alpha = st.alpha
        if cfg.redistribution_rate > 0:
            # Algorithm 4, line 6: new random shares alpha_m >= 0 summing to 1.
            alpha = jnp.where(redist_now, jax.random.dirichlet(ka, jnp.ones((M,))), alpha)

        first, second = spec.integrals(x, v, dt, ref)
        c = jnp.where(counting, 1.0, 0.0)
        onehot = jax.nn.one_hot(w, P, dtype=jnp.int32) * event.astype(jnp.int32)

        sk_t, sk_x, sk_v, sk_n = st.sk_t, st.sk_x, st.sk_v, st.sk_n
        if cfg.skeleton_size > 0:
            record = (event | refresh_now) & (sk_n < cfg.skeleton_size)
            i = jnp.minimum(sk_n, cfg.skeleton_size - 1)
            sk_t = jnp.where(record, sk_t.at[i].set(t_new), sk_t)
            sk_x = jnp.where(record, sk_x.at[i].set(x1), sk_x)
            sk_v = jnp.where(record, sk_v.at[i].set(v_new), sk_v)
            sk_n = sk_n + record.astype(jnp.int32)

        return st._replace(
            t=t_new, x=x1, v=v_new, alpha=alpha, scale=res.scale,
            next_refresh=next_refresh, next_redist=next_redist,
            events=st.events + onehot * (~is_excess).astype(jnp.int32),
            excess_events=st.excess_events + onehot * is_excess.astype(jnp.int32),
            refreshes=st.refreshes + refresh_now.astype(jnp.int32),
            redistributions=st.redistributions + redist_now.astype(jnp.int32),
            iterations=st.iterations + 1,
            thinning=st.thinning + res.proposals, rejections=st.rejections + res.rejections,
            violations=st.violations + res.violations,
            overflow=st.overflow | jnp.any(res.overflow),
            sum_x=st.sum_x + c * first, sum_xx=st.sum_xx + c * second,
            interval_x=st.interval_x + first,
            sk_t=sk_t, sk_x=sk_x, sk_v=sk_v, sk_n=sk_n,
        )

    def rates_from_gradients(x, v, g, alpha):
        """Instantaneous federated, plain (no control variates) and canonical rates, from
        the proposers' gradients ``g`` (P, d) at ``x``."""
        shift = plain_shift(alpha)
        per = jax.vmap(lambda gm, cm: jnp.sum(spec.rate(x, v, gm, cm, ref)))
        fed = jnp.sum(per(g, all_coords))
        plain = jnp.sum(per(g + shift, all_coords))
        canonical = jnp.sum(spec.rate(x, v, jnp.sum(g, axis=0), jnp.ones((d,)), ref))
        return fed, plain, canonical

    def prior_gradient_row(x):
        """The prior proposer's gradient as a (0 or 1, d) block to append to the workers'."""
        if cfg.prior_worker:
            return prior_worker_grad(x)[None]
        return jnp.zeros((0, d))

    def rates(x, v, alpha):
        return rates_from_gradients(x, v, all_grads(x, alpha), alpha)

    def draw_begin(st: FedState):
        """Start of a draw: the target time of the next draw, whether it is kept (past
        burn-in), the velocity changes so far, and the interval integral reset."""
        t_next = (st.n_draws + 1).astype(jnp.float64) * cfg.sample_interval
        counting = st.n_draws >= cfg.burn_in
        events_before = jnp.sum(st.events) + jnp.sum(st.excess_events) + st.refreshes
        return st._replace(interval_x=jnp.zeros((d,))), t_next, counting, events_before

    def draw_end(st: FedState, t_next, counting, events_before, rate_values=None):
        """End of a draw: the draw vector (position, interval mean) and its stats."""
        delta = cfg.sample_interval
        st = st._replace(
            n_draws=st.n_draws + 1,
            overflow=st.overflow | (st.t < t_next),
            kept_time=st.kept_time + jnp.where(counting, delta, 0.0),
        )
        events_after = jnp.sum(st.events) + jnp.sum(st.excess_events) + st.refreshes
        stats = {"events": (events_after - events_before).astype(jnp.int32)}
        if rate_values is not None:
            stats.update(zip(RATE_KEYS, rate_values))
        draw = jnp.concatenate([st.x, st.interval_x / delta])
        return st, draw, stats

    def draw_step(key, st: FedState):
        st, t_next, counting, events_before = draw_begin(st)

        def cond(carry):
            s, i = carry
            return (s.t < t_next) & (i < cfg.max_iterations_per_draw)

        def body(carry):
            s, i = carry
            return event_step(fold_in(key, i), s, t_next, counting), i + 1

        st, _ = jax.lax.while_loop(cond, body, batched_like(st.t, (st, jnp.int32(0))))
        rate_values = rates(st.x, st.v, st.alpha) if cfg.rate_diagnostics else None
        return draw_end(st, t_next, counting, events_before, rate_values)

    def silent_proposal(chains: int, scale_m) -> WorkerProposal:
        """What a dropped worker "proposes" for every chain: no event (tau = inf), its
        scale unchanged (NumPy arrays, as a distributed engine gathers them)."""
        zeros = np.zeros(chains, np.int32)
        return WorkerProposal(np.full(chains, np.inf), zeros, zeros, np.zeros((chains, d)),
                              np.asarray(scale_m), zeros, zeros, zeros,
                              np.zeros(chains, bool))

    # The pieces the distributed run (pdmp/distributed.py, engines/broadcast.py) composes in the
    # same order.
    protocol = FedProtocol(
        propose=propose, propose_all=propose_all, worker_gradient=data_worker_grad,
        event_keys=event_keys,
        event_cap=event_cap, apply_proposals=apply_proposals, draw_begin=draw_begin,
        draw_end=draw_end, prior_gradient_row=prior_gradient_row,
        rates_from_gradients=rates_from_gradients, silent_proposal=silent_proposal)
    if with_protocol:
        return init, event_step, draw_step, protocol
    return init, event_step, draw_step
