"""Compiled programs kept on disk, so a new process does not compile them again.

Almost all of a small ``fm.sample``'s time in a fresh process is XLA compilation. ``import
fedmcmc`` therefore switches on JAX's persistent compilation cache under the user's cache
directory::

    $FEDMCMC_CACHE_DIR/jax            if FEDMCMC_CACHE_DIR is set (it also moves reference caches)
    $XDG_CACHE_HOME/fedmcmc/jax       else, if XDG_CACHE_HOME is set
    ~/.cache/fedmcmc/jax              else

and caches every compiled program, however quick it was to compile (JAX's own default keeps
only programs that took a second or more, which leaves out the many small programs a sampler's
set-up compiles). Every process on a machine shares the directory: the Ray engine's client
actors import fedmcmc, so actors of the same shapes compile once per node, not once per actor
(actors that start at once take turns through :func:`first_on_node`: the first compiles, the
others then read its programs).

The cache is left alone when the user configured JAX's (``JAX_COMPILATION_CACHE_DIR``,
``jax.config.update("jax_compilation_cache_dir", ...)`` before ``import fedmcmc``, or
``JAX_ENABLE_COMPILATION_CACHE=0``). ``FEDMCMC_COMPILATION_CACHE=0`` in the environment opts
out (also in Ray actors started from that environment); :func:`disable` and :func:`enable`
switch it in a running process; :func:`clear` (or deleting the directory) empties it. When the
directory cannot be written, importing fedmcmc warns once (:class:`CompilationCacheWarning`) and
runs without the cache.

An entry's key is a hash of the program (its StableHLO), the compile options, XLA flags, the
JAX/jaxlib version and the platform, so a stale entry is never used: a changed model, shape,
dtype or library version is a different key. Draws are the same with and without the cache (a
cached entry is the very executable the compiler produced). As JAX warns, the directory is
trusted: do not point it at a directory other users can write.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import pickle
import socket
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Sequence

try:  # POSIX; elsewhere first_on_node does not wait
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache as _jax_cache
from jax.extend import core as _jax_core

__all__ = [
    "CompilationCacheWarning",
    "default_directory",
    "directory",
    "enable",
    "disable",
    "clear",
    "configure_default",
    "first_on_node",
    "FIRST_ON_NODE_FOLDER",
    "node_slot",
    "NODE_SLOTS_FOLDER",
    "jit_with_constants_as_arguments",
]

#: folder of :func:`first_on_node`'s lock and marker files, inside the cache directory
FIRST_ON_NODE_FOLDER = "first-on-node"
#: folder of :func:`node_slot`'s lock files, inside the cache directory
NODE_SLOTS_FOLDER = "node-slots"

#: Environment variable that opts out of the cache: ``0``, ``false``, ``no`` or ``off``.
ENVIRONMENT_SWITCH = "FEDMCMC_COMPILATION_CACHE"
_OFF = {"0", "false", "no", "off"}
_ON = {"", "1", "true", "yes", "on"}
# JAX's own environment variables; a user who set one configured the cache themselves
_JAX_DIRECTORY_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_JAX_MIN_TIME_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# the file suffixes JAX's file cache (jax._src.lru_cache) writes: one entry, its access time
_ENTRY_SUFFIXES = ("-cache", "-atime")

_warned = False


class CompilationCacheWarning(UserWarning):
    """The compilation cache could not be used; fedmcmc runs on without it."""


def default_directory() -> Path:
    """Where fedmcmc keeps compiled programs when the user has not said otherwise.

    ``$FEDMCMC_CACHE_DIR/jax``, else ``$XDG_CACHE_HOME/fedmcmc/jax``, else
    ``~/.cache/fedmcmc/jax`` (the cache directory of the project's contract).
    """
    base = os.environ.get("FEDMCMC_CACHE_DIR")
    if base:
        return Path(base).expanduser() / "jax"
    xdg = os.environ.get("XDG_CACHE_HOME")
    # the XDG specification ignores a relative path
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "fedmcmc" / "jax"
    return Path.home() / ".cache" / "fedmcmc" / "jax"


def directory() -> Path | None:
    """The directory compiled programs are read from and written to now, or None when off."""
    path = jax.config.jax_compilation_cache_dir
    if not path or not jax.config.jax_enable_compilation_cache:
        return None
    return Path(path)


def _writable(path: Path) -> OSError | None:
    """None when ``path`` (created if missing) takes a new file; otherwise the error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as error:
        return error
    return None


def _switch_on(path: Path, min_compile_time: float | None) -> None:
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_enable_compilation_cache", True)
    if min_compile_time is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time))


