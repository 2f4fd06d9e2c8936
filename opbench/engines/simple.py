"""Engines that need no model: uniform random sampling and exhaustive grid search."""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from opbench.engines._base import InProcessEngine, Proposal, Space, split_threads


class RandomEngine(InProcessEngine):
    name = "random"

    def __init__(self, space: Space, threads: int, seed: int | None = None) -> None:
        super().__init__(space, threads)
        self._rng = random.Random(seed)

    def propose(self, n: int) -> list[Proposal]:
        out = []
        for _ in range(n):
            config = {k: self._rng.choice(v["_value"]) for k, v in self._space.items()}
            config, threads = split_threads(config, self._threads)
            out.append(Proposal(config, threads))
        return out


class GridEngine(InProcessEngine):
    """Every point of the space in order (NNI GridSearch semantics); stops when exhausted."""

    name = "grid"

    def __init__(self, space: Space, threads: int) -> None:
        super().__init__(space, threads)
        names = list(space)
        self._points: Iterator[dict[str, Any]] = (
            dict(zip(names, values)) for values in itertools.product(*(space[k]["_value"] for k in names))
        )

    def propose(self, n: int) -> list[Proposal]:
        return [Proposal(*split_threads(point, self._threads)) for point in itertools.islice(self._points, n)]
