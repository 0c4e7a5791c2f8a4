"""Suite-wide settings.

Compiled programs go to a persistent compilation cache kept between runs of this checkout's
suite, ``.pytest_cache/d/fedmcmc-jax`` (cleared by ``pytest --cache-clear``), not the user's:
most of the suite's time is XLA compiling the same small programs again, in every run, in every
test that builds a new closure of the same shapes, and in every subprocess a test starts. The
variables are also exported, so xdist workers and the subprocesses tests start share the
directory. Left alone when the user set ``JAX_COMPILATION_CACHE_DIR`` or opted out with
``FEDMCMC_COMPILATION_CACHE=0``, and with ``-p no:cacheprovider`` (then fedmcmc's default, the
user's cache directory, applies). tests/core/test_cache.py checks fedmcmc's own default in fresh
processes with these variables removed.
"""

import contextlib
import os

import pytest


def pytest_configure(config):
    if os.environ.get("FEDMCMC_COMPILATION_CACHE", "").strip().lower() in {"0", "false", "no", "off"}:
        return
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    cache = getattr(config, "cache", None)
    if cache is None:
        return
    directory = str(cache.mkdir("fedmcmc-jax"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@contextlib.contextmanager
def _jax_cache_settings_restored():
    """JAX's compilation cache settings restored on exit, and its cache object reset (it keeps
    the directory it was first used with)."""
    import jax

    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_enable_compilation_cache", before[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[2])
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """fedmcmc's cache folder (``FEDMCMC_CACHE_DIR``: references, compiled programs) in a
    temporary folder for one module's runs, not the user's; JAX's cache settings restored after."""
    patch = pytest.MonkeyPatch()
    patch.setenv("FEDMCMC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    patch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    with _jax_cache_settings_restored():
        yield
    patch.undo()


@pytest.fixture
def restore_cache_settings():
    """JAX's compilation cache settings as they were before the test (which may enable,
    disable or move the cache: ``fm.cache``)."""
    with _jax_cache_settings_restored():
        yield


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A Ray instance for one test module: loopback only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    before Ray is imported, ``_node_ip_address="127.0.0.1"``), 2 CPUs, no dashboard, its files
    in a temporary folder; shut down after the module. ``fm.sample(..., engine="ray")`` joins it."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")
    temp_dir = str(tmp_path_factory.mktemp("ray"))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local", include_dashboard=False, num_cpus=2, _temp_dir=temp_dir,
        _node_ip_address="127.0.0.1", log_to_driver=False,
    )
    yield ray
    ray.shutdown()
