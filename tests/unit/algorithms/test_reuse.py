"""The once-per-round cache of what every client derives from the same downlink."""

from __future__ import annotations

import torch

from fedcomm.algorithms.core.reuse import Reused


def test_made_once_for_the_same_objects_and_again_for_others() -> None:
    made: list[int] = []
    cache: Reused[int] = Reused()
    a, b = torch.zeros(2), torch.zeros(2)  # equal content, different objects

    def make() -> int:
        made.append(1)
        return len(made)

    assert cache.get([a], make, also=1) == 1
    assert cache.get([a], make, also=1) == 1  # reused
    assert cache.get([b], make, also=1) == 2  # another object: made again
    assert cache.get([b], make, also=2) == 3  # another round: made again
    assert cache.get([b, a], make, also=2) == 4
    assert cache.get([], make) == 5 and cache.get([], make) == 5  # no objects: made once
