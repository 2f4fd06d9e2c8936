"""Whether the template default's choice between the direct convolution and Winograd picks the faster on this host:
every 3x3 stride-1 convolution of the models named where Winograd applies, timed direct, as Winograd stage by stage
and as Winograd fused per block of tiles (the weight transformed once; ``winograd_block``), cold (each call's
weights from memory, as ``tune-model`` times a model's operators), the three in one batch
(their placements interleaved), ``--rounds`` batches in a row; the fastest is the one with the lowest minimum (a
host's slow spell doubles single rounds of any: a delay, not the kernel).

The default takes Winograd where the GEMM depth ``C x K / (C + K)`` reaches the rule's threshold for this CPU
(``opbench.space.winograd.deep_enough``: 48 multiply-adds per transformed value where the FMA units run 512 bits,
in proportion below; 16 where its stages run fused, their block in the L2) and the output has tiles enough
(docs/workloads-and-templates.md#fused-winograd).

    .venv/bin/python benchmarks/winograd_rule.py [--models resnet-18,squeezenet1.1,yolov3-tiny] [--rounds 2]
"""
from __future__ import annotations

import argparse

from _results import Results

from opbench.argtypes import positive_int
from opbench.hardware.cpu_shape import current_shape
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.timing import TimingPolicy
from opbench.measure.types import MeasureOptions, TrialSpec
from opbench.report.progress import table
from opbench.space import get_template, winograd
from opbench.space._base import Config
from opbench.workloads import Workload, parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models.cache import extract


def winograd_convs(model: str) -> list[tuple[str, Workload]]:
    """The model's fused operators whose convolution Winograd may compute (batch 1; a stem of few input channels
    takes the columns algorithm instead)."""
    ops = [(op.name, parse_workload(model_name(model, op.name, 1, 128))) for op in extract(model, 1, 128)[0]]
    return [(f"{model}/{name}", w) for name, w in ops
            if "winograd" in {c for k in get_template(w).knobs(w) if k.name == "algorithm" for c in k.choices}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet-18,squeezenet1.1,yolov3-tiny")
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args()
    resources, rows = Resources(args.threads), []
    with Measurer(MeasureOptions(TimingPolicy(cache_flush=True))) as measurer:
        for name, workload in (conv for model in args.models.split(",") for conv in winograd_convs(model)):
            template = get_template(workload)
            default = template.default_for(workload, "llvm")
            wino = next(c for c in (default, *template.other_algorithms(workload, "llvm")) if c["algorithm"] == "winograd")
            variants: dict[str, Config] = {"direct": {**default, "algorithm": "direct"},
                                           "winograd": {**wino, "winograd_block": 0},
                                           "fused": {**wino, "winograd_in_op": 0, "winograd_block": wino["winograd_block"] or 2}}
            picked = "direct" if default["algorithm"] == "direct" else "fused" if default["winograd_block"] else "winograd"
            ms: dict[str, list[float]] = {variant: [] for variant in variants}
            for _ in range(args.rounds):
                specs = [TrialSpec(workload, c, resources) for c in variants.values()]
                for variant, record in zip(variants, measurer.measure_batch(specs)):
                    ms[variant].append(record.latency_ms if record.latency_ms else float("nan"))
            fastest = {variant: min((t for t in times if t == t), default=float("inf")) for variant, times in ms.items()}
            faster = min(fastest, key=fastest.__getitem__)
            s = winograd.conv_shape(workload)
            rows.append((name, f"{s.c}->{s.k} at {s.oh}x{s.ow}", f"{s.c * s.k / (s.c + s.k):.1f}", picked,
                         *(" ".join(f"{t:.3f}" for t in times) for times in ms.values()),
                         "yes" if faster == picked else "no"))
    out = Results("winograd_rule")
    shape = current_shape()
    out.print(f"{args.threads} threads, cold, {args.rounds} rounds; this CPU's FMA units run {shape.fma_bits} bits "
              f"of its {shape.vector_bits}-bit vectors")
    out.table(table(rows, ["operator", "convolution", "depth", "default", "direct ms", "winograd ms",
                           "fused winograd ms", "default is faster"]))
    right = sum(row[-1] == "yes" for row in rows)
    out.print(f"the default picks the fastest of the three for {right} of {len(rows)} convolutions")
    out.save()


if __name__ == "__main__":
    main()
