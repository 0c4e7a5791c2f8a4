"""The persistent compilation cache (fedmcmc/cache.py): a second process reads what the first
compiled; the opt-out, a user's own JAX cache and an unwritable directory are respected.

Checked through JAX's monitoring events and the files in the cache directory, never timings.
Every process is fresh (``subprocess``), as the cache is configured at ``import fedmcmc``.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import fedmcmc as fm

# One small fm.sample (SGLD, 2 clients, 1 chain) in a fresh process; prints what the cache did.
CHILD = r"""
import json, sys
import fedmcmc as fm
import jax, jax.numpy as jnp, numpy as np
from jax import monitoring

events = {}
monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
rs = np.random.default_rng(0)
clients = [{"y": rs.normal(1.0, 1.0, size=(n,)).astype(np.float32)} for n in (30, 12)]
model = fm.Model(log_prior=lambda th: -0.5 * jnp.sum(th ** 2) / 100.0,
                 log_likelihood=lambda th, ex: -0.5 * (ex["y"] - th[0]) ** 2)
result = fm.sample(model, fm.Federation(clients), fm.SGLD(step_size=1e-3, batch_size=8),
                   init=jnp.zeros(1), num_samples=20, chains=1, seed=0, progress=False)
directory = fm.cache.directory()
print(json.dumps({
    "directory": None if directory is None else str(directory),
    "hits": events.get("/jax/compilation_cache/cache_hits", 0),
    "writes": events.get("/jax/compilation_cache/cache_misses", 0),
    "min_compile_time": jax.config.jax_persistent_cache_min_compile_time_secs,
    "draws": np.asarray(result.samples).ravel().tolist(),
}))
"""

# Only the import: where the cache is and which warnings importing fedmcmc gave.
IMPORT_ONLY = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fedmcmc as fm
import jax, jax.numpy as jnp
value = float(jax.jit(lambda x: x * 2.0 + 1.0)(jnp.float32(3.0)))  # runs, cache or not
directory = fm.cache.directory()
print(json.dumps({
    "directory": None if directory is None else str(directory),
    "min_compile_time": jax.config.jax_persistent_cache_min_compile_time_secs,
    "warnings": [type(w.message).__name__ + ": " + str(w.message) for w in caught],
    "value": value,
}))
"""