def enable(path: str | os.PathLike | None = None, *, min_compile_time: float = 0.0) -> Path:
    """Switch the persistent cache on in this process, at ``path`` (default :func:`default_directory`).

    ``min_compile_time``: programs that took less (seconds) to compile are not written (0: all).
    Takes effect for the next compilation, also when another directory was in use before.
    Raises ValueError naming ``path`` when it cannot be written. Returns the directory.
    """
    if isinstance(min_compile_time, bool) or not isinstance(min_compile_time, (int, float)) \
            or not min_compile_time >= 0:
        raise ValueError(f"min_compile_time must be a number >= 0, got {min_compile_time!r}")
    target = default_directory() if path is None else Path(path).expanduser()
    error = _writable(target)
    if error is not None:
        raise ValueError(f"path {str(target)!r} cannot be used as a compilation cache: {error}")
    _switch_on(target, min_compile_time)
    # JAX opens its cache once per process, at the first compilation; start again so the
    # next compilation opens this directory
    _jax_cache.reset_cache()
    return target


def disable() -> None:
    """Stop reading and writing compiled programs on disk in this process.

    Sets JAX's ``jax_enable_compilation_cache`` to False, so it also stops a cache the user
    configured; :func:`enable` switches it on again. Other processes (Ray actors included) are
    not affected: set ``FEDMCMC_COMPILATION_CACHE=0`` in their environment for that.
    """
    jax.config.update("jax_enable_compilation_cache", False)
    _jax_cache.reset_cache()


def clear(path: str | os.PathLike | None = None) -> int:
    """Delete the cached programs in ``path`` (default :func:`default_directory`).

    Removes only the files JAX's cache writes there (``*-cache`` and ``*-atime``) and
    :func:`first_on_node`'s markers; returns how many entries (``*-cache`` files) were
    removed. Safe while other processes run: one that wanted a removed entry compiles the
    program again.
    """
    target = default_directory() if path is None else Path(path).expanduser()
    if not target.is_dir():
        return 0
    markers = target / FIRST_ON_NODE_FOLDER
    if markers.is_dir():
        for marker in markers.glob("*.done"):
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
    removed = 0
    for entry in target.iterdir():
        if entry.is_file() and entry.name.endswith(_ENTRY_SUFFIXES):
            try:
                entry.unlink()
            except FileNotFoundError:  # another process removed it first
                continue
            removed += entry.name.endswith("-cache")
    return removed


def _key_digest(key_parts) -> str | None:
    """A hex digest of ``key_parts`` (pickled; cloudpickle for closures), or None when they
    cannot be pickled."""
    try:
        try:
            import cloudpickle
            payload = cloudpickle.dumps(key_parts)
        except ImportError:  # pragma: no cover - cloudpickle comes with ray
            payload = pickle.dumps(key_parts)
    except Exception:  # noqa: BLE001 - an unpicklable part: no key, no waiting
        return None
    return hashlib.sha256(payload + jax.__version__.encode()).hexdigest()[:32]


@contextlib.contextmanager
def first_on_node(*key_parts: Any, max_wait: float = 600.0, poll: float = 0.05
                  ) -> Iterator[bool]:
    """Let the first process of this machine that enters with ``key_parts`` run alone.

    Processes that start the same work at once (the Ray engine's client actors fitting
    their surrogates or compiling their visits) would each compile the same programs: with
    an empty compilation cache none of them finds an entry, and N processes compiling on a
    few cores take about N times as long. Inside this context the first process (an
    exclusive ``flock`` on a lock file in the cache directory) runs while the others wait;
    when it leaves, a marker file records that the work is done (its programs are in the
    cache), and the waiting processes go on at once and together, reading the programs
    instead of compiling them. Later runs find the marker and do not wait at all.

    ``key_parts``: what identifies the programs (the message, the protocol or model, the
    shapes of the rows); pickled and hashed with the JAX version. Yields True in the process
    that ran first. Does nothing (yields False) with the cache off, without ``fcntl``
    (Windows), when the key cannot be pickled, or when the cache directory cannot be written.
    A first process that fails leaves no marker (the next one becomes first); one that takes
    longer than ``max_wait`` seconds stops the waiting (the others then compile too).
    """
    root = directory()
    digest = None if root is None or fcntl is None else _key_digest(key_parts)
    if digest is None:
        yield False
        return
    folder = root / FIRST_ON_NODE_FOLDER
    marker = folder / f"{digest}.done"
    if marker.exists():
        yield False
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / f"{digest}.lock", "a+")
    except OSError:
        yield False
        return
    with handle:
        locked = _flock_one_of([handle], max_wait, poll) is not None
        # holding the lock without a marker: nobody did the work yet, or the first failed
        # (then this one becomes first for the ones still waiting)
        first = locked and not marker.exists()
        if locked and not first:
            fcntl.flock(handle, fcntl.LOCK_UN)  # the work is done: go on with the others
            locked = False
        try:
            yield first
            if first:
                with contextlib.suppress(OSError):
                    marker.touch()
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _flock_one_of(handles: Sequence[Any], max_wait: float, poll: float, start: int = 0):
    """An exclusive ``flock`` on one of ``handles`` (open lock files, tried in turn from
    ``start``), retried every ``poll`` seconds for up to ``max_wait`` seconds: the handle
    locked, or None when none came free in time."""
    deadline = time.monotonic() + max_wait
    while True:
        for offset in range(len(handles)):
            handle = handles[(start + offset) % len(handles)]
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return handle
            except BlockingIOError:
                continue
        if time.monotonic() > deadline:
            return None
        time.sleep(poll)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system says, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_slots_lock = threading.Lock()
