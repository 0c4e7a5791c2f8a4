"""The object every sampler returns, the errors that stop a run, and the one way a run ends.

:func:`finish_run` turns a family's chain run (``fedmcmc.engines.driver.ChainRun``, on any
engine) and its ``info`` into its :class:`Result` (:func:`assemble_result`), or raises the
error that stopped it, carrying that result: a client's failure
(:class:`ClientFailureError`), diverged chains (:class:`SamplingDivergedError`), or what
the family checks last (a PDMP's bound errors)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import jax
import numpy as np

PyTree = Any

__all__ = ["Result", "SamplingDivergedError", "ClientFailureError", "assemble_result",
           "divergence_details", "diverged_error", "client_failure_error", "finish_run"]


def flatten_names(tree: PyTree) -> Dict[str, np.ndarray]:
    """Name every leaf of a pytree by its key path (``w``, ``layer_0.bias``, ``x[1]``)."""
    named = {}
    leaves_with_paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in leaves_with_paths:
        if not path:
            name = "theta"
        else:
            parts = []
            for key in path:
                if isinstance(key, jax.tree_util.DictKey):
                    parts.append(str(key.key))
                elif isinstance(key, jax.tree_util.GetAttrKey):
                    parts.append(str(key.name))
                elif isinstance(key, jax.tree_util.SequenceKey):
                    parts.append(f"p{key.idx}")
                else:
                    parts.append(str(key).strip(".[]'\""))
            name = ".".join(parts)
        named[name] = np.asarray(leaf)
    return named


@dataclasses.dataclass
class Result:
    """Draws and run figures of one sampling run.

    Attributes
    ----------
    samples:
        Pytree with the structure of ``init``; each leaf has shape
        ``(chains, num_samples, *leaf_shape)``.
    info:
        Per-run figures: iterations, rounds, events, visits per client,
        messages and floats communicated, wall time, ...
    sample_stats:
        Optional per-draw arrays of shape ``(chains, num_samples)`` (for
        example the client a chain was on when the draw was taken).
    algorithm:
        Name of the algorithm that produced the draws.
    """

    samples: PyTree
    info: Dict[str, Any]
    sample_stats: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    algorithm: str = ""

    @property
    def num_chains(self) -> int:
        return int(jax.tree_util.tree_leaves(self.samples)[0].shape[0])

    @property
    def num_samples(self) -> int:
        return int(jax.tree_util.tree_leaves(self.samples)[0].shape[1])

    def flat_samples(self) -> np.ndarray:
        """Draws as one array of shape ``(chains, num_samples, dim)``."""
        leaves = jax.tree_util.tree_leaves(self.samples)
        chains, draws = leaves[0].shape[:2]
        return np.concatenate(
            [
                np.asarray(leaf).reshape(chains, draws, int(np.prod(leaf.shape[2:], dtype=int)))
                for leaf in leaves
            ],
            axis=-1,
        )

    def to_arviz(self):
        """ArviZ ``InferenceData`` with a posterior group (one variable per pytree leaf)
        and a sample_stats group; run figures go to the attributes."""
        import arviz as az

        posterior = flatten_names(self.samples)
        stats = {k: np.asarray(v) for k, v in self.sample_stats.items()}
        attrs = {"algorithm": self.algorithm}
        for key, value in self.info.items():
            if isinstance(value, (bool, np.bool_)):
                attrs[key] = int(value)  # NetCDF has no boolean attributes
            elif isinstance(value, (int, float, str, np.integer, np.floating)):
                attrs[key] = value.item() if hasattr(value, "item") else value
        return az.from_dict(
            posterior=posterior,
            sample_stats=stats or None,
            attrs=attrs,
        )

    def summary(self) -> str:
        """A short text summary: mean and sd of every scalar coordinate."""
        flat = self.flat_samples().reshape(-1, self.flat_samples().shape[-1])
        lines = [f"{self.algorithm}: {self.num_chains} chains x {self.num_samples} draws"]
        for i in range(min(flat.shape[1], 20)):
            lines.append(f"  theta[{i}]: mean {flat[:, i].mean():+.4f}  sd {flat[:, i].std():.4f}")
        return "\n".join(lines)


class SamplingDivergedError(RuntimeError):
    """A chain produced a non-finite or exploding state.

    ``result`` holds every draw made before the divergence (the diverged
    chain's later draws are NaN); ``chains`` lists the diverged chains and
    ``details`` says where each diverged (iteration, round, client ...).
    """

    def __init__(self, message: str, result: Optional[Result], chains, details) -> None:
        super().__init__(message)
        self.result = result
        self.chains = list(chains)
        self.details = details


class ClientFailureError(RuntimeError):
    """The run stopped because a client failed (``on_client_failure="stop"``).

    ``result`` holds every draw received before the failure (chains that had
    fewer draws than others are padded with NaN; ``result.info["draws_per_chain"]``
    says how many are real); ``client`` and ``reason`` say what failed.
    """

    def __init__(self, message: str, result, client: int, reason: str):
        super().__init__(message)
        self.result = result
        self.client = client
        self.reason = reason


def assemble_result(run, *, algorithm: str, unravel, info: Dict[str, Any], dim: int,
                    thin: Optional[int] = 1, burn_in: int = 0, start_draw: int = 0,
                    sample_stats: Optional[Dict[str, np.ndarray]] = None) -> Result:
    """The :class:`Result` of a driver run (``fedmcmc.engines.driver.ChainRun``), the same for
    every family and engine: the run figures every result has are added to ``info`` (a dict
    the caller owns, already holding the family's own figures, which win: a family that
    counts ``iterations`` its own way keeps its count), then the draws.

    ``unravel``: kept flat draws ``(chains, kept, draw_dim)`` -> the samples pytree.
    ``thin``: sampler iterations per draw; None where draws are not made of iterations
    (PDMPs: no ``iterations`` or ``seconds_per_iteration``). ``sample_stats``: the per-draw
    stats to keep (default: every stat of the run).
    """
    standard = dict(
        algorithm=algorithm,
        chains=int(run.diverged.shape[0]),
        draws_kept=int(run.draws.shape[1]),
        wall_time=run.wall_time,
        interrupted=run.interrupted,
        dim=int(dim),
    )
    if thin is not None:
        standard["iterations"] = int(run.draws_done * thin)
        if run.seconds_per_draw is not None:  # steady state, compilation excluded
            standard["seconds_per_iteration"] = run.seconds_per_draw / thin
    if start_draw:
        standard["start_draw"] = int(start_draw)
    if run.draws_per_chain is not None:  # chains stopped at different draws (a failure)
        standard["draws_per_chain"] = np.maximum(
            np.asarray(run.draws_per_chain) - burn_in, 0).tolist()
    for key, value in standard.items():
        info.setdefault(key, value)
    stats = run.stats if sample_stats is None else sample_stats
    return Result(samples=unravel(run.draws), info=info,
                  sample_stats={k: np.asarray(v) for k, v in stats.items()},
                  algorithm=algorithm)


def divergence_details(run, thin: Optional[int] = 1, stats=()) -> list:
    """Where each diverged chain of a driver run went wrong, the same keys for every family:
    ``chain``, ``draw`` (global index of its first bad draw), ``iteration`` (the sampler
    iteration that draw ends at; left out when ``thin`` is None: a PDMP's draws are not
    made of iterations) and the per-draw ``stats`` named (client, round ...) at that draw."""
    details = []
    for chain in np.nonzero(run.diverged)[0]:
        draw = int(run.first_bad_draw[chain])
        where = {"chain": int(chain), "draw": draw}
        if thin is not None:
            where["iteration"] = int((draw + 1) * thin)
        for name in stats:
            if name in run.bad_stats:
                value = run.bad_stats[name][chain]
                where[name] = value.item() if hasattr(value, "item") else value
        details.append(where)
    return details


def diverged_error(algorithm: str, result: Optional[Result], details: list, cause: str
                   ) -> SamplingDivergedError:
    """The :class:`SamplingDivergedError` of a run whose chains ``details``
    (:func:`divergence_details`) diverged, keeping ``result`` (the draws made before; None
    when there are too few to make one); ``cause``: what went wrong and what to change.
    Records ``info["diverged_chains"]``."""
    chains = [d["chain"] for d in details]
    if result is not None:
        result.info["diverged_chains"] = chains
    where = "; ".join(
        f"chain {d['chain']} " + (f"by iteration {d['iteration']}" if "iteration" in d
                                  else f"at draw {d['draw']}")
        + "".join(f", {k} {v}" for k, v in d.items()
                  if k not in ("chain", "draw", "iteration"))
        for d in details)
    return SamplingDivergedError(
        f"{algorithm}: {len(chains)} chain(s) stopped: {where}: {cause}. The draws made "
        "before are in error.result", result, chains, details)


def client_failure_error(name: str, label: str, run, result, role: str = "client",
                         detail: str = "") -> ClientFailureError:
    """The error of a run a client's failure stopped (``run.failure``), carrying ``result``
    (every draw made before it): the one message of every pattern. ``role``: what the
    pattern calls a client (``"worker"``, ``"agent"``); ``detail``: what the pattern adds
    (where the chains stopped, what would have continued)."""
    failure = run.failure
    return ClientFailureError(
        f"{name} (engine={label!r}): {role} {failure.client} failed ({failure.reason}); the "
        f"run stopped after {run.draws_done} draw(s), which are in error.result"
        + (f" ({detail})" if detail else ""), result, failure.client, failure.reason)


def finish_run(run, *, name: str, info: Dict[str, Any], dim: int, unravel,
               label: Optional[str] = None, thin: Optional[int] = 1, burn_in: int = 0,
               start_draw: int = 0, sample_stats=None, role: str = "client",
               failure_detail: str = "", divergence_stats=(),
               divergence_cause: str = "diverged (non-finite draws); lower step_size",
               divergence_error: Optional[Callable[[Result], Exception]] = None,
               checks: Optional[Callable[[Result], None]] = None) -> Result:
    """The end of every run, on every engine: its :class:`Result`
    (:func:`assemble_result` of the driver's ``run`` with ``info``: the family's figures,
    and on a message-passing engine the session's), or the error that stopped it, carrying
    that result, in this order:

    1. a client's failure (``run.failure``; :func:`client_failure_error`, ``role`` and
       ``failure_detail`` as there);
    2. diverged chains: ``divergence_error(result)`` where the family words its own, else
       :func:`diverged_error` with the per-draw ``divergence_stats`` and ``divergence_cause``
       (named ``"<name> (engine=<label>)"`` on a message-passing engine);
    3. ``checks(result)``: what the family checks last (raises its own errors).

    ``label``: the engine's (``None``: the in-process engine, whose runs have no client
    failures)."""
    result = assemble_result(run, algorithm=name, info=info, dim=dim, thin=thin,
                             burn_in=burn_in, start_draw=start_draw,
                             sample_stats=sample_stats, unravel=unravel)
    if run.failure is not None:
        raise client_failure_error(name, label, run, result, role, failure_detail)
    if run.diverged.any():
        if divergence_error is not None:
            raise divergence_error(result)
        raise diverged_error(name if label is None else f"{name} (engine={label!r})", result,
                             divergence_details(run, thin, divergence_stats), divergence_cause)
    if checks is not None:
        checks(result)
    return result