def run_fresh(script, **environment):
    """Run ``script`` in a new interpreter with the cache variables of ``environment`` only."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE",
                                "JAX_ENABLE_COMPILATION_CACHE", "FEDMCMC_"))}
    env.update(environment)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def entries(directory):
    return sorted(p.name for p in directory.glob("*-cache"))


def test_second_process_reads_the_programs_the_first_compiled(tmp_path):
    first = run_fresh(CHILD, FEDMCMC_CACHE_DIR=str(tmp_path))
    cache_dir = tmp_path / "jax"
    assert first["directory"] == str(cache_dir)
    assert first["min_compile_time"] == 0.0  # every program, not only those over JAX's 1 s
    written = entries(cache_dir)
    assert first["hits"] == 0 and first["writes"] == len(written) > 0

    second = run_fresh(CHILD, FEDMCMC_CACHE_DIR=str(tmp_path))
    # every program read back, none compiled and written again
    assert second["hits"] == first["writes"] and second["writes"] == 0
    assert entries(cache_dir) == written
    assert second["draws"] == first["draws"]  # the cached executables give the same draws

    # the opt-out: the same warm directory is neither read nor written
    off = run_fresh(CHILD, FEDMCMC_CACHE_DIR=str(tmp_path), FEDMCMC_COMPILATION_CACHE="0")
    assert off["directory"] is None and off["hits"] == 0 and off["writes"] == 0
    assert off["min_compile_time"] == 1.0  # JAX's default, untouched
    assert off["draws"] == first["draws"]


def test_opt_out_leaves_the_directory_untouched(tmp_path):
    out = run_fresh(IMPORT_ONLY, FEDMCMC_CACHE_DIR=str(tmp_path), FEDMCMC_COMPILATION_CACHE="off")
    assert out["directory"] is None and out["warnings"] == []
    assert not (tmp_path / "jax").exists()


def test_default_directory_follows_xdg_cache_home(tmp_path):
    out = run_fresh(IMPORT_ONLY, XDG_CACHE_HOME=str(tmp_path))
    assert out["directory"] == str(tmp_path / "fedmcmc" / "jax")
    assert entries(tmp_path / "fedmcmc" / "jax")  # the jitted function was written


def test_a_cache_the_user_configured_is_left_alone(tmp_path):
    mine = tmp_path / "mine"
    out = run_fresh(IMPORT_ONLY, FEDMCMC_CACHE_DIR=str(tmp_path / "fedmcmc"),
                    JAX_COMPILATION_CACHE_DIR=str(mine))
    assert out["directory"] == str(mine)
    assert out["min_compile_time"] == 1.0  # the user's JAX settings, not fedmcmc's
    assert not (tmp_path / "fedmcmc").exists()


def test_unwritable_directory_warns_once_and_runs_without(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = run_fresh(IMPORT_ONLY, FEDMCMC_CACHE_DIR=str(blocker / "below"))
    assert out["directory"] is None
    assert out["value"] == 7.0
    assert len(out["warnings"]) == 1
    assert out["warnings"][0].startswith("CompilationCacheWarning") and "below" in out["warnings"][0]


def test_enable_disable_and_clear_in_a_running_process(tmp_path, restore_cache_settings):
    assert fm.cache.enable(tmp_path / "here") == tmp_path / "here"
    assert fm.cache.directory() == tmp_path / "here"
    # a program no other test compiles (its constant is this test's own)
    jax.block_until_ready(jax.jit(lambda x: jnp.cos(x) * 1.2345678)(jnp.arange(7.0)))
    written = entries(tmp_path / "here")
    assert written
    (tmp_path / "here" / "keep.txt").write_text("not a cache entry")
    assert fm.cache.clear(tmp_path / "here") == len(written)
    assert entries(tmp_path / "here") == [] and (tmp_path / "here" / "keep.txt").exists()

    fm.cache.disable()
    assert fm.cache.directory() is None
    jax.block_until_ready(jax.jit(lambda x: jnp.sin(x) * 1.2345678)(jnp.arange(7.0)))
    assert entries(tmp_path / "here") == []  # nothing written while off


def test_enable_rejects_bad_arguments(tmp_path, restore_cache_settings):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="path"):
        fm.cache.enable(blocker / "below")
    with pytest.raises(ValueError, match="min_compile_time"):
        fm.cache.enable(tmp_path, min_compile_time=-1.0)
    with pytest.raises(ValueError, match="min_compile_time"):
        fm.cache.enable(tmp_path, min_compile_time=float("nan"))


def test_default_directory_order(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDMCMC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fm.cache.default_directory() == tmp_path / "home" / ".cache" / "fedmcmc" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec ignores it
    assert fm.cache.default_directory() == tmp_path / "home" / ".cache" / "fedmcmc" / "jax"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fm.cache.default_directory() == tmp_path / "xdg" / "fedmcmc" / "jax"
    monkeypatch.setenv("FEDMCMC_CACHE_DIR", str(tmp_path / "mine"))
    assert fm.cache.default_directory() == tmp_path / "mine" / "jax"


FIRST_ON_NODE = r"""
import json, sys, time
import fedmcmc as fm
started = time.time()
try:
    with fm.cache.first_on_node("compile", "the same programs") as first:
        entered = time.time()
        if sys.argv[1] != "ok" and first:
            try:  # the first process to be first fails (once)
                open(sys.argv[1], "x").close()
            except FileExistsError:
                pass
            else:
                raise RuntimeError("the first process fails")
        time.sleep(1.0)
        left = time.time()
except RuntimeError:
    print(json.dumps({"failed": True}))
else:
    print(json.dumps({"first": first, "started": started, "entered": entered, "left": left}))
