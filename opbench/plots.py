"""Plots of study results (matplotlib, headless), saved as PNG files."""
from __future__ import annotations

import math
from pathlib import Path

from opbench.tracking.schema import Record


def tuning_curve(records: list[Record], references: dict[str, Record], title: str, path: Path) -> Path:
    """Best-so-far latency against trial number, each trial's latency as a dot, references as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    best, xs, ys, dots = math.inf, [], [], []
    for i, record in enumerate(records, start=1):
        if record.get("status") == "ok":
            best = min(best, record["latency_ms"])
            dots.append((i, record["latency_ms"]))
        if best < math.inf:
            xs.append(i)
            ys.append(best)
    if dots:
        ax.scatter(*zip(*dots), s=8, color="0.6", label="trial")
    ax.step(xs, ys, where="post", color="C0", label="best so far")
    for n, (name, ref) in enumerate(references.items(), start=1):
        if ref.get("status") == "ok":
            ax.axhline(ref["latency_ms"], linestyle="--", color=f"C{n}", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
