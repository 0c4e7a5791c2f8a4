"""Run-wide arguments sent as Interned (fedmcmc/engines/interning.py): equal bytes give the
process's existing object back, other bytes a new one; no Ray here (the Ray path is in
test_ray_packing.py)."""

import pickle

import numpy as np
import pytest

from fedmcmc.engines import interning
from fedmcmc.engines.comm import ClientEndpoint
from fedmcmc.engines.handoff import HandoffClient
from fedmcmc.engines.interning import Interned, intern_arguments, resolve


class Settings:
    def __init__(self, step_size, weights):
        self.step_size = step_size
        self.weights = weights


@pytest.fixture(autouse=True)
def empty_table(monkeypatch):
    monkeypatch.setattr(interning, "_INTERNED", type(interning._INTERNED)())


def test_equal_bytes_give_the_same_object_and_other_bytes_a_new_one():
    first = pickle.loads(pickle.dumps(Interned(Settings(1e-3, np.arange(3.0)))))
    # another driver object with the same contents (the next run's protocol)
    again = pickle.loads(pickle.dumps(Interned(Settings(1e-3, np.arange(3.0)))))
    assert again is first
    assert isinstance(first, Settings) and first.step_size == 1e-3
    # a different step size, or different array values: a new object
    other_step = pickle.loads(pickle.dumps(Interned(Settings(2e-3, np.arange(3.0)))))
    other_values = pickle.loads(pickle.dumps(Interned(Settings(1e-3, np.arange(3.0) + 1))))
    assert other_step is not first and other_step.step_size == 2e-3
    assert other_values is not first and other_values.weights[0] == 1.0
    assert interning.interned_count() == 3


def test_the_table_keeps_the_most_recent_objects_only(monkeypatch):
    monkeypatch.setattr(interning, "MAX_INTERNED", 2)
    blobs = [pickle.dumps(Interned(Settings(s, None))) for s in range(3)]
    objects = [pickle.loads(b) for b in blobs]
    assert interning.interned_count() == 2
    assert pickle.loads(blobs[2]) is objects[2]
    assert pickle.loads(blobs[0]) is not objects[0]  # evicted: built again


def test_a_digest_that_does_not_match_its_bytes_is_refused():
    digest, data = Interned(Settings(1.0, None)).payload()
    with pytest.raises(ValueError, match="digest does not match"):
        resolve("0" * len(digest), data)


def test_intern_arguments_wraps_the_declared_positions_once_per_object():
    class Endpoint(ClientEndpoint):
        RUN_WIDE_ARGUMENTS = (2,)

    shared, data = Settings(1.0, None), [np.zeros(2), np.ones(2)]
    specs = [(Endpoint, (s, data[s], shared)) for s in range(2)] + [(ClientEndpoint, (2, data[0]))]
    shipped = intern_arguments(specs)
    assert isinstance(shipped[0][1][2], Interned) and shipped[0][1][2] is shipped[1][1][2]
    assert shipped[0][1][1] is data[0]  # the client's data: as given
    assert shipped[2] == specs[2]  # no run-wide arguments declared: unchanged
    # one pickle of the list (cloudpickle, as Ray: the endpoint class is local): the
    # clients get one object
    cloudpickle = pytest.importorskip("cloudpickle")
    copies = pickle.loads(cloudpickle.dumps(shipped))
    assert copies[0][1][2] is copies[1][1][2] and copies[0][1][2].step_size == 1.0
    assert HandoffClient.RUN_WIDE_ARGUMENTS == (2, 3, 4)


def test_an_object_cloudpickle_cannot_pickle_is_left_for_ray():
    import threading

    class Endpoint(ClientEndpoint):
        RUN_WIDE_ARGUMENTS = (2,)

    lock = threading.Lock()  # no pickler handles it; a serializer registered with Ray might
    shipped = intern_arguments([(Endpoint, (0, None, lock)), (Endpoint, (1, None, lock))])
    assert shipped[0][1][2] is lock and shipped[1][1][2] is lock
