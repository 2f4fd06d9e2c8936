"""Whole models tuned by OpBench against what a user would pick instead, measured in one run.

For each model (bert-base batch 1 seq 128, resnet-50 and mobilenet-v2 batch 1): extract and time the fused
operators, tune the key ones (>= 90% of the time) with a fixed per-operator budget and build the model with
their schedules; then time it beside PyTorch eager, ``torch.compile`` (Inductor ahead of time: an
AOTInductor package compiled once, static shapes, float32), ONNX Runtime (CPU provider, all graph
optimisations, the same threads within an operator, one across), OpenVINO (fp32, latency mode, one stream) and
zentorch (AMD's torch.compile backend, on AMD CPUs with AVX-512; both optional extras, rows that say why where
they cannot run), TVM with OpBench's template defaults, and
MetaSchedule tuning the model with as many trials as OpBench's tuned model measured (``tune_relax``,
``max_trials_global``, seed 0; the row says how many of its tasks the budget left untuned).
Every latency printed is verified: each system timed again in fresh processes under the host lock, over
``--rounds`` alternating rounds (median, with the per-round range); each output is checked against
PyTorch's first. "best baseline" is the fastest of the frameworks that ran. A
target is judged (met / NOT MET) from 3 rounds or more; fewer print the ratio with no verdict.
TVM's unscheduled lowering is not timed here. The host's GEMM ceiling (the faster of PyTorch's and numpy's
fp32 2048^3 GEMM in fresh processes) is timed first; each model's tuned matmuls and convolutions are reported
against it, their time their share of the tuned build's profile times its verified latency.
Where the time goes: each model's operators timed inside our tuned build (the Relax VM's instrumentation,
each call) beside PyTorch eager's (``torch.profiler``, shapes recorded), matched by what they compute, the
largest first (a diagnostic of profiler times, not verified; inside the model a weight comes from memory,
not from the cache an operator's repeated calls keep it in; eager's convolution rows leave out the batch
norm and activation our fused operators include, which stay in eager's "other").

With ``--reuse``, the tuning (OpBench's operator records and MetaSchedule's database) a run with the same
key kept in the store's tuned-models folder is built and verified again instead of tuning anew, and the
table says so (``tune-model --reuse``); the wall time of each model and of the run is printed.

    .venv/bin/python benchmarks/models_vs_frameworks.py [--trials-per-op 16] [--threads 2] [--max-ops 12] [--rounds 3] [--reuse]
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from _ceiling import ceiling_line, gemm_ceiling
from _results import Results

from opbench.engines.registry import EngineSpec
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.protocol import INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH
from opbench.paths import tuned_models_dir
from opbench.report.progress import table
from opbench.studies.claims import spread_text
from opbench.studies.models.eager_ops import OTHER, match, ours, profile_eager
from opbench.studies.models.profile import INPUTS, TUNED
from opbench.studies.models.systems import DEFAULTS, EAGER_ROW, FRAMEWORK_ROWS, METASCHEDULE
from opbench.studies.models.tune import ModelSpec, ModelTuneResult, ModelTuneSpec, tune_model
from opbench.studies.verify import BEST, Spread, Verification
from opbench.workloads.models import cache
from opbench.workloads.models.extract import FusedOp
from opbench.workloads.models.sources import load_model

MODELS = ("bert-base", "resnet-50", "mobilenet-v2")  # batch 1; bert-base with 128 tokens
TARGETS_VS_EAGER = {"bert-base": 0.8, "resnet-50": 0.6, "mobilenet-v2": 0.4}  # issue 42's, at 2 threads
TARGET_VS_BEST = 0.9
TARGET_OF_CEILING = 0.75  # BERT's matmuls and ResNet's convolutions
GEMM_KINDS = {"matmuls": ("batch_matmul", "matmul", "dense"), "convolutions": ("conv2d",)}
SYSTEMS = (EAGER_ROW, INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH, DEFAULTS, METASCHEDULE)
PROFILE_ROWS = 8  # of each model's time split: the largest by eager's time, then the rest
VERDICT_ROUNDS = 3  # fewer fresh-process rounds of a whole model give no spread to judge a target by
INLINE_NOTE_CHARS = 60  # a longer note (where a reused tuning came from) is a footnote under the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-op", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-ops", type=int, default=12, help="key operators tuned per model, largest first")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process verification rounds")
    parser.add_argument("--reuse", action="store_true", help="build from the tuning a run with the same key kept")
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s")  # progress on stderr: each operator as it is tuned, the verification
    logging.getLogger("opbench").setLevel(logging.INFO)
    scratch = Path(tempfile.mkdtemp(prefix="opbench-models-"))
    rows, verdicts, walls, split, footnotes = [], [], [], [], []
    started = time.monotonic()
    ceiling, library = gemm_ceiling(args.threads)
    for model in args.models:
        print(f"=== {model}", flush=True)
        model_started = time.monotonic()
        spec = ModelTuneSpec(ModelSpec(model, batch=1, seq_len=128, threads=args.threads, repeat=3), args.trials_per_op,
                             args.max_ops, EngineSpec(seed=0, storage=f"sqlite:///{scratch / 'optuna.db'}"),
                             args.rounds, tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}", systems=SYSTEMS,
                             reuse=tuned_models_dir() if args.reuse else None)
        result = tune_model(spec)
        verified = result.verification
        assert verified is not None, "--rounds must be >= 1: every number printed here is verified"
        rows += model_rows(model, verified, footnotes)
        ops = cache.extract(model, 1, 128)[0]
        with Measurer() as measurer:
            built = measurer.profile_models([(result.database / TUNED, result.database / INPUTS)], Resources(args.threads))[0]
        verdicts += targets(model, verified) + of_ceiling(model, ops, result, built, ceiling)
        split += where_time_goes(model, ops, built, args.threads)
        walls.append(f"{model} {(time.monotonic() - model_started) / 60:.1f}")
    results = Results("models_vs_frameworks")
    results.print(f"\n{args.threads} threads, {args.trials_per_op} trials per key operator (at most {args.max_ops} "
                  f"per model); verified: median of {args.rounds} fresh-process rounds (min-max)")
    results.table(table(rows, ["model", "system", "verified ms (min-max)", "latency / eager", "OpBench tuned / this",
                               "errors"]))
    for line in footnotes:
        results.print(line)
    results.print(ceiling_line(ceiling, library))
    for line in verdicts:
        results.print(line)
    results.print("\nWhere the time goes, ms per run, each side inside its model: our tuned build's operators (the Relax "
                  "VM's instrumentation) beside PyTorch eager's (profiler)")
    results.table(table(split, ["model", "operator (what it computes)", "eager ms", "ours ms", "ours / eager"]))
    results.print(f"wall time, minutes: {', '.join(walls)}; the run {(time.monotonic() - started) / 60:.1f}"
                  f"{' (reusing kept tuning where its key matched)' if args.reuse else ''}")
    results.save()


def of_ceiling(model: str, fused: list[FusedOp], result: ModelTuneResult, built: dict[str, float], ceiling: float
               ) -> list[str]:
    """The tuned model's matmuls and convolutions against the GEMM ceiling: a verdict for the kind the issue names
    for the model, a line for the others. Their time is their share of the tuned build's profile (``built``, one
    process, in whatever phase the host was) times the tuned model's verified latency (fresh processes)."""
    ops = {op.name: op for op in fused}
    verified = result.verification.schedules.get(BEST) if result.verification else None
    latency = verified.latency if verified else None
    lines = []
    for label, kinds in GEMM_KINDS.items():
        names = [r[0] for r in result.rows if r[1] in kinds and r[-1] != "untuned" and r[0] in built]
        if not names:
            continue
        named = (model, label) in (("bert-base", "matmuls"), ("resnet-50", "convolutions"))
        what = (f"{model}'s {label} (target {TARGET_OF_CEILING:.0%} of the GEMM ceiling for bert-base's matmuls and "
                "resnet-50's convolutions)")
        if latency is None:
            lines.append(f"not verified: {what}")
            continue
        theirs, profiled = sum(built[n] for n in names), sum(built.values())
        ms = theirs / profiled * latency.median
        gflops = sum(ops[n].flops * ops[n].calls for n in names) / (ms * 1e-3) / 1e9
        share = gflops / ceiling
        lines.append(f"{'met' if share >= TARGET_OF_CEILING else 'NOT MET' if named else 'info'}: {what}: "
                     f"{gflops:.1f} GFLOP/s, {share:.0%} of it ({ms:.1f} ms a run: their share of the tuned build's "
                     f"profile, {theirs:.1f} of {profiled:.1f} ms, times its verified {latency.median:.4g} ms)")
    return lines


