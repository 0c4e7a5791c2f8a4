"""Checkpoint and resume of chain runs, generic over algorithm families.

The local engine keys draw ``i`` by ``fold_in(key, i)``, so a run restarted at
draw ``start_draw`` from the chain states saved there makes exactly the draws
an uninterrupted run makes. Families that run on
:func:`fedmcmc.engines.local.run_chains` opt in by accepting the *run options*
below in ``algorithm.sample_local(..., **options)`` (see ``split_run_options``) and
setting the class attribute ``supports_resume = True``:

``start_draw``
    global index of the first draw to make (burn-in included);
``resume_state``
    the chain states at ``start_draw`` (leading chain axis), as the pytree the
    algorithm builds or as its list of leaves (what :class:`Checkpointer` saves);
``on_chunk(states, draws_done)`` / ``on_draws(draws, stats, first_index)``
    engine callbacks after every chunk (``run_chains`` documents them);
``chunk_size``
    draws per compiled chunk (checkpoint granularity).

A resumed run's :class:`~fedmcmc.results.Result` holds only the draws it made;
``info["start_draw"]`` records where it started. :class:`Checkpointer`
collects the draws, the states and the figures needed to stitch the pieces
back together, and writes them atomically to one ``.npz`` file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "RUN_OPTIONS",
    "split_run_options",
    "restore_states",
    "resume_from",
    "states_to_numpy",
    "Checkpointer",
    "load_checkpoint",
]

RUN_OPTIONS = ("start_draw", "resume_state", "on_chunk", "on_draws", "chunk_size")


def split_run_options(options: Dict[str, Any], name: str) -> Dict[str, Any]:
    """Check that ``options`` holds only generic run options; return them.

    Raises ``ValueError`` naming any unknown option or invalid value.
    """
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown options for {name}: {unknown}; run options are {list(RUN_OPTIONS)}"
        )
    out = dict(options)
    start = out.get("start_draw", 0)
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"start_draw must be a non-negative integer, got {start!r}")
    out["start_draw"] = int(start)
    chunk = out.get("chunk_size")
    if chunk is not None and (
        isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1
    ):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk!r}")
    for callback in ("on_chunk", "on_draws"):
        if out.get(callback) is not None and not callable(out[callback]):
            raise ValueError(f"{callback} must be callable")
    if out.get("resume_state") is not None and out["start_draw"] == 0:
        raise ValueError("resume_state needs start_draw: the draw index the states belong to")
    return out


def _is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def states_to_numpy(states) -> list:
    """Leaves of a chain-state pytree as numpy arrays (typed PRNG keys as their key data)."""
    out = []
    for leaf in jax.tree_util.tree_leaves(states):
        if _is_key(leaf):
            out.append(np.asarray(jax.random.key_data(leaf)))
        else:
            out.append(np.asarray(leaf))
    return out


def resume_from(run_options: dict, fresh_states):
    """Pop the resume options from ``run_options`` (a dict the caller owns): returns
    ``(states, start_draw)``, the saved ``resume_state`` put into the structure of
    ``fresh_states`` (:func:`restore_states`) when there is one, else ``fresh_states``."""
    start_draw = run_options.pop("start_draw", 0)
    resume_state = run_options.pop("resume_state", None)
    if resume_state is not None:
        return restore_states(fresh_states, resume_state), start_draw
    return fresh_states, start_draw


def restore_states(template, saved):
    """Put saved leaves into the structure of ``template`` (the freshly built chain states).

    ``saved`` is a pytree with the same leaves or a list of arrays. Raises
    ``ValueError`` naming ``resume_state`` when the number, shapes or dtypes disagree
    (a checkpoint of a different algorithm, chain count or model).
    """
    template_leaves, structure = jax.tree_util.tree_flatten(template)
    # a list (or plain tuple) of leaves as a checkpoint stores them; any other pytree, a
    # NamedTuple state included, is flattened first
    is_leaf_list = isinstance(saved, list) or (isinstance(saved, tuple)
                                               and not hasattr(saved, "_fields"))
    saved_leaves = saved if is_leaf_list else jax.tree_util.tree_leaves(saved)
    if len(saved_leaves) != len(template_leaves):
        raise ValueError(
            f"resume_state has {len(saved_leaves)} leaves, the algorithm's state has "
            f"{len(template_leaves)}: the checkpoint belongs to a different algorithm"
        )
    restored = []
    for index, (want, got) in enumerate(zip(template_leaves, saved_leaves)):
        if _is_key(want):
            data = np.asarray(got) if not _is_key(got) else np.asarray(jax.random.key_data(got))
            expected = jax.random.key_data(want).shape
            if data.shape != expected:
                raise ValueError(
                    f"resume_state leaf {index}: key data of shape {data.shape}, expected {expected}"
                )
            restored.append(jax.random.wrap_key_data(jnp.asarray(data)))
            continue
        got = np.asarray(got)
        if got.shape != want.shape:
            raise ValueError(
                f"resume_state leaf {index} has shape {got.shape}, expected {want.shape} "
                "(a different number of chains or parameters)"
            )
        restored.append(jnp.asarray(got, dtype=want.dtype))
    return jax.tree_util.tree_unflatten(structure, restored)


class Checkpointer:
    """Collects a run's draws and latest chain states; writes them every ``every`` chunks.

    Pass :meth:`run_options` to ``fm.sample`` (as ``**options``). On Ctrl-C or an
    error, call :meth:`write` to save what is consistent so far: the draws with
    global index below the saved states' ``draws_done``.

    Parameters
    ----------
    path:
        The ``.npz`` file to write (atomically: temporary file then rename).
    every:
        Chunks between two writes (0: only when :meth:`write` is called).
    meta:
        JSON-serialisable facts stored beside the arrays (config hash, labels).
    previous:
        A loaded checkpoint (:func:`load_checkpoint`) this run continues.
    """

    def __init__(self, path, every: int = 1, meta: Optional[dict] = None, previous=None,
                 chunk_size: Optional[int] = None, after_write=None):
        self.path = Path(path)
        self.every = int(every)
        self.meta = dict(meta or {})
        self.chunk_size = chunk_size
        self.after_write = after_write
        self._chunks = 0
        self.writes = 0
        if previous is not None:
            self.states = previous["states"]
            self.draws_done = int(previous["draws_done"])
            has_draws = previous["draws"].shape[1] > 0
            self.first_index = int(previous["first_index"]) if has_draws else None
            self.draws = [previous["draws"]] if has_draws else []
            self.stats = [previous["stats"]] if has_draws else []
            self.start_draw = self.draws_done
        else:
            self.states = None
            self.draws_done = 0
            self.first_index = None
            self.draws, self.stats = [], []
            self.start_draw = 0

    # ----------------------------------------------------------- callbacks
    def on_draws(self, draws, stats, first_index):
        if self.first_index is None:
            self.first_index = int(first_index)
        self.draws.append(np.asarray(draws))
        self.stats.append({k: np.asarray(v) for k, v in stats.items()})

    def on_chunk(self, states, draws_done):
        self.states = states_to_numpy(states)
        self.draws_done = int(draws_done)
        self._chunks += 1
        if self.every and self._chunks % self.every == 0:
            self.write()

    def run_options(self) -> dict:
        options = {"on_draws": self.on_draws, "on_chunk": self.on_chunk}
        if self.chunk_size:
            options["chunk_size"] = int(self.chunk_size)
        if self.start_draw:
            options["start_draw"] = self.start_draw
            options["resume_state"] = self.states
        return options

    # -------------------------------------------------------------- output
    def kept(self):
        """Draws (chains, k, dim) and stats made before ``draws_done`` (consistent with the states)."""
        if not self.draws:
            return None, {}
        draws = np.concatenate(self.draws, axis=1)
        stats = {
            k: np.concatenate([s[k] for s in self.stats], axis=1) for k in self.stats[0]
        } if self.stats and self.stats[0] else {}
        keep = max(0, self.draws_done - self.first_index)
        return draws[:, :keep], {k: v[:, :keep] for k, v in stats.items()}

    def write(self) -> Optional[Path]:
        if self.states is None:
            return None
        draws, stats = self.kept()
        if draws is None:
            draws = np.zeros((self.states[0].shape[0], 0, 0))
        arrays = {f"state_{i}": leaf for i, leaf in enumerate(self.states)}
        arrays.update({f"stat_{k}": v for k, v in stats.items()})
        arrays["draws"] = draws
        meta = dict(self.meta)
        meta.update(
            draws_done=self.draws_done,
            first_index=self.first_index if self.first_index is not None else self.draws_done,
            num_state_leaves=len(self.states),
        )
        arrays["meta"] = np.asarray(json.dumps(meta))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, self.path)
        self.writes += 1
        if self.after_write is not None:
            self.after_write(self)
        return self.path


def load_checkpoint(path) -> dict:
    """Read a :class:`Checkpointer` file: ``states`` (list), ``draws``, ``stats``, ``meta``..."""
    with np.load(Path(path), allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        states = [data[f"state_{i}"] for i in range(meta["num_state_leaves"])]
        stats = {k[len("stat_"):]: data[k] for k in data.files if k.startswith("stat_")}
        draws = data["draws"]
    return {
        "states": states,
        "draws": draws,
        "stats": stats,
        "meta": meta,
        "draws_done": meta["draws_done"],
        "first_index": meta["first_index"],
    }
