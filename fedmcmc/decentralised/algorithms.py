"""Public classes of the decentralised family: ``DULA`` and ``GTDULA``.

Every client of the federation is an agent on a communication graph; all
agents of a chain live in one kernel state and every chain is vmapped in one
compiled loop (``engines.local.run_chains``). One iteration updates every
agent once; a draw is kept every ``thin`` iterations.

``result.samples`` is the network average (1/n) sum_i w_i; the agents' own
states are in ``result.info["agent_samples"]`` (shape
``(chains, num_samples, n_agents, *leaf_shape)`` per leaf), and
``result.sample_stats`` holds per draw the consensus error
(1/n) sum_i ||w_i - w_bar||^2 and, unless ``gradient_error=False``, the
gradient error ||d - 1 (x) u_bar|| of section 4.3 (for DULA, d_i is the exact
local gradient grad E_i(w_i), the direction DULA follows).

Checkpoint and resume (``supports_resume``, :mod:`fedmcmc.checkpoint`, local
engine): the chain state holds the agents' samples, the iteration counter (which
is also the position in the step-size schedule and its decay) and, for GT-DULA,
the gradient trackers and the last local gradient estimates; the initial states
are a function of the seed. A resumed run's ``info`` counts iterations, rounds
and messages from draw 0; ``info["agent_samples"]`` holds the agents' draws
of this call only (from global draw ``max(start_draw, burn_in)``, recorded in
``info["agent_samples_first_draw"]``): ``fedmcmc run`` stitches the network
average, not the agents' draws.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np

from ..algorithm import Algorithm, check_positive_float, check_positive_int
from ..checkpoint import restore_states, split_run_options
from ..engines.local import default_chunk_size, run_chains
from ..schedules import as_schedule
from ..results import Result, SamplingDivergedError
from . import graphs as graph_module
from . import kernels

__all__ = ["DULA", "GTDULA"]


def _check_step_size(step_size: Any) -> Any:
    if callable(step_size):
        return step_size
    check_positive_float(step_size, "step_size")
    return float(step_size)


def _check_graph(graph: Any) -> Any:
    if isinstance(graph, str):
        if graph not in graph_module.GRAPH_NAMES:
            raise ValueError(
                f"graph must be one of {graph_module.GRAPH_NAMES} or a networkx graph, got {graph!r}"
            )
        return graph
    if isinstance(graph, nx.Graph):
        graph_module.check_graph(graph)
        return graph
    raise ValueError(
        f"graph must be one of {graph_module.GRAPH_NAMES} or a networkx graph, "
        f"got {type(graph).__name__}"
    )


def decaying_schedule(step_size: Any, decay_every: Optional[int], decay_factor: float):
    schedule = as_schedule(step_size)
    if decay_every is None:
        return schedule
    every = int(decay_every)

    def decayed(t):
        return schedule(t) * jnp.asarray(decay_factor, jnp.float32) ** (t // every)

    return decayed


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


def _chunk_size(total: int) -> int:
    """A chunk length that divides ``total`` when one is near the engine's default, so the
    compiled chunk is built once (a shorter last chunk would compile a second program)."""
    target = default_chunk_size(total)
    for size in range(min(total, 2 * target), max(target // 2, 1) - 1, -1):
        if total % size == 0:
            return size
    return target


class _Decentralised(Algorithm):
    tracking: bool = False
    #: "ray": one Ray actor per agent, neighbour exchange actor to actor (``engines/neighbour.py``)
    engines = ("local", "ray")
    divergence_threshold: float = 1e10
    #: accepts the generic run options of ``fedmcmc.checkpoint.RUN_OPTIONS`` on the local
    #: engine (on engine="ray" the callbacks are accepted but not called, and resuming is
    #: refused: see ``engines/options.check_engine_options``)
    supports_resume: bool = True

    def _common(
        self,
        step_size,
        beta,
        graph,
        batch_size,
        graph_options,
        condition,
        decay_every,
        decay_factor,
        noise,
        gradient_error,
        keep_agent_samples,
    ):
        self.step_size = _check_step_size(step_size)
        self.beta = check_positive_float(beta, "beta")
        self.graph = _check_graph(graph)
        if batch_size is not None:
            batch_size = check_positive_int(batch_size, "batch_size")
        self.batch_size = batch_size
        if graph_options is not None and not isinstance(graph_options, Mapping):
            raise ValueError(f"graph_options must be a dict, got {type(graph_options).__name__}")
        self.graph_options = dict(graph_options or {})
        if condition not in ("warn", "raise", "ignore"):
            raise ValueError(f"condition must be 'warn', 'raise' or 'ignore', got {condition!r}")
        self.condition = condition
        if decay_every is not None:
            decay_every = check_positive_int(decay_every, "decay_every")
        self.decay_every = decay_every
        factor = check_positive_float(decay_factor, "decay_factor")
        if factor > 1:
            raise ValueError(f"decay_factor must be in (0, 1], got {decay_factor!r}")
        self.decay_factor = factor
        self.noise = bool(noise)
        self.gradient_error = bool(gradient_error)
        self.keep_agent_samples = bool(keep_agent_samples)

    # ------------------------------------------------------------- building
    def topology(self, num_agents: int) -> graph_module.Topology:
        """The checked communication graph for ``num_agents`` agents (one per client)."""
        return graph_module.topology(self.graph, num_agents, self.graph_options)

    def _check_batch(self, federation) -> None:
        if self.batch_size is not None:
            smallest = int(federation.sizes.min())
            if self.batch_size > smallest:
                raise ValueError(
                    f"batch_size={self.batch_size} is larger than the smallest agent's data "
                    f"({smallest} examples)"
                )

    def _gamma(self):
        return None

    def _kernel(self, local_gradient, mix, schedule, n):  # pragma: no cover - interface
        raise NotImplementedError

    def _init_state(self, key, positions, local_gradient):  # pragma: no cover - interface
        raise NotImplementedError

    # --------------------------------------------------------------- sample
    def sample(self, model, federation, *, init, num_samples, burn_in, thin, chains, seed,
               engine, progress, **options):
        if engine == "ray":
            from ..engines.neighbour import sample_decentralised

            return sample_decentralised(
                self, model, federation, init=init, num_samples=num_samples, burn_in=burn_in,
                thin=thin, chains=chains, seed=seed, progress=progress, **options,
            )
        run_options = split_run_options(options, self.name)
        if engine != "local":
            raise ValueError(f"engine={engine!r} is not available for {self.name}; use 'local'")
        n = federation.num_clients
        topo = self.topology(n)
        self._check_batch(federation)
        problems = graph_module.check_condition_1(
            topo, self.beta, self._gamma(), self.condition, stacklevel=4
        )

        flat_model = model.flatten(init)
        dim = flat_model.dim
        padded = federation.padded()
        local_gradient = kernels.local_gradient_fn(flat_model, padded, self.batch_size)
        full_gradient = kernels.full_gradient_fn(flat_model, padded)
        mix = topo.mixer()
        schedule = decaying_schedule(self.step_size, self.decay_every, self.decay_factor)
        step = self._kernel(local_gradient, mix, schedule, n)

        theta0 = flat_model.ravel(init)
        positions = jnp.broadcast_to(theta0, (n, dim))
        key = jax.random.key(seed)
        init_keys = jax.random.split(jax.random.fold_in(key, 2**20), chains)
        states = jax.jit(jax.vmap(lambda k: self._init_state(k, positions, local_gradient)))(
            init_keys
        )
        start_draw = run_options.pop("start_draw", 0)
        resume_state = run_options.pop("resume_state", None)
        if resume_state is not None:
            states = restore_states(states, resume_state)
        # A chunk length that divides the run (one compiled program) unless the caller sets one.
        chunk_size = run_options.pop("chunk_size", None) or _chunk_size(burn_in + num_samples)
        on_draws = run_options.pop("on_draws", None)
        if on_draws is not None:
            # The engine's draws are (network average[, every agent]): pass on result.samples.
            def average_only(draws, stats, first_index, _user=on_draws):
                _user(draws[..., :dim], stats, first_index)

            run_options["on_draws"] = average_only
        track = self.gradient_error
        keep_agents = self.keep_agent_samples
        tracking = self.tracking

        def draw_step(key, state):
            keys = jax.random.split(key, thin)
            state, _ = jax.lax.scan(lambda s, k: (step(k, s), None), state, keys)
            w = state.position
            stats = {"consensus_error": kernels.consensus_error(w)}
            if track:
                directions = state.tracker if tracking else full_gradient(w)
                stats["gradient_error"] = kernels.tracking_error(directions, w, full_gradient)
            # the kept draw carries every agent (and so does the divergence check);
            # without agent samples only the average (a diverging agent makes it non-finite)
            draw = jnp.mean(w, axis=0)
            if keep_agents:
                draw = jnp.concatenate([draw, w.reshape(-1)])
            return state, draw, stats

        run = run_chains(
            draw_step,
            states,
            key,
            burn_in=burn_in,
            num_samples=num_samples,
            position=lambda s: jnp.mean(s.position, 0) if not keep_agents else jnp.concatenate(
                [jnp.mean(s.position, 0), s.position.reshape(-1)]
            ),
            divergence_threshold=self.divergence_threshold,
            progress=progress,
            label=self.name,
            iterations_per_draw=thin,
            chunk_size=chunk_size,
            start_draw=start_draw,
            **run_options,
        )
        draws = np.asarray(run.draws)
        kept = draws.shape[1]
        average = draws[:, :, :dim]
        agents = draws[:, :, dim:].reshape(chains, kept, n, dim) if keep_agents else None
        samples = unravel_draws_numpy(flat_model, average)
        iterations = run.draws_done * thin
        floats_per_message = dim * (2 if self.tracking else 1)
        directed_edges = 2 * topo.num_edges
        info = {
            "algorithm": self.name,
            "step_size": self.step_size if not callable(self.step_size)
            else getattr(self.step_size, "__name__", "schedule"),
            "beta": self.beta,
            "batch_size": self.batch_size if self.batch_size is not None else "full",
            "decay_every": self.decay_every if self.decay_every is not None else 0,
            "decay_factor": self.decay_factor,
            "chains": chains,
            "iterations": iterations,
            "draws_kept": int(kept),
            "wall_time": run.wall_time,
            "interrupted": run.interrupted,
            "dim": dim,
            "mixing": "dense" if topo.use_dense() else "edge_list",
            "condition_1": problems,
            # one communication round per iteration: every agent sends its state (w_i, and
            # d_i for GT-DULA) to each neighbour, all chains' in one message per directed
            # edge, as the Ray engine's agents do
            "rounds": iterations,
            "messages": int(iterations * directed_edges),
            "messages_between_agents": int(iterations * directed_edges),
            "floats_communicated": int(iterations * directed_edges * floats_per_message * chains),
        }
        info.update(topo.describe())
        gamma = self._gamma()
        if run.seconds_per_draw is not None:  # steady state, compilation excluded
            info["seconds_per_iteration"] = run.seconds_per_draw / thin
        if gamma is not None:
            info["gamma"] = gamma
        if self.keep_agent_samples:
            info["agent_samples"] = unravel_draws_numpy(flat_model, agents)
        if start_draw:
            info["start_draw"] = int(start_draw)
            if self.keep_agent_samples:
                info["agent_samples_first_draw"] = int(max(start_draw, burn_in))
        stats = {k: np.asarray(v) for k, v in run.stats.items()}
        result = Result(samples=samples, info=info, sample_stats=stats, algorithm=self.name)
        if run.diverged.any():
            details = [
                {"chain": int(c), "iteration": int((run.first_bad_draw[c] + 1) * thin)}
                for c in np.nonzero(run.diverged)[0]
            ]
            info["diverged_chains"] = [d["chain"] for d in details]
            text = "; ".join(f"chain {d['chain']} by iteration {d['iteration']}" for d in details)
            raise SamplingDivergedError(
                f"{self.name}: {len(details)} chain(s) diverged (an agent's state became "
                f"non-finite or exceeded {self.divergence_threshold:g}): {text}. The draws made "
                "before are in error.result; lower step_size or beta"
                + (" / gamma" if self.tracking else "")
                + (f" (Condition 1: {'; '.join(problems)})" if problems else ""),
                result,
                info["diverged_chains"],
                details,
            )
        return result


_COMMON_DOC = """
    step_size:
        The paper's alpha > 0 (drift alpha * n * ..., noise sqrt(2 alpha n) v_i),
        or a schedule ``k -> alpha_k`` such as
        ``fm.schedules.piecewise_constant([1000, 2000], [1e-4, 1e-5, 1e-6])``.
    beta:
        Consensus step size of the samples, W_beta = I - beta L.
    graph:
        ``"ring"`` (default), ``"path"``, ``"star"``, ``"complete"``, ``"grid"``,
        ``"torus"``, ``"erdos_renyi"``, ``"exponential"``, or any connected
        ``networkx`` graph with one node per client (agent i = i-th node).
    batch_size:
        ``None`` (default): full-batch local gradients. Otherwise m rows per
        agent and iteration, drawn with replacement; the likelihood gradient is
        scaled by 1/f_i = M_i/m. At most the smallest client's size.
    graph_options:
        Options of named graphs: ``shape`` (grid, torus), ``p``, ``seed``
        (erdos_renyi).
    condition:
        What to do when (beta, gamma) break Condition 1 or make a mixing step
        unstable: ``"warn"`` (default), ``"raise"`` (``ValueError``) or ``"ignore"``.
    decay_every, decay_factor:
        Multiply the step size by ``decay_factor`` (default 0.1, the paper's
        reductions) every ``decay_every`` iterations; ``None`` keeps it constant.
    gradient_error:
        Record the gradient error per draw (costs one full-data gradient of
        every agent per draw, two for DULA); the consensus error is always recorded.
    keep_agent_samples:
        Keep every agent's draws in ``info["agent_samples"]`` (default True).
    noise:
        Inject the Langevin noise (False gives the deterministic consensus
        gradient method, for debugging).