"""


def _first_on_node_processes(tmp_path, count, behaviour="ok"):
    env = dict(os.environ, FEDMCMC_CACHE_DIR=str(tmp_path), FEDMCMC_COMPILATION_CACHE="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    processes = [subprocess.Popen([sys.executable, "-c", FIRST_ON_NODE, behaviour], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(count)]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


def test_first_on_node_lets_one_process_compile_while_the_others_wait(tmp_path):
    """Processes that start the same compiling work at once (Ray client actors on one node):
    one runs first and alone, the others enter only when it has left, then together; a later
    process finds the marker and does not wait; a first process that fails leaves no marker
    and another becomes first."""
    runs = _first_on_node_processes(tmp_path, 3)
    firsts = [run for run in runs if run["first"]]
    others = [run for run in runs if not run["first"]]
    assert len(firsts) == 1 and len(others) == 2
    (first,) = firsts
    for other in others:
        if other["started"] < first["left"]:  # it started while the first was running
            assert other["entered"] >= first["left"] - 0.05
    # the waiting ones went on together, not one after the other: each entered before the
    # other left (they stay 1 s inside; no bound on how fast the machine schedules them)
    assert others[0]["entered"] < others[1]["left"] and others[1]["entered"] < others[0]["left"]
    markers = list((tmp_path / "jax" / fm.cache.FIRST_ON_NODE_FOLDER).glob("*.done"))
    assert len(markers) == 1
    (late,) = _first_on_node_processes(tmp_path, 1)
    assert late["first"] is False  # the marker found: it neither compiles first nor waits
    # clear() removes the markers with the programs
    fm.cache.clear(tmp_path / "jax")
    assert not list((tmp_path / "jax" / fm.cache.FIRST_ON_NODE_FOLDER).glob("*.done"))

    failing = _first_on_node_processes(tmp_path / "failing", 3,
                                       behaviour=str(tmp_path / "failed-once"))
    assert sum(run.get("failed", False) for run in failing) == 1
    # the others ran; the one that took over after the failure (if any) is first, once
    assert sum(run.get("first", False) for run in failing) <= 1
    assert all(run.get("failed") or "entered" in run for run in failing)


def test_first_on_node_does_nothing_with_the_cache_off(tmp_path, restore_cache_settings):
    fm.cache.disable()
    with fm.cache.first_on_node("anything") as first:
        assert first is False
    assert not (tmp_path / fm.cache.FIRST_ON_NODE_FOLDER).exists()


NODE_SLOT = r"""
import json, sys, time
import fedmcmc as fm
started = time.time()
with fm.cache.node_slot(2) as held:
    entered = time.time()
    with fm.cache.node_slot(2) as inner:  # a step inside a step: the same place
        time.sleep(0.6)
    left = time.time()
print(json.dumps({"held": held, "inner": inner, "started": started, "entered": entered,
                  "left": left}))
"""


@pytest.mark.slow  # five processes; the default suite keeps first_on_node's three
def test_node_slot_lets_at_most_that_many_processes_run_at_once(tmp_path):
    """Five processes asking for one of 2 places: at most 2 inside at any time, every one
    runs; a process inside asking again (a step inside a step) keeps its place."""
    env = dict(os.environ, FEDMCMC_CACHE_DIR=str(tmp_path), FEDMCMC_COMPILATION_CACHE="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    processes = [subprocess.Popen([sys.executable, "-c", NODE_SLOT], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(5)]
    runs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        runs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(run["held"] and run["inner"] for run in runs)
    for run in runs:  # how many were inside at the middle of this one's stay
        middle = (run["entered"] + run["left"]) / 2
        inside = sum(other["entered"] <= middle <= other["left"] for other in runs)
        assert 1 <= inside <= 2
    # (whether two were ever inside together depends on how the machine schedules five
    # process starts: not asserted, as no test asserts wall-clock times)
    assert len(list((tmp_path / "jax" / fm.cache.NODE_SLOTS_FOLDER).glob("*.lock"))) == 2


def test_node_slot_does_nothing_with_the_cache_off(tmp_path, restore_cache_settings):
    fm.cache.disable()
    with fm.cache.node_slot(1) as held:
        assert held is False
    assert fm.cache.usable_cpus() >= 1