_slots_held = 0  # places this process holds (0 or 1; more while a step runs inside a step)


@contextlib.contextmanager
def node_slot(slots: int | None = None, *, max_wait: float = 600.0, poll: float = 0.02
              ) -> Iterator[bool]:
    """Run inside one of ``slots`` places of this machine (default: :func:`usable_cpus`).

    Thirty Ray client actors on two cores that all trace, lower and run their set-up at
    once each need about half again the CPU time they need alone (measured: a surrogate fit
    took 1.48 CPU-s per actor among 30, 0.94 s alone), as the processes keep taking the
    cores from each other. Inside this context at most ``slots`` processes of the machine
    run; the others sleep until a place is free (an exclusive ``flock`` on one of ``slots``
    lock files in the cache directory, named by the host, so that machines sharing a cache
    directory each have their own places). Yields True when it held a place; False (and
    runs at once) with the cache off, without ``fcntl`` (Windows), when the cache directory
    cannot be written, or after ``max_wait`` seconds without a place. A place is freed when
    its process leaves the context or dies. A process holds at most one place: a step that
    enters again while its process holds one (a step inside a step, another thread) runs in
    that place.
    """
    global _slots_held
    root = directory()
    count = usable_cpus() if slots is None else int(slots)
    if root is None or fcntl is None or count < 1:
        yield False
        return
    with _slots_lock:
        inside = _slots_held > 0
        _slots_held += inside
    if inside:  # this process holds a place already (a step inside a step)
        try:
            yield True
        finally:
            with _slots_lock:
                _slots_held -= 1
        return
    folder = root / NODE_SLOTS_FOLDER
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handles = [open(folder / f"{host}-{index}.lock", "a+") for index in range(count)]
    except OSError:
        yield False
        return
    held = None
    try:
        # processes try the places in different orders
        held = _flock_one_of(handles, max_wait, poll, start=os.getpid() % count)
        if held is not None:
            with _slots_lock:
                _slots_held += 1
        yield held is not None
    finally:
        if held is not None:
            with _slots_lock:
                _slots_held -= 1
            fcntl.flock(held, fcntl.LOCK_UN)
        for handle in handles:
            handle.close()


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, CompilationCacheWarning, stacklevel=3)


def configure_default() -> Path | None:
    """Switch the cache on at :func:`default_directory` unless the user decided otherwise.

    Called by ``import fedmcmc``. Does nothing when ``FEDMCMC_COMPILATION_CACHE`` opts out, when
    JAX's cache directory is already set (``JAX_COMPILATION_CACHE_DIR`` or
    ``jax.config.update``) or JAX's cache is switched off (``JAX_ENABLE_COMPILATION_CACHE=0``).
    When the directory cannot be written it warns once and leaves the cache off. Programs are
    cached whatever their compile time, unless ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` is
    set. Returns the directory switched on, or None.
    """
    switch = os.environ.get(ENVIRONMENT_SWITCH, "").strip().lower()
    if switch in _OFF:
        return None
    if switch not in _ON:
        _warn_once(f"{ENVIRONMENT_SWITCH}={os.environ[ENVIRONMENT_SWITCH]!r} is not one of "
                   f"0/false/no/off or 1/true/yes/on; the compilation cache stays on")
    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return None
    target = default_directory()
    error = _writable(target)
    if error is not None:
        _warn_once(f"fedmcmc's compilation cache {str(target)!r} cannot be written ({error}); "
                   f"running without it (set {ENVIRONMENT_SWITCH}=0 to silence this, or "
                   f"FEDMCMC_CACHE_DIR to a writable directory)")
        return None
    min_time = None if os.environ.get(_JAX_MIN_TIME_VARIABLE) else 0.0
    _switch_on(target, min_time)
    return target