def where_time_goes(model: str, ops: list[FusedOp], built: dict[str, float], threads: int) -> list[tuple]:
    """The model's operators, ours (timed inside the tuned build, ``built``: all calls of a run) beside
    eager's: the :data:`PROFILE_ROWS` largest by eager's time, the rest in one row, and the totals."""
    matched = match(ours(ops, built), profile_eager(load_model(model, 1, 128), 5, threads))
    named = [m for m in matched if m.signature != OTHER][:PROFILE_ROWS]
    rest = [m for m in matched if m not in named]
    shown = [(" ".join(map(str, m.signature)), m.eager_ms, m.ours_ms) for m in named]
    shown += [("everything else", _total(m.eager_ms for m in rest), _total(m.ours_ms for m in rest)),
              ("total", _total(m.eager_ms for m in matched), _total(m.ours_ms for m in matched))]
    return [(model, what, _ms(eager), _ms(mine), f"{mine / eager:.2f}" if eager > 0 and mine == mine else "-")
            for what, eager, mine in shown]


def _total(values: Iterable[float]) -> float:
    return sum(v for v in values if v == v)  # NaN: that side has no such operator


def _ms(value: float) -> str:
    return f"{value:.3f}" if value == value else "-"


def model_rows(model: str, verified: Verification, footnotes: list[str]) -> list[tuple]:
    """The model's table rows; a note too long for its row (where a reused tuning came from) goes to
    ``footnotes``, numbered, the row pointing to it."""
    rows = []
    for name, schedule in verified.schedules.items():
        shown = {BEST: "OpBench tuned", DEFAULTS: "TVM template defaults", METASCHEDULE: "MetaSchedule"}.get(name, name)
        note = verified.notes.get(name, "")
        if len(note) > INLINE_NOTE_CHARS:
            footnotes.append(f"[{len(footnotes) + 1}] {model}, {shown}: {note}")
            note = f"see [{len(footnotes)}]"
        if note:
            shown += f" ({note})"
        rows.append((model, shown, spread_text(schedule.latency), spread_text(_ratio(verified, name, EAGER_ROW)),
                     spread_text(_ratio(verified, BEST, name)) if name != BEST else "-", "; ".join(schedule.errors)[:100] or "-"))
    return rows


