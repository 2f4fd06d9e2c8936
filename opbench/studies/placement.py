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
from pathlib import Path

from opbench import settings
from opbench.exceptions import OpBenchError
from opbench.hardware.resources import Resources, parse_cores
from opbench.measure.corun import CoRunSpec
from opbench.measure.measurer import Measurer
from opbench.measure.types import TrialSpec
from opbench.record import TrialRecord, is_ok, tee
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
                     window_s: float, on_record: Callable[[TrialRecord], None]) -> Callable[[Profile], list[float]]:
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


@dataclass(frozen=True)
class PlacementSpec:
    """Place ``workloads`` on ``devices`` (core sets): equilibrium of best-response dynamics vs the
    optimum (every placement measured) vs greedy."""

    workloads: tuple[str, ...]
    devices: str = "0;1;0,1"
    social: str = "makespan"
    start: str = "first"  # or "greedy"
    eps: float = 0.03
    max_profiles: int = 81
    window_s: float = 0.2
    study: str = "placement"
    tracking_uri: str | None = None
    best_from: tuple[str, ...] = ()
    run_timeout_s: float = settings.RUN_TIMEOUT_S

    def __post_init__(self) -> None:
        if len(self.workloads) < 2:
            raise OpBenchError("place needs at least 2 workloads")
        count, players = len(parse_devices(self.devices)), len(self.workloads)
        if count ** players > self.max_profiles:
            raise OpBenchError(f"{count}^{players} = {count ** players} placements exceed --max-profiles "
                               f"{self.max_profiles}: the optimum is found by measuring them all")


@dataclass
class PlacementResult:
    names: list[str]  # the workloads, in order
    strategies: dict[str, str]  # equilibrium / optimum / greedy -> placement
    rows: list[tuple]  # strategy, placement, social cost, x optimum, each player's cost
    dynamics: Dynamics
    stable: bool  # the dynamics' end is an eps-equilibrium
    price_of_anarchy: float
    measured: int  # placements measured
    plot: Path


def place(spec: PlacementSpec, on_record: Callable[[TrialRecord], None] | None = None) -> PlacementResult:
    """Measure what the strategies need, log them on the parent run, plot every placement's cost."""
    from opbench.measure.types import MeasureOptions
    from opbench.report.plots import placement_costs
    from opbench.studies.configs import study_configs
    from opbench.tracking import Recorder
    from opbench.tracking.mlflow_store import study_dir

    workloads, configs = study_configs(spec.workloads, spec.best_from, spec.tracking_uri)
    devices = parse_devices(spec.devices)
    players, count = len(workloads), len(devices)

    def describe(profile: Profile) -> str:
        return " ".join(f"{w.name}@{devices[d].label.removeprefix('cores ')}" for w, d in zip(workloads, profile)
                        if d is not None)

    with Measurer(MeasureOptions(build_workers=2, run_timeout_s=spec.run_timeout_s)) as measurer, \
            Recorder(spec.study, spec.tracking_uri, extra={"engine": "placement"}) as recorder:
        oracle = CostOracle(profile_measurer(measurer, workloads, configs, devices, spec.window_s,
                                             tee(recorder, *filter(None, [on_record]))))
        start = greedy(oracle, players, count)
        dynamics = best_response_dynamics(oracle, start if spec.start == "greedy" else (0,) * players, count, spec.eps)
        optimum, optimum_cost = exhaustive(oracle, players, count, spec.social)
        equilibrium_cost = oracle.social(dynamics.profile, spec.social)
        poa = price_of_anarchy(equilibrium_cost, optimum_cost)
        profiles = {"equilibrium": dynamics.profile, "optimum": optimum, "greedy": start}
        rows = [(name, describe(p), oracle.social(p, spec.social), oracle.social(p, spec.social) / optimum_cost,
                 *oracle.costs(p)) for name, p in profiles.items()]
        strategies = {name: describe(p) for name, p in profiles.items()}
        recorder.log_parent({"social": spec.social, "devices": spec.devices, **strategies},
                                   {"price_of_anarchy": poa, "greedy_ratio": oracle.social(start, spec.social) / optimum_cost,
                                    "equilibrium_cost_ms": equilibrium_cost, "optimum_cost_ms": optimum_cost,
                                    "profiles_measured": oracle.measured})
        every = {describe(p): oracle.social(p, spec.social) for p in itertools.product(range(count), repeat=players)}
        plot = placement_costs(every, strategies, f"placements by {spec.social} (price of anarchy {poa:.3f})",
                               study_dir("plots", spec.study, recorder.uri) / "placement.png")
        recorder.log_artifact(plot, "plots")
    return PlacementResult([w.name for w in workloads], strategies, rows, dynamics,
                           is_equilibrium(oracle, dynamics.profile, count, spec.eps), poa, oracle.measured, plot)
