"""Plots of study results (matplotlib, headless), saved as PNG files."""
from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opbench.record import OBJECTIVE_COLUMNS, TrialRecord, is_ok


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, ax: Any, title: str, path: Path) -> Path:
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def best_so_far(records: Iterable[TrialRecord]) -> list[float]:
    """Running minimum of ok latencies, one value per trial (inf until the first ok trial)."""
    best, out = math.inf, []
    for record in records:
        if is_ok(record):
            best = min(best, record["latency_ms"])
        out.append(best)
    return out


def _references(ax: Any, references: dict[str, TrialRecord], first_color: int) -> None:
    for n, (name, ref) in enumerate(references.items(), start=first_color):
        if is_ok(ref):
            ax.axhline(ref["latency_ms"], linestyle="--", linewidth=1, color=f"C{n % 10}", label=name)


def tuning_curve(records: list[TrialRecord], references: dict[str, TrialRecord], title: str, path: Path) -> Path:
    """Best-so-far latency against trial number, each trial's latency as a dot, references as lines."""
    fig, ax = _pyplot().subplots(figsize=(7, 4))
    dots = [(i, r["latency_ms"]) for i, r in enumerate(records, start=1) if is_ok(r)]
    if dots:
        ax.scatter(*zip(*dots), s=8, color="0.6", label="trial")
    curve = [(i, b) for i, b in enumerate(best_so_far(records), start=1) if b < math.inf]
    if curve:
        ax.step(*zip(*curve), where="post", color="C0", label="best so far")
    _references(ax, references, 1)
    ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel("latency (ms, log)")
    return _save(fig, ax, title, path)


def engine_curves(series: dict[str, list[TrialRecord]], references: dict[str, TrialRecord], title: str, path: Path,
                  against: str = "trial") -> Path:
    """Best-so-far latency per engine against trial number or wall time (s since its first trial)."""
    fig, ax = _pyplot().subplots(figsize=(7, 4))
    for n, (engine, records) in enumerate(series.items()):
        if against == "trial":
            xs = list(range(1, len(records) + 1))
        else:
            start = min(r["finished_at"] - r.get("trial_s", 0.0) for r in records)
            xs = [r["finished_at"] - start for r in records]
        points = [(x, b) for x, b in zip(xs, best_so_far(records)) if b < math.inf]
        if points:
            ax.step(*zip(*points), where="post", color=f"C{n % 10}", label=engine)
    _references(ax, references, len(series))
    ax.set_yscale("log")
    ax.set_xlabel("trial" if against == "trial" else "wall time (s)")
    ax.set_ylabel("best latency so far (ms, log)")
    return _save(fig, ax, title, path)


AXIS_LABELS = {"threads": "threads (cores used)", "energy": "energy (J per call)", "memory": "workspace (bytes)"}


def tradeoff(records: list[TrialRecord], front: list[TrialRecord], objective: str, title: str, path: Path) -> Path:
    """Every ok trial's latency against ``objective`` (threads, energy or memory), the Pareto ``front`` joined."""
    column = OBJECTIVE_COLUMNS[objective]
    fig, ax = _pyplot().subplots(figsize=(6, 4))
    ok = [r for r in records if is_ok(r) and r.get(column) is not None]
    ax.scatter([r[column] for r in ok], [r["latency_ms"] for r in ok], s=10, color="0.6", label="trial")
    if front:
        ax.plot([r[column] for r in front], [r["latency_ms"] for r in front], "o-", color="C3", label="Pareto front")
    ax.set_yscale("log")
    ax.set_xlabel(AXIS_LABELS[objective])
    ax.set_ylabel("latency (ms, log)")
    return _save(fig, ax, title, path)


def predicted_vs_measured(measured: Any, predicted: Any, title: str, path: Path,
                          labels: tuple[str, str] = ("measured", "predicted")) -> Path:
    """Predicted against measured latency (log-log), with the ±10% band around the diagonal (or any
    two latencies of the same trials, named by ``labels``)."""
    fig, ax = _pyplot().subplots(figsize=(5, 5))
    ax.scatter(measured, predicted, s=8, alpha=0.6, label="trial")
    lo, hi = min(min(measured), min(predicted)), max(max(measured), max(predicted))
    ax.plot([lo, hi], [lo, hi], color="C3", label="exact")
    ax.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], color="C3", alpha=0.15, label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{labels[0]} latency (ms)")
    ax.set_ylabel(f"{labels[1]} latency (ms)")
    return _save(fig, ax, title, path)


def thread_scaling(series: dict[str, tuple[list[int], list[float], list[float]]], title: str, path: Path) -> Path:
    """Latency (left) and parallel efficiency (right) against threads; series: label -> (threads, ms, eff)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for n, (label, (threads, latency, efficiency)) in enumerate(series.items()):
        left.plot(threads, latency, "o-", color=f"C{n % 10}", label=label)
        right.plot(threads, efficiency, "o-", color=f"C{n % 10}", label=label)
    left.set(xlabel="threads", ylabel="latency (ms, log)", yscale="log")
    right.set(xlabel="threads", ylabel="parallel efficiency", ylim=(0, 1.2))
    right.axhline(1.0, linestyle="--", color="0.6", linewidth=1)
    return _save(fig, left, title, path)


def slowdown_heatmaps(matrices: dict[str, Any], title: str, path: Path) -> Path:
    """One heatmap per layout: co-run latency / solo latency of the row workload next to the column one."""
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(matrices), figsize=(4.5 * len(matrices) + 1, 4.2), squeeze=False)
    vmax = max(2.0, max(float(np.nanmax(m.to_numpy())) for m in matrices.values() if m.notna().any().any()))
    for n, (ax, (label, matrix)) in enumerate(zip(axes[0], matrices.items())):
        image = ax.imshow(matrix.to_numpy(dtype=float), cmap="Reds", vmin=1.0, vmax=vmax)
        ax.set_xticks(range(len(matrix.columns)), matrix.columns, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(matrix.index)), matrix.index if n == 0 else [], fontsize=7)
        for (i, j), value in np.ndenumerate(matrix.to_numpy(dtype=float)):
            ax.text(j, i, "-" if value != value else f"{value:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if value > (1 + vmax) / 2 else "black")
        ax.set(title=label, xlabel="co-runs with", ylabel="slowed down" if n == 0 else "")
    fig.colorbar(image, ax=axes[0].tolist(), label="slowdown (x solo)")
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def placement_costs(costs: dict[str, float], marks: dict[str, str], title: str, path: Path) -> Path:
    """Social cost of every measured placement, sorted; ``marks`` names some (strategy -> placement)."""
    plt = _pyplot()
    items = sorted(costs.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(items) + 1.5))
    names = {label: ", ".join(s for s, marked in marks.items() if marked == label) for label, _ in items}
    colors = [f"C{1 + list(marks.values()).index(label)}" if names[label] else "0.7" for label, _ in items]
    ax.barh(range(len(items)), [c for _, c in items], color=colors)
    ax.set_yticks(range(len(items)), [f"{label}  [{names[label]}]" if names[label] else label
                                      for label, _ in items], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("social cost (ms)")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
