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


#: the Ray instance ``local_ray`` started in this test process (one per xdist worker): its GCS
#: address, None while none runs
_SHARED_RAY = {"address": None}


def _shared_ray_running(ray) -> bool:
    if _SHARED_RAY["address"] is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().gcs_address == _SHARED_RAY["address"]
    except Exception:  # noqa: BLE001 - a half shut-down instance
        return False


def _stop_shared_ray() -> None:
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and _shared_ray_running(ray):
        ray.shutdown()
    _SHARED_RAY["address"] = None


@pytest.fixture(scope="session")
def _ray_for_the_session():
    """Shuts down, at the end of the session, the Ray instance ``local_ray`` started."""
    yield
    _stop_shared_ray()


@pytest.fixture(scope="module", autouse=True)
def _no_shared_ray_where_a_module_starts_its_own(request):
    """A module marked ``own_ray`` (its runs start a Ray instance, or check what happens
    without one) finds none left running by an earlier module, as it would alone."""
    if request.node.get_closest_marker("own_ray") is not None:
        _stop_shared_ray()
    yield


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory, _ray_for_the_session):
    """A Ray instance for the test modules that ask for it: loopback only
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before Ray is imported,
    ``_node_ip_address="127.0.0.1"``), 2 CPUs, no dashboard, its files in a temporary folder.
    Started once per test process and kept for the next module that asks (starting Ray costs
    seconds per module); restarted when a test shut it down or replaced it; shut down at the end
    of the session or before a module marked ``own_ray``. After each module the idle client
    actors its runs kept are ended, so no module sees another's. ``fm.sample(...,
    engine="ray")`` joins it."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = pytest.importorskip("ray", reason="engine='ray' needs ray (pip install 'fedmcmc[ray]')")
    if not _shared_ray_running(ray):
        if ray.is_initialized():
            ray.shutdown()
        ray.init(
            address="local", include_dashboard=False, num_cpus=2,
            _temp_dir=str(tmp_path_factory.mktemp("ray")), _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
        _SHARED_RAY["address"] = ray.get_runtime_context().gcs_address
    yield ray
    from fedmcmc.engines.ray_engine import release_idle_actors

    if _shared_ray_running(ray):
        release_idle_actors()