def jit_with_constants_as_arguments(function: Callable, **jit_options) -> Callable:
    """``jax.jit(function, **jit_options)``, except that the arrays ``function`` closes over
    (its jaxpr's constants: the run's key, client data, surrogate fits, bounds) are arguments
    of the compiled program instead of constants embedded in it.

    JAX embeds a closed-over array of up to 32 bytes, and every PRNG key, in the program's
    text, which is what the persistent compilation cache hashes: a run with another seed, or
    with other values of a small fit (a 2-d surrogate's mean, 4 workers' bounds), was a new
    program and compiled again, seconds for a sampler's chunk. Here ``function`` is traced
    once per argument signature (``jax.make_jaxpr``); the compiled program evaluates that
    jaxpr with its constants passed in, so runs that differ only in such values share it.
    Python scalars in ``function`` (step sizes, rates) stay literals of the program: a value
    computed from the data belongs in a device array (``fedmcmc.arrays.device_array``) made
    outside the traced function. Jitted functions called inside ``function`` need
    ``inline=True`` for their closed-over arrays to become arguments too.

    Used for the samplers' run programs (``engines.local``), the set-up programs that close
    over client data (initial states, fits, tuning terms) and the client endpoints' programs
    (a hand-off visit, a Fed-PDMC worker's proposal, an agent's step). A call costs about
    what a jitted function's does plus one flattening of the arguments.

    Programs are also shared between calls of this function in one process: a new closure of
    the same structure (the next ``fm.sample`` with the same model, shapes and settings, or
    another seed or data set of the same shapes) traces again, but when its jaxpr is the same
    as one already compiled (:func:`_shared_program_key`), it takes that program instead of
    lowering and compiling (or reading the persistent cache) again. Only concrete calls use
    the shared program; a call under a JAX transformation traces its own."""
    # per argument signature: the compiled program (a jit of the traced jaxpr, whose
    # constants are its first argument) and the constants
    programs: Dict[Any, Any] = {}
    options_key = repr(sorted(jit_options.items()))
    name = getattr(function, "__name__", "function")
    qualname = getattr(function, "__qualname__", name)

    def program_of(arguments):
        flat_arguments, argument_tree = jax.tree_util.tree_flatten(arguments)
        signature = (argument_tree, tuple(_abstract_key(leaf) for leaf in flat_arguments))
        entry = programs.get(signature)
        if entry is None:
            closed, output_shapes = jax.make_jaxpr(function, return_shape=True)(*arguments)
            jaxpr, output_tree = closed.jaxpr, jax.tree_util.tree_structure(output_shapes)

            def evaluate(constants, flat_arguments):
                outputs = jax.core.eval_jaxpr(jaxpr, constants, *flat_arguments)
                return jax.tree_util.tree_unflatten(output_tree, outputs)

            # the program keeps the function's name (the cache's file names, profiles, logs)
            evaluate.__name__, evaluate.__qualname__ = name, qualname
            program = jax.jit(evaluate, **jit_options)
            if not any(isinstance(leaf, jax.core.Tracer) for leaf in flat_arguments):
                # an earlier trace's program if it compiled the same jaxpr, else this one. (Under
                # a transformation, grad, vmap or an outer jit, the trace keeps its own program:
                # a shared one's custom derivative rules would be the first trace's.)
                outline = (qualname, signature, tuple(_abstract_key(c) for c in closed.consts),
                           len(jaxpr.eqns), output_tree, options_key)
                program = _SHARED_PROGRAMS.find_or_add(outline, jaxpr, program)
            entry = programs[signature] = (program, list(closed.consts))
        return entry[0], entry[1], flat_arguments

    def call(*arguments):
        program, constants, flat_arguments = program_of(arguments)
        return program(constants, flat_arguments)

    def lower(*arguments):
        program, constants, flat_arguments = program_of(arguments)
        return program.lower(constants, flat_arguments)

    # as a jitted function's: ``.lower(*arguments)`` (e.g. ``.as_text()``, the program whose
    # text the compilation cache hashes)
    call.lower = lower
    return call


def _abstract_key(leaf) -> tuple:
    """What of an argument decides the traced program: its shape, dtype and weak type (a Python
    number is weakly typed), and whether it is a tracer (a call under a transformation keeps its
    own program, not a shared one). Cheaper than ``jax.typeof`` on the per-call path."""
    if isinstance(leaf, (bool, int, float, complex)):
        return (type(leaf),)
    return (np.shape(leaf), leaf.dtype, bool(getattr(leaf, "weak_type", False)),
            isinstance(leaf, jax.core.Tracer))