def targets(model: str, verified: Verification) -> list[str]:
    """Whether the tuned model met the issue's targets on this host, from the verified rounds."""
    ran = {n: verified.schedules[n].latency for n in FRAMEWORK_ROWS if n in verified.schedules}
    ran = {n: lat for n, lat in ran.items() if lat is not None}
    lines = []
    if ran:
        best = min(ran, key=lambda n: ran[n].median)  # type: ignore[union-attr]
        lines.append(_verdict(f"{model} <= {TARGET_VS_BEST}x the best baseline ({best})", _ratio(verified, BEST, best),
                              TARGET_VS_BEST, verified.rounds))
    if METASCHEDULE in verified.schedules:
        lines.append(_verdict(f"{model} <= {TARGET_VS_BEST}x MetaSchedule at equal trials",
                              _ratio(verified, BEST, METASCHEDULE), TARGET_VS_BEST, verified.rounds))
    if model in TARGETS_VS_EAGER:
        lines.append(_verdict(f"{model} <= {TARGETS_VS_EAGER[model]}x eager", _ratio(verified, BEST, EAGER_ROW),
                              TARGETS_VS_EAGER[model], verified.rounds))
    return lines


def _ratio(verified: Verification, name: str, other: str) -> Spread | None:
    return verified.ratio(name, other) if name in verified.schedules and other in verified.schedules else None


def _verdict(what: str, ratio: Spread | None, target: float, rounds: int) -> str:
    if ratio is None:
        return f"not verified: {what}"
    measured = f"{what}: {ratio.median:.3g} ({ratio.lo:.3g}-{ratio.hi:.3g})"
    if rounds < VERDICT_ROUNDS:  # docs/measurement.md#model-rounds
        return f"no verdict ({rounds} round(s), {VERDICT_ROUNDS} needed): {measured}"
    return f"{'met' if ratio.median <= target else 'NOT MET'}: {measured}"



if __name__ == "__main__":
    main()
