"""The one run driver (engines.driver.drive) and the result every family assembles from it."""

import numpy as np
import pytest

from fedmcmc.engines.comm import ClientFailure
from fedmcmc.engines.driver import PartialDraws, default_chunk_size, drive
from fedmcmc.results import (ClientFailureError, SamplingDivergedError, assemble_result,
                             divergence_details, diverged_error, finish_run)

CHAINS, DIM = 3, 2


def counting_advance(bad=None, fail_at=None, calls=None):
    """Draw k of chain c is (k, c) (deterministic, so the driver's bookkeeping is checkable);
    ``bad=(draw, chain)`` makes that draw infinite; ``fail_at`` raises a ClientFailure
    (with the draws of the call made before it attached) when that draw is reached."""

    def advance(states, first, count):
        if calls is not None:
            calls.append((first, count))
        index = np.arange(first, first + count, dtype=np.float64)
        draws = np.stack([np.stack([index, np.full(count, c, np.float64)], axis=-1)
                          for c in range(CHAINS)], axis=1)  # (count, chains, dim)
        stats = {"client": np.tile(np.arange(CHAINS), (count, 1)) + 10 * index[:, None]}
        if bad is not None and first <= bad[0] < first + count:
            draws[bad[0] - first, bad[1]] = np.inf
        if fail_at is not None and first <= fail_at < first + count:
            made = fail_at - first
            failure = ClientFailure(4, "died")
            failure.partial = PartialDraws("partial-states", draws[:made],
                                           {k: v[:made] for k, v in stats.items()},
                                           np.full(CHAINS, made))
            raise failure
        return states + count, draws, stats

    return advance


@pytest.mark.parametrize("chunk_size,draws_per_call", [(None, None), (7, None), (7, 1), (50, 3)])
def test_draws_and_callbacks_do_not_depend_on_the_chunking(chunk_size, draws_per_call):
    reported, checkpoints = [], []
    run = drive(counting_advance(), 0, chains=CHAINS, draw_dim=DIM, burn_in=5, num_samples=40,
                chunk_size=chunk_size, draws_per_call=draws_per_call, progress=False,
                on_draws=lambda d, s, first: reported.append((first, d)),
                on_chunk=lambda states, done: checkpoints.append((states, done)))
    assert run.draws.shape == (CHAINS, 40, DIM) and run.draws_done == 45 and run.state == 45
    np.testing.assert_array_equal(run.draws[1, :, 0], np.arange(5, 45))
    np.testing.assert_array_equal(run.stats["client"][2], 2 + 10 * np.arange(5, 45))
    # on_draws saw every kept draw once, in order, with its global index
    firsts = [first for first, _ in reported]
    joined = np.concatenate([d for _, d in reported], axis=1)
    np.testing.assert_array_equal(joined, run.draws)
    assert firsts[0] == 5 and all(int(d[0, 0, 0]) == f for f, d in reported)
    assert [done for _, done in checkpoints][-1] == 45
    assert all(states == done for states, done in checkpoints)
    assert not run.diverged.any() and run.failure is None


def test_a_diverged_draw_stops_the_run_and_keeps_the_draws_before():
    calls = []
    run = drive(counting_advance(bad=(23, 1), calls=calls), 0, chains=CHAINS, draw_dim=DIM,
                burn_in=5, num_samples=40, chunk_size=10, progress=False)
    assert run.diverged.tolist() == [False, True, False]
    assert run.first_bad_draw.tolist() == [-1, 23, -1]
    assert run.bad_stats["client"][1] == 1 + 10 * 23
    # stopped after the chunk holding the bad draw: draws 5..29 kept; chain 1 NaN from 23
    assert run.draws_done == 30 and run.draws.shape[1] == 25
    assert np.isfinite(run.draws[1, :18]).all() and np.isnan(run.draws[1, 18:]).all()
    assert np.isfinite(run.draws[[0, 2]]).all()
    assert calls[-1] == (20, 10)
    # a broken divergence rule (no check) would have run on to draw 45
    details = divergence_details(run, thin=4, stats=("client",))
    assert details == [{"chain": 1, "draw": 23, "iteration": 96, "client": 231}]
    result = assemble_result(run, algorithm="X", unravel=lambda d: d, info={}, dim=DIM, thin=4)
    error = diverged_error("X", result, details, "diverged; lower step_size")
    assert error.result is result and error.chains == [1]
    assert result.info["diverged_chains"] == [1] and result.info["iterations"] == 120
    assert "chain 1 by iteration 96, client 231" in str(error)


def test_a_client_failure_ends_the_run_with_the_partial_draws():
    run = drive(counting_advance(fail_at=17), 0, chains=CHAINS, draw_dim=DIM, burn_in=5,
                num_samples=40, chunk_size=10, progress=False)
    assert isinstance(run.failure, ClientFailure) and run.failure.client == 4
    assert run.draws_done == 17 and run.state == "partial-states"
    np.testing.assert_array_equal(run.draws[0, :, 0], np.arange(5, 17))
    assert run.draws_per_chain.tolist() == [17] * CHAINS
    result = assemble_result(run, algorithm="X", unravel=lambda d: d, info={}, dim=DIM,
                             burn_in=5)
    assert result.info["draws_per_chain"] == [12] * CHAINS