class _ProgramMemo:
    """The compiled programs :func:`jit_with_constants_as_arguments` shares within a process.

    Looked up in two steps. An outline (the function's name, the shapes of its arguments and
    constants, its output tree, its number of equations, the jit options) finds the programs
    that may be the same; only then are the jaxprs' texts compared (:func:`_shared_program_key`,
    printed once per program, up to 0.1 s for a sampler's run program), so a trace unlike any
    before costs no printing. The programs of the least recently used outlines beyond ``size``
    are let go (their executables with them: JAX keeps a jitted function's compilations while
    it lives)."""

    def __init__(self, size: int, per_outline: int = 8):
        self.size, self.per_outline = size, per_outline
        # outline -> [[jaxpr or None, its text key (None: not printed yet, False: not
        # shareable), program], ...]
        self._outlines: "collections.OrderedDict[Any, list]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def find_or_add(self, outline, jaxpr, program):
        """The program of an earlier jaxpr of this outline whose text equals ``jaxpr``'s,
        else ``program`` (then kept for later ones)."""
        with self._lock:
            candidates = self._outlines.get(outline)
            if candidates is None:
                self._outlines[outline] = [[jaxpr, None, program]]
                while len(self._outlines) > self.size:
                    self._outlines.popitem(last=False)
                return program
            self._outlines.move_to_end(outline)
            key = _shared_program_key(jaxpr, outline)
            if key is None:
                return program
            for candidate in candidates:
                if candidate[1] is None:  # printed now that a second trace has its outline
                    candidate[1] = _shared_program_key(candidate[0], outline) or False
                    candidate[0] = None
                if candidate[1] == key:
                    return candidate[2]
            candidates.append([None, key, program])
            del candidates[:-self.per_outline]
            return program

    def clear(self) -> None:
        with self._lock:
            self._outlines.clear()

    def __len__(self) -> int:
        """How many programs are kept."""
        return sum(len(candidates) for candidates in self._outlines.values())


_SHARED_PROGRAMS = _ProgramMemo(64)

# primitives whose forward evaluation is their jaxpr parameter alone: a Python function among
# their parameters (a custom derivative rule) takes part only when they are differentiated
_DERIVATIVE_RULE_PRIMITIVES = frozenset({"custom_jvp_call", "custom_vjp_call",
                                         "custom_vjp_call_jaxpr"})


def _shared_program_key(jaxpr, outline):
    """A key under which two traces evaluate to the same function of (constants, arguments),
    or None when the jaxpr's text cannot promise it.

    The text is the jaxpr printed in full (every equation and parameter, variables renamed in
    order, scalar literals to the last bit, constants and arguments by shape and dtype). The
    printer does not show what would make two equal texts differ in value, so those jaxprs are
    not shared: a constant nested in an inner jaxpr (a ``jax.jit`` without ``inline=True``
    closing over an array: its value is not printed), an array literal (printed ``[...]``), an
    equation with effects or a callback (its Python function is printed by name). Any other
    Python function among the parameters (a PRNG implementation's) is part of the key by
    identity, except the derivative rules of custom-derivative primitives: the shared program is
    only evaluated, never differentiated (a call under a transformation keeps its own program:
    its tracers are part of the signature, :func:`_abstract_key`)."""
    functions = []

    def shareable(jaxpr) -> bool:
        if jaxpr.effects:
            return False
        for equation in jaxpr.eqns:
            if equation.effects or "callback" in equation.primitive.name:
                return False
            for variable in equation.invars:
                if isinstance(variable, _jax_core.Literal) and np.shape(variable.val):
                    return False
            rules_allowed = equation.primitive.name in _DERIVATIVE_RULE_PRIMITIVES
            for value in jax.tree_util.tree_leaves(
                    equation.params,
                    is_leaf=lambda leaf: isinstance(leaf, (_jax_core.Jaxpr,
                                                           _jax_core.ClosedJaxpr))):
                if isinstance(value, _jax_core.ClosedJaxpr):
                    if value.consts or not shareable(value.jaxpr):
                        return False
                elif isinstance(value, _jax_core.Jaxpr):
                    if not shareable(value):
                        return False
                elif callable(value) and not rules_allowed:
                    functions.append(value)
        return True

    if not shareable(jaxpr):
        return None
    text = jaxpr.pretty_print(custom_pp_eqn_rules=False, source_info=False, name_stack=False,
                              use_color=False)
    key = (text, tuple(functions), outline)
    try:
        hash(key)
    except TypeError:  # a parameter that cannot be a key
        return None
    return key


# ``import fedmcmc`` imports this module before anything compiles
configure_default()
