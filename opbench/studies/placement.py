"""Placement of operators on devices as a game: each operator (player) picks a device and pays its own
latency, which depends on who else runs on the same or overlapping cores (measured by co-running the
whole placement). Best-response dynamics finds an equilibrium; exhaustive search finds the optimum
of the social cost (makespan or total latency) on small instances, for the price of anarchy; greedy
placement is the usual heuristic to compare with.

Latencies are measured, so they are noisy: a player moves only when it gains more than ``eps``
(an eps-Nash equilibrium), which also keeps noise from making players cycle.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores
from opbench.measure.corun import CoRunSpec
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import Record, is_ok
from opbench.space import Config
from opbench.workloads import Workload

SOCIAL = ("makespan", "sum")
Profile = tuple[int | None, ...]  # a device index per player; None: the player is not placed (yet)


@dataclass(frozen=True)
class Device:
    """A CPU core set; an operator placed there runs one thread per core."""

    cores: tuple[int, ...]

    @property
    def label(self) -> str:
        return "cores " + ",".join(map(str, self.cores))


def parse_devices(text: str) -> list[Device]:
    """``"0;1;0,1"``: three devices, core 0, core 1, and both."""
    devices = []
    for part in text.split(";"):
        part = part.strip()
        if part in ("cuda", "gpu") or part.startswith("rpc://"):
            raise OpBenchError(f"device '{part}': co-runs are measured on local CPU core sets only for now")
        cores = parse_cores(part)
        if not cores:
            raise OpBenchError(f"--devices '{text}': empty device")
        devices.append(Device(cores))
    if len(devices) < 2:
        raise OpBenchError(f"--devices '{text}': placement needs at least 2 devices")
    return devices


class CostOracle:
    """Each player's latency under a (partial) profile, measured once per profile and cached."""

    def __init__(self, measure: Callable[[Profile], list[float]]) -> None:
        self._measure = measure
        self._cache: dict[Profile, list[float]] = {}

    @property
    def measured(self) -> int:
        return len(self._cache)

    def costs(self, profile: Profile) -> list[float]:
        """Latency (ms) per player; ``inf`` for an unplaced player or a failed co-run."""
        if profile not in self._cache:
            self._cache[profile] = self._measure(profile)
        return self._cache[profile]

    def social(self, profile: Profile, kind: str) -> float:
        costs = self.costs(profile)
        return max(costs) if kind == "makespan" else sum(costs)


def _moved(profile: Profile, player: int, device: int) -> Profile:
    return profile[:player] + (device,) + profile[player + 1:]


def best_response(oracle: CostOracle, profile: Profile, player: int, devices: int, eps: float) -> int:
    """The device that cuts ``player``'s latency by more than ``eps`` the most (its own when none does)."""
    current = oracle.costs(profile)[player]
    best: int | None = profile[player]
    best_cost = current
    for device in range(devices):
        if device != profile[player]:
            cost = oracle.costs(_moved(profile, player, device))[player]
            if cost < best_cost and cost < current * (1 - eps):
                best, best_cost = device, cost
    assert best is not None, f"player {player} is not placed"
    return best


@dataclass
class Dynamics:
    profile: Profile
    converged: bool
    moves: list[tuple[int, int]] = field(default_factory=list)  # (player, new device), in order


def best_response_dynamics(oracle: CostOracle, start: Profile, devices: int, eps: float = 0.03,
                           max_rounds: int = 20) -> Dynamics:
    """Players in turn switch to their best response until a whole round changes nothing."""
    profile, moves = start, []
    for _ in range(max_rounds):
        changed = False
        for player in range(len(profile)):
            device = best_response(oracle, profile, player, devices, eps)
            if device != profile[player]:
                profile, changed = _moved(profile, player, device), True
                moves.append((player, device))
        if not changed:
            return Dynamics(profile, True, moves)
    return Dynamics(profile, False, moves)


def is_equilibrium(oracle: CostOracle, profile: Profile, devices: int, eps: float) -> bool:
    return all(best_response(oracle, profile, p, devices, eps) == profile[p] for p in range(len(profile)))


def exhaustive(oracle: CostOracle, players: int, devices: int, social: str) -> tuple[Profile, float]:
    """The profile of least social cost among all ``devices ** players``."""
    return min(((p, oracle.social(p, social)) for p in itertools.product(range(devices), repeat=players)),
               key=lambda item: item[1])


def greedy(oracle: CostOracle, players: int, devices: int) -> Profile:
    """Slowest operator first (by its best latency alone), each onto the device where it runs fastest
    next to those already placed."""
    empty: Profile = (None,) * players
    solo = [min(oracle.costs(_moved(empty, p, d))[p] for d in range(devices)) for p in range(players)]
    profile = empty
    for player in sorted(range(players), key=lambda p: -solo[p]):
        costs = [oracle.costs(_moved(profile, player, d))[player] for d in range(devices)]
        profile = _moved(profile, player, min(range(devices), key=costs.__getitem__))
    return profile


def price_of_anarchy(equilibrium_cost: float, optimum_cost: float) -> float:
    return equilibrium_cost / optimum_cost if optimum_cost > 0 else math.nan


def profile_measurer(measurer: Measurer, workloads: list[Workload], configs: list[Config], devices: list[Device],
                     window_s: float, on_record: Callable[[Record], None]) -> Callable[[Profile], list[float]]:
    """Measures a profile by co-running its placed players, each on its device's cores."""
    def measure(profile: Profile) -> list[float]:
        placed = [(p, devices[d]) for p, d in enumerate(profile) if d is not None]
        label = " ".join(f"{workloads[p].name}@{device.label}" for p, device in placed)
        members = tuple(TrialSpec(workloads[p], configs[p], Resources(len(device.cores), device.cores),
                                  tags={"placement": label}) for p, device in placed)
        records = measurer.corun(CoRunSpec(members, "full", window_s, solo=False))
        for record in records:
            on_record(record)
        costs = [math.inf] * len(profile)
        if is_ok(records[0]):
            for (p, _), record in zip(placed, records[1:]):
                costs[p] = record["latency_ms"]
        return costs
    return measure