def test_the_draws_of_a_stopped_call_are_checked_for_divergence_too():
    """A call stopped by a failure (or Ctrl-C) attaches the draws it made: a bad one among them
    marks its chain diverged, as in any other call; a chain's padding past the draws it made
    (the broadcast engine's chains end at different draws) does not."""
    run = drive(counting_advance(bad=(15, 1), fail_at=17), 0, chains=CHAINS, draw_dim=DIM,
                burn_in=5, num_samples=40, chunk_size=10, progress=False)
    assert isinstance(run.failure, ClientFailure)
    assert run.diverged.tolist() == [False, True, False]
    assert run.first_bad_draw.tolist() == [-1, 15, -1]
    assert run.bad_stats["client"][1] == 1 + 10 * 15
    assert np.isfinite(run.draws[1, :10]).all() and np.isnan(run.draws[1, 10:]).all()
    assert np.isfinite(run.draws[[0, 2]]).all()

    def padded(states, first, count):
        failure = ClientFailure(0, "died")
        draws = np.zeros((4, CHAINS, DIM))
        draws[2:, 1] = np.nan  # chain 1 made two draws of the four
        failure.partial = PartialDraws("partial-states", draws, {}, np.array([4, 2, 4]))
        raise failure

    run = drive(padded, 0, chains=CHAINS, draw_dim=DIM, burn_in=0, num_samples=10,
                progress=False)
    assert not run.diverged.any() and run.draws_per_chain.tolist() == [4, 2, 4]


def test_the_family_s_own_figures_win_over_the_standard_ones():
    run = drive(counting_advance(), 0, chains=CHAINS, draw_dim=DIM, burn_in=0, num_samples=4,
                progress=False)
    info = {"iterations": 999}  # e.g. a PDMP's thinning iterations
    assemble_result(run, algorithm="X", unravel=lambda d: d, info=info, dim=DIM, thin=None)
    assert info["iterations"] == 999 and info["draws_kept"] == 4 and info["chains"] == CHAINS
    assert "seconds_per_iteration" not in info


class _FamilyCheck(RuntimeError):
    pass


def _finish(run, checked, **keywords):
    def checks(result):
        checked.append(result)
        raise _FamilyCheck("the family's last check", result)

    return finish_run(run, name="X", info={"messages": 7}, dim=DIM, unravel=lambda d: d,
                      checks=checks, **keywords)


def test_finish_run_raises_failure_then_divergence_then_the_family_s_checks():
    """The one end of every run: each error carries the assembled result, and the first that
    applies wins (a failure over a divergence of the same run, both over the family's checks,
    which see only a run that neither stopped)."""
    checked = []
    both = drive(counting_advance(bad=(15, 1), fail_at=17), 0, chains=CHAINS, draw_dim=DIM,
                 burn_in=5, num_samples=40, chunk_size=10, progress=False)
    with pytest.raises(ClientFailureError, match=r"X \(engine='ray'\): agent 4 failed") as error:
        _finish(both, checked, label="ray", role="agent")
    assert error.value.result.info["messages"] == 7 and error.value.client == 4

    diverged = drive(counting_advance(bad=(23, 1)), 0, chains=CHAINS, draw_dim=DIM, burn_in=5,
                     num_samples=40, chunk_size=10, progress=False)
    with pytest.raises(SamplingDivergedError, match=r"^X \(engine='ray'\): 1 chain") as error:
        _finish(diverged, checked, label="ray", thin=2)
    assert error.value.result.info["diverged_chains"] == [1]
    with pytest.raises(SamplingDivergedError, match=r"^X: 1 chain.*my cause"):
        _finish(diverged, checked, divergence_cause="my cause")
    with pytest.raises(_FamilyCheck):  # the family's own wording of a divergence
        _finish(diverged, checked,
                divergence_error=lambda result: _FamilyCheck("mine", result))
    assert checked == []

    clean = drive(counting_advance(), 0, chains=CHAINS, draw_dim=DIM, burn_in=5,
                  num_samples=40, chunk_size=10, progress=False)
    with pytest.raises(_FamilyCheck):
        _finish(clean, checked)
    assert len(checked) == 1 and checked[0].info["draws_kept"] == 40
    result = finish_run(clean, name="X", info={}, dim=DIM, unravel=lambda d: d)
    assert result.num_samples == 40 and result.algorithm == "X"


def test_default_chunks_are_nearly_equal():
    for total in (1, 7, 20, 41, 999):
        size = default_chunk_size(total)
        chunks = -(-total // size)
        assert total - (chunks - 1) * size > size - chunks
