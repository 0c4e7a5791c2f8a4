"""The run options every engine honours, checked the same way everywhere: ``on_draws``
receives each chunk's kept draws, in the in-process engine's layout ``(chains, k, dim)``, and
``chunk_size`` sets where the chunks end."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np


class DrawsReceived:
    """An ``on_draws`` callback that keeps what it was given: ``(first index, draws)`` per
    chunk."""

    def __init__(self):
        self.chunks: List[Tuple[int, np.ndarray]] = []

    def __call__(self, draws, stats, first_index):
        self.chunks.append((int(first_index), np.array(draws)))

    def check(self, result, burn_in: int, chunk_size: int) -> None:
        """The chunks start at the burn-in and then every ``chunk_size`` draws, and together
        they are the result's draws (``result.flat_samples()``), chain by chain."""
        kept = result.flat_samples()
        total = burn_in + kept.shape[1]
        expected = [max(start, burn_in) for start in range(0, total, chunk_size)
                    if start + chunk_size > burn_in]
        assert [first for first, _ in self.chunks] == expected
        received = np.concatenate([draws for _, draws in self.chunks], axis=1)
        assert received.shape == kept.shape, (received.shape, kept.shape)
        np.testing.assert_array_equal(received, kept)
