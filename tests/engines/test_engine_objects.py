"""fm.sample picks the engine (issue 43): ``engine="local"``/``"ray"`` are shorthands for the
engine objects ``fm.LocalEngine()``/``fm.RayEngine(...)``, the Ray options are the
constructor's (checked there, each ``ValueError`` naming its argument), the keyword options
fm.sample took before map onto it, and a family never sees an engine's name. No Ray start:
these checks run before any session."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc as fm
from fedmcmc.api import resolve_engine
from fedmcmc.engines.engine import InProcessEngine, LocalEngine, ProtocolEngine

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = fm.models.gaussian_mean(2)


def federation():
    rng = np.random.default_rng(0)
    return fm.Federation([rng.normal(0.3, 1.0, size=(n, 2)).astype(np.float32)
                          for n in (5, 8, 11)])


@pytest.mark.parametrize("arguments, message", [
    (dict(clients_per_actor=0), "clients_per_actor must be a positive integer or 'auto'"),
    (dict(clients_per_actor="many"), "clients_per_actor must be a positive integer or 'auto'"),
    (dict(address=6379), "address must be a Ray address"),
    (dict(visit_timeout=-1.0), "visit_timeout must be a positive"),
    (dict(on_client_failure="retry"), "on_client_failure must be 'stop' or 'drop'"),
    (dict(client_resources={"node": 1}), "client_resources must be a list"),
    (dict(client_num_cpus=-2), "client_num_cpus must be a non-negative number"),
    (dict(reuse_actors="yes"), "reuse_actors must be True or False"),
    (dict(direct_channel=1), "direct_channel must be True or False"),
    (dict(channel_ports=(9000, 80)), "channel_ports must satisfy"),
    (dict(init_options=["num_cpus"]), "init_options must be a dict"),
    (dict(allow_unauthenticated_cluster="no"), "allow_unauthenticated_cluster must be True"),
    (dict(fault_injection="exit"), "fault_injection must be a dict"),
])
def test_ray_engine_checks_its_options(arguments, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        fm.RayEngine(**arguments)


def test_the_ray_shorthand_maps_the_keyword_options_onto_the_engine():
    options = {"ray_address": "auto", "visit_timeout": 30, "clients_per_actor": 2,
               "ray_init_options": {"num_cpus": 2}, "chunk_size": 5}
    engine = resolve_engine("ray", options)
    assert isinstance(engine, fm.RayEngine) and engine.label == "ray"
    assert (engine.address, engine.visit_timeout, engine.clients_per_actor,
            engine.init_options) == ("auto", 30.0, 2, {"num_cpus": 2})
    assert options == {"chunk_size": 5}  # what stays is the algorithm's
    # and back to the option dict the Ray session reads
    assert engine.engine_options() == {
        "on_client_failure": "stop", "visit_timeout": 30.0, "clients_per_actor": 2,
        "ray_address": "auto", "ray_init_options": {"num_cpus": 2}, "reuse_actors": True}
    assert isinstance(resolve_engine("local", {}), LocalEngine)
    given = fm.RayEngine(clients_per_actor=1)
    assert resolve_engine(given, {"chunk_size": 5}) is given


def test_engine_arguments_in_the_wrong_place_raise_value_errors():
    init = jnp.zeros(2)
    algorithm = fm.FedZigZag(sample_interval=0.5)
    with pytest.raises(ValueError, match="engine must be one of"):
        fm.sample(MODEL, federation(), algorithm, init=init, num_samples=2, engine="gpu")
    with pytest.raises(ValueError, match=r"visit_timeout is an engine option.*RayEngine"):
        fm.sample(MODEL, federation(), algorithm, init=init, num_samples=2,
                  engine=fm.RayEngine(), visit_timeout=3.0)
    with pytest.raises(ValueError, match="ray_address is a Ray option"):
        fm.sample(MODEL, federation(), algorithm, init=init, num_samples=2,
                  ray_address="auto")
    with pytest.raises(ValueError, match=r"ray_address is an engine option.*"
                                         r"RayEngine\(address=\.\.\.\)"):
        fm.sample(MODEL, federation(), algorithm, init=init, num_samples=2,
                  engine=fm.RayEngine(), ray_address="auto")
    with pytest.raises(ValueError, match=r"engine='ray' is not available for SGLD.*\('local',\)"):
        fm.sample(MODEL, federation(), fm.SGLD(step_size=1e-3, batch_size=2), init=init,
                  num_samples=2, engine=fm.RayEngine())
    # an engine option handed to the algorithm's run directly
    with pytest.raises(ValueError, match="audit_messages is an engine option"):
        algorithm.sample_distributed(MODEL, federation(), InProcessEngine(), init=init,
                                     num_samples=2, burn_in=0, thin=1, chains=1, seed=0,
                                     progress=False, audit_messages=True)


def test_the_engine_object_runs_what_the_algorithm_exports():
    """fm.LocalEngine() is engine="local"; an InProcessEngine runs the algorithm's
    message-passing run with in-process endpoints, with the same draws."""
    algorithm = fm.FedZigZag(sample_interval=0.5)
    run = dict(init=np.zeros(2, np.float32), num_samples=10, burn_in=2, chains=2, seed=1,
               progress=False, convergence=False)
    by_name = fm.sample(MODEL, federation(), algorithm, **run)
    by_object = fm.sample(MODEL, federation(), algorithm, engine=fm.LocalEngine(), **run)
    np.testing.assert_array_equal(by_object.flat_samples(), by_name.flat_samples())
    messages = fm.sample(MODEL, federation(), algorithm, engine=InProcessEngine(), **run)
    assert isinstance(InProcessEngine(), ProtocolEngine)
    assert messages.info["engine"] == "local" and messages.info["messages"] > 0
    np.testing.assert_array_equal(messages.flat_samples(), by_name.flat_samples())


def test_no_family_branches_on_an_engine_name():
    """The families export their runs; fm.sample chose the engine (``engine ==`` or a
    ``"ray"``/``"flower"`` literal in a family would be a second dispatch; an engine refuses
    an algorithm by the ``message_pattern`` it declares)."""
    found = []
    for family in ("langevin", "pdmp", "decentralised", "baselines"):
        for path in sorted((ROOT / "fedmcmc" / family).glob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r'engine\w*\s*[!=]=|[!=]=\s*"(ray|flower)"|"(ray|flower)"\s*[!=]='
                             r'|"(ray|flower)"\)|flower', line, flags=re.IGNORECASE):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
