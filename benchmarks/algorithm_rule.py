"""Whether the template default's choice of a convolution's algorithm picks the faster on this host: every
convolution of the models named that offers one of ``--algorithms`` (the packed template's alternatives to its direct
one), timed direct and as the alternative, Winograd both stage by stage and fused per block of tiles (the weight
transformed once; ``winograd_block``); cold (each call's weights from memory, as ``tune-model`` times a model's
operators), the variants in one batch (their placements interleaved), ``--rounds`` batches in a row; the fastest is
the one with the lowest minimum (a host's slow spell doubles single rounds of any: a delay, not the kernel).

The default takes Winograd where the GEMM depth ``C x K / (C + K)`` reaches the rule's threshold for this CPU
(``opbench.space.winograd.deep_enough``: 48 multiply-adds per transformed value where the FMA units run 512 bits,
in proportion below; 16 where its stages run fused, their block in the L2) and the output has tiles enough
(docs/workloads-and-templates.md#fused-winograd); columns on whole vectors up to a 7x7 window
(docs/workloads-and-templates.md#stem-columns).

    .venv/bin/python benchmarks/algorithm_rule.py [--models resnet-18,vgg-16] [--algorithms winograd,columns]
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
from opbench.space import get_template
from opbench.space._base import Config
from opbench.workloads import Workload, parse_workload
from opbench.workloads.fused import model_name
from opbench.workloads.models.cache import extract


def convs(model: str, algorithms: list[str]) -> list[tuple[str, Workload, str]]:
    """The model's fused operators (batch 1) whose convolution may run as one of ``algorithms``, with it."""
    ops = [(op.name, parse_workload(model_name(model, op.name, 1, 128))) for op in extract(model, 1, 128)[0]]
    offered = [(name, w, next((k.choices for k in get_template(w).knobs(w) if k.name == "algorithm"), ())) for name, w in ops]
    return [(f"{model}/{name}", w, choices[1]) for name, w, choices in offered if choices and choices[1] in algorithms]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet-18,squeezenet1.1,yolov3-tiny")
    parser.add_argument("--algorithms", default="winograd,columns", help="the alternatives whose convolutions to time")
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args()
    resources, rows, wanted = Resources(args.threads), [], args.algorithms.split(",")
    with Measurer(MeasureOptions(TimingPolicy(cache_flush=True))) as measurer:
        for name, workload, alternative in (conv for model in args.models.split(",") for conv in convs(model, wanted)):
            picked, configs = variants(workload, alternative)
            ms: dict[str, list[float]] = {variant: [] for variant in configs}
            for _ in range(args.rounds):
                specs = [TrialSpec(workload, c, resources) for c in configs.values()]
                for variant, record in zip(configs, measurer.measure_batch(specs)):
                    ms[variant].append(record.latency_ms if record.latency_ms else float("nan"))
            fastest = {variant: min((t for t in times if t == t), default=float("inf")) for variant, times in ms.items()}
            faster = min(fastest, key=fastest.__getitem__)
            times = {variant: " ".join(f"{t:.3f}" for t in ms[variant]) for variant in ms}
            rows.append((name, describe(workload), picked, times.pop("direct"), alternative, times.pop(alternative),
                         times.pop("fused", "-"), "yes" if faster == picked else "no"))
    out = Results("algorithm_rule")
    shape = current_shape()
    out.print(f"{args.threads} threads, cold, {args.rounds} rounds; this CPU's FMA units run {shape.fma_bits} bits "
              f"of its {shape.vector_bits}-bit vectors")
    out.table(table(rows, ["operator", "convolution", "default", "direct ms", "alternative", "alternative ms",
                           "fused winograd ms", "default is faster"]))
    right = sum(row[-1] == "yes" for row in rows)
    out.print(f"the default picks the fastest for {right} of {len(rows)} convolutions")
    out.save()


def variants(workload: Workload, alternative: str) -> tuple[str, dict[str, Config]]:
    """The default's variant, and the configs timed: direct and ``alternative`` (Winograd: stage by stage and fused),
    each the template default with that algorithm."""
    template = get_template(workload)
    default = template.default_for(workload, "llvm")
    other = next(c for c in (default, *template.other_algorithms(workload, "llvm")) if c["algorithm"] == alternative)
    configs: dict[str, Config] = {"direct": {**default, "algorithm": "direct"}, alternative: other}
    if alternative != "winograd":
        return default["algorithm"], configs
    configs.update(winograd={**other, "winograd_block": 0},
                   fused={**other, "winograd_in_op": 0, "winograd_block": other["winograd_block"] or 2})
    return "direct" if default["algorithm"] == "direct" else "fused" if default["winograd_block"] else "winograd", configs


def describe(workload: Workload) -> str:
    """``C -> K RxS /stride at OHxOW``, from the anchor's loops (n, k, oh, ow | c, r, s) and the data's width."""
    spatial = [a.extent for a in workload.axes if not a.reduce]
    c, r, s = (a.extent for a in workload.axes if a.reduce)
    return f"{c} -> {spatial[1]} {r}x{s} at {spatial[2]}x{spatial[3]}"

if __name__ == "__main__":
    main()