"""


class DULA(_Decentralised):
    __doc__ = (
        """Decentralised unadjusted Langevin algorithm (Parayil et al. 2020), equation (3)
    of the GT-DULA paper:

    ``w_i <- w_i - beta sum_{j in N_i} (w_i - w_j) - alpha n g_hat_i(w_i) + sqrt(2 alpha n) v_i``.

    Parameters
    ----------"""
        + _COMMON_DOC
    )

    name = "DULA"
    tracking = False

    def __init__(
        self,
        step_size,
        beta: float,
        graph: Any = "ring",
        *,
        batch_size: Optional[int] = None,
        graph_options: Optional[Mapping[str, Any]] = None,
        condition: str = "warn",
        decay_every: Optional[int] = None,
        decay_factor: float = 0.1,
        noise: bool = True,
        gradient_error: bool = True,
        keep_agent_samples: bool = True,
    ):
        self._common(step_size, beta, graph, batch_size, graph_options, condition,
                     decay_every, decay_factor, noise, gradient_error, keep_agent_samples)

    def _kernel(self, local_gradient, mix, schedule, n):
        return kernels.dula_kernel(local_gradient, mix, self.beta, schedule, n, self.noise)

    def _init_state(self, key, positions, local_gradient):
        return kernels.dula_init(positions)


class GTDULA(_Decentralised):
    __doc__ = (
        """Gradient-tracking DULA, equations (4)-(8) of Bhar, Bai, George, Busart (2025):

    ``w_{k+1} = W_beta w_k - alpha n d_k + sqrt(2 alpha n) v_k``,
    ``d_{k+1} = W_gamma d_k + g_hat_{k+1} - g_hat_k``, ``d_0 = g_hat_0``.

    Parameters
    ----------
    gamma:
        Consensus step size of the gradient trackers, W_gamma = I - gamma L
        (Condition 1: gamma <= min(beta, 1/lambda_2))."""
        + _COMMON_DOC
    )

    name = "GTDULA"
    tracking = True

    def __init__(
        self,
        step_size,
        beta: float,
        gamma: float,
        graph: Any = "ring",
        *,
        batch_size: Optional[int] = None,
        graph_options: Optional[Mapping[str, Any]] = None,
        condition: str = "warn",
        decay_every: Optional[int] = None,
        decay_factor: float = 0.1,
        noise: bool = True,
        gradient_error: bool = True,
        keep_agent_samples: bool = True,
    ):
        self._common(step_size, beta, graph, batch_size, graph_options, condition,
                     decay_every, decay_factor, noise, gradient_error, keep_agent_samples)
        self.gamma = check_positive_float(gamma, "gamma")

    def _gamma(self):
        return self.gamma

    def _kernel(self, local_gradient, mix, schedule, n):
        return kernels.gtdula_kernel(
            local_gradient, mix, self.beta, self.gamma, schedule, n, self.noise
        )

    def _init_state(self, key, positions, local_gradient):
        return kernels.gtdula_init(key, positions, local_gradient)
