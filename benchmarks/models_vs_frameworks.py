"""Whole models tuned by OpBench against what a user would pick instead, each case measured in one run.

For each case of the table (Ansor's five, resnet-50, mobilenet-v2, resnet3d-18, dcgan and bert-base, at batch 1
and 16; resnet-18, vgg-16, densenet-121, inception-v3, squeezenet1.1, yolov3-tiny and the GCN at batch 1; token
models at 128 tokens): extract and time the fused operators, tune the key ones (>= 90% of the time) with a
fixed per-operator budget and build the model with their schedules; then time it beside PyTorch eager, ``torch.compile`` (Inductor ahead of time: an
AOTInductor package compiled once, static shapes, float32), ONNX Runtime (CPU provider, all graph
optimisations, the same threads within an operator, one across), OpenVINO (fp32, latency mode, one stream; a
quantized model as NNCF quantizes it for OpenVINO, static int8) and
zentorch (AMD's torch.compile backend, on AMD CPUs with AVX-512; both optional extras, rows that say why where
they cannot run), TVM with OpBench's template defaults, and
MetaSchedule tuning the model with as many trials as OpBench's tuned model measured (``tune_relax``,
``max_trials_global``, seed 0; the row says how many of its tasks the budget left untuned). The GCN, its
adjacency dense in Relax as in its baselines, is also timed as PyTorch runs its sparse form (CSR, ``torch-sparse``):
a row beside the baselines, not one of them.
Every latency printed is verified: each system timed again in fresh processes under the host lock, over
``--rounds`` alternating rounds (median, with the per-round range); each output is checked against
PyTorch's first. "best baseline" is the fastest of the frameworks that ran. A
target (issue 93's: <= 0.9x the best baseline at batch 1 for Ansor's five and resnet-18, <= 1.0x otherwise; issue
94's for a quantized model: <= 0.9x the best baseline) is judged (met / NOT MET) from 3 rounds or more; fewer print
the ratio with no verdict. A quantized model's tuned latency is also set against its fp32 model's where this device
finished that case (issue 94: <= 0.5x), each verified in its own run, so the line says both commits.
TVM's unscheduled lowering is not timed here. The host's GEMM ceiling (the faster of PyTorch's and numpy's
fp32 2048^3 GEMM in fresh processes) is timed first; each model's tuned matmuls and convolutions are reported
against it, their time their share of the tuned build's profile times its verified latency.
Where the time goes: each model's operators timed inside our tuned build (the Relax VM's instrumentation,
each call) beside PyTorch eager's (``torch.profiler``, shapes recorded) and OpenVINO's (its CPU plugin's per-layer
counters, as its row runs it), matched by what they compute, the largest first (a diagnostic of profiler times,
not verified; inside the model a weight comes from memory, not from the cache an operator's repeated calls keep it
in; eager's convolution rows leave out the batch norm and activation our fused operators include, which stay in
eager's "other"; OpenVINO's include what it fuses into them).

Each case is appended to ``benchmarks/results/models_vs_frameworks/<device>.jsonl`` as it finishes, with its
commit, date and device; a later run with the same settings keeps the cases this device finished and measures the
rest (``--fresh`` measures them all again), so the table may be assembled over several days. The table printed
and saved is every finished case's, each with the commit it was measured at.
With ``--reuse``, the tuning (OpBench's operator records and MetaSchedule's database) a run with the same
key kept in the store's tuned-models folder is built and verified again instead of tuning anew, and the
table says so (``tune-model --reuse``); the wall time of each model and of the run is printed.

    .venv/bin/python benchmarks/models_vs_frameworks.py [--trials-per-op 16] [--threads 2] [--max-ops 12] [--rounds 3]
        [--models dcgan gcn] [--batch-sizes 1 16] [--reuse] [--fresh]
"""
from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from _cases import CaseStore
from _ceiling import ceiling_line, gemm_ceiling
from _results import RESULTS, Results

from opbench.engines.registry import EngineSpec
from opbench.hardware.resources import Resources
from opbench.measure.measurer import Measurer
from opbench.measure.protocol import INDUCTOR, ONNXRUNTIME, OPENVINO, TORCH_INT8, TORCH_SPARSE, ZENTORCH
from opbench.paths import tuned_models_dir
from opbench.report.progress import table
from opbench.studies.claims import spread_text
from opbench.studies.models.eager_ops import OTHER, OpTime, match, ours, profile_eager
from opbench.studies.models.openvino_ops import profile_openvino
from opbench.studies.models.profile import INPUTS, TUNED
from opbench.studies.models.systems import DEFAULTS, EAGER_ROW, FRAMEWORK_ROWS, METASCHEDULE, framework_onnx, unavailable
from opbench.studies.models.tune import ModelSpec, ModelTuneResult, ModelTuneSpec, tune_model
from opbench.studies.verify import BEST, Spread, Verification
from opbench.workloads.models import cache
from opbench.workloads.models.extract import FusedOp
from opbench.workloads.models.quantize import MODEL_DTYPES, is_quantized, unquantized, with_dtype
from opbench.workloads.models.sources import ModelSource, load_model

ANSOR = ("resnet-50", "mobilenet-v2", "resnet3d-18", "dcgan", "bert-base")  # Ansor's table: batch 1 and 16
OTHERS = ("resnet-18", "vgg-16", "densenet-121", "inception-v3", "squeezenet1.1", "yolov3-tiny", "gcn")  # batch 1
CASES = [*((m, 1) for m in (*ANSOR, *OTHERS)), *((m, 16) for m in ANSOR)]
SEQ_LEN = 128
TARGETS_VS_EAGER = {"bert-base": 0.8, "resnet-50": 0.6, "mobilenet-v2": 0.4}  # issue 42's, at 2 threads, batch 1
TARGET_OF_CEILING = 0.75  # BERT's matmuls and ResNet's convolutions
GEMM_KINDS = {"matmuls": ("batch_matmul", "matmul", "dense"), "convolutions": ("conv2d",)}
FLOPS_COUNTED = {"matmuls": "their products", "convolutions": "direct convolution (a Winograd kernel computes fewer)"}
SYSTEMS = (EAGER_ROW, INDUCTOR, ONNXRUNTIME, OPENVINO, ZENTORCH, DEFAULTS, METASCHEDULE)
SPARSE_FORMS = ("gcn",)  # beside the dense baselines: PyTorch running the model's sparse form (not a baseline)
PROFILE_ROWS = 8  # of each model's time split: the largest by eager's time, then those that lose, then the rest
LOSING_SHARE = 0.01  # an operator beyond those that costs this share of our model's time more than OpenVINO's has a row
VERDICT_ROUNDS = 3  # fewer fresh-process rounds of a whole model give no spread to judge a target by
INLINE_NOTE_CHARS = 60  # a longer note (where a reused tuning came from) is a footnote under the table


OURS = "OpBench tuned"  # the tuned model's row
TARGET_VS_FP32 = 0.5  # issue 94's: a quantized model against our own fp32 build of it


def target_vs_best(model: str, batch: int) -> float:
    """The bar against the best baseline: issue 93's 0.9x for Ansor's five and resnet-18 at batch 1, else 1.0x;
    issue 94's 0.9x for a quantized model."""
    return 0.9 if is_quantized(model) or (batch == 1 and model in (*ANSOR, "resnet-18")) else 1.0


def vs_fp32(case: dict, finished: dict[str, dict]) -> str | None:
    """A quantized case's tuned latency over its fp32 model's at the same batch size, where this device finished
    that case with the same settings (each the median of its own run's verified rounds)."""
    name, batch = case["case"].rsplit("@", 1)
    fp32 = finished.get(f"{unquantized(name)}@{batch}") if is_quantized(name) else None
    if fp32 is None:
        return None
    ours, theirs = tuned_ms(case), tuned_ms(fp32)
    ratio = ours / theirs
    return (f"{'met' if ratio <= TARGET_VS_FP32 else 'NOT MET'}: <= {TARGET_VS_FP32}x our fp32 {fp32['case']}: "
            f"{ratio:.3g} ({ours:.4g} ms at commit {case['commit']} / {theirs:.4g} ms at commit {fp32['commit']}, "
            "each verified in its own run)")


def tuned_ms(case: dict) -> float:
    """The case's tuned model's verified median, ms (its table row's)."""
    return float(next(row for row in case["rows"] if row[1].startswith(OURS))[2].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-op", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-ops", type=int, default=12, help="key operators tuned per model, largest first")
    parser.add_argument("--models", nargs="+", help="these models (default: the table's), at --batch-sizes")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="only these batch sizes (with --models: each)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process verification rounds")
    parser.add_argument("--reuse", action="store_true", help="build from the tuning a run with the same key kept")
    parser.add_argument("--fresh", action="store_true", help="measure again the cases this device has finished")
    parser.add_argument("--dtype", choices=MODEL_DTYPES, default="float32",
                        help="int8: each model quantized (MODEL+int8), beside ONNX Runtime's, OpenVINO's and PyTorch's "
                             "int8 runs of it")
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s")  # progress on stderr: each operator as it is tuned, the verification
    logging.getLogger("opbench").setLevel(logging.INFO)
    cases = [(with_dtype(m, args.dtype), b) for m, b in ([(m, b) for m in args.models for b in args.batch_sizes or [1]]
                                                        if args.models else [(m, b) for m, b in CASES
                                                                             if not args.batch_sizes or b in args.batch_sizes])]
    store = CaseStore("models_vs_frameworks", {"threads": args.threads, "trials_per_op": args.trials_per_op,
                                               "max_ops": args.max_ops, "rounds": args.rounds, "seq_len": SEQ_LEN})
    done = {} if args.fresh else store.done()
    scratch = Path(tempfile.mkdtemp(prefix="opbench-models-"))
    started, ceiling = time.monotonic(), None
    for model, batch in cases:
        name = f"{model}@{batch}"
        if name in done:
            print(f"=== {name}: kept from commit {done[name]['commit']}, {done[name]['date']} (--fresh measures it again)")
            continue
        print(f"=== {name}", flush=True)
        ceiling = ceiling or gemm_ceiling(args.threads)
        done[name] = store.add(name, run_case(model, batch, args, scratch, ceiling))
    report([done[f"{m}@{b}"] for m, b in cases if f"{m}@{b}" in done], args, store, time.monotonic() - started,
           store.done())


def run_case(model: str, batch: int, args: argparse.Namespace, scratch: Path, ceiling: tuple[float, str]) -> dict:
    """One model at one batch size tuned, verified and profiled: its rows, verdicts and time split (JSON-ready)."""
    started = time.monotonic()
    spec = ModelTuneSpec(ModelSpec(model, batch=batch, seq_len=SEQ_LEN, threads=args.threads),
                         args.trials_per_op, args.max_ops, EngineSpec(seed=0, storage=f"sqlite:///{scratch / 'optuna.db'}"),
                         args.rounds, tracking_uri=f"sqlite:///{scratch / 'mlflow.db'}",
                         systems=SYSTEMS + ((TORCH_SPARSE,) if model in SPARSE_FORMS else ())
                         + ((TORCH_INT8,) if is_quantized(model) else ()),
                         reuse=tuned_models_dir() if args.reuse else None)
    result = tune_model(spec)
    verified = result.verification
    assert verified is not None, "--rounds must be >= 1: every number printed here is verified"
    rows, footnotes = model_rows(f"{model}@{batch}", verified)
    ops = cache.extract(model, batch, SEQ_LEN)[0]
    with Measurer() as measurer:
        built = measurer.profile_models([(result.database / TUNED, result.database / INPUTS)], Resources(args.threads))[0]
        int8_peak = measurer.peak_gflops(Resources(args.threads), "int8") if is_quantized(model) else None
    yardstick = (int8_peak, "the host's measured int8 peak") if int8_peak else (ceiling[0], "the GEMM ceiling")
    return {"rows": rows, "footnotes": footnotes, "ceiling": ceiling_line(*ceiling),
            "verdicts": targets(model, batch, verified) + of_ceiling(model, ops, result, built, yardstick),
            "split": where_time_goes(model, batch, ops, built, args.threads, scratch / f"{model}@{batch}"),
            "wall_min": (time.monotonic() - started) / 60}


def report(cases: list[dict], args: argparse.Namespace, store: CaseStore, wall_s: float, finished: dict[str, dict]
           ) -> None:
    """The table of every case this device finished with these settings, each with where it was measured
    (``finished``: every case this device finished, by name, for a quantized model's fp32 one)."""
    results = Results("models_vs_frameworks")
    results.print(f"\n{args.threads} threads, {args.trials_per_op} trials per key operator (at most {args.max_ops} "
                  f"per model); verified: median of {args.rounds} fresh-process rounds (min-max); device {store.device}; "
                  f"every case kept in {store.path.relative_to(RESULTS.parent)}")
    results.table(table([row for case in cases for row in case["rows"]],
                        ["case", "system", "verified ms (min-max)", "latency / eager", "OpBench tuned / this", "errors"]))
    for line in [line for case in cases for line in case["footnotes"]] + sorted({case["ceiling"] for case in cases}):
        results.print(line)
    for case in cases:
        results.print(f"{case['case']} (commit {case['commit']}, {case['date']}, {case['wall_min']:.1f} min): "
                      + "; ".join(case["verdicts"] + list(filter(None, [vs_fp32(case, finished)]))))
    results.print("\nWhere the time goes, ms per run, each side inside its model: our tuned build's operators (the Relax "
                  "VM's instrumentation) beside PyTorch eager's (profiler) and OpenVINO's (its per-layer counters)")
    results.table(table([_with_openvino(row) for case in cases for row in case["split"]],
                        ["case", "operator (what it computes)", "eager ms", "OpenVINO ms", "ours ms", "ours / eager",
                         "ours / OpenVINO"]))
    results.print(f"this run: {wall_s / 60:.1f} minutes{' (reusing kept tuning where its key matched)' if args.reuse else ''}")
    results.save()


def of_ceiling(model: str, fused: list[FusedOp], result: ModelTuneResult, built: dict[str, float],
               yardstick: tuple[float, str]) -> list[str]:
    """The tuned model's matmuls and convolutions against ``yardstick`` (GFLOP/s and its name: the GEMM ceiling, a
    quantized model's the host's int8 peak): a verdict for the kind the issue names for the model, a line for the
    others. A convolution's FLOPs are the direct convolution's, whichever algorithm ran it (a Winograd kernel
    computes fewer, so it can pass the ceiling). Their time is their share of the tuned build's profile (``built``, one process, in whatever phase the
    host was) times the tuned model's verified latency (fresh processes)."""
    ceiling, against = yardstick
    ops = {op.name: op for op in fused}
    verified = result.verification.schedules.get(BEST) if result.verification else None
    latency = verified.latency if verified else None
    lines = []
    for label, kinds in GEMM_KINDS.items():
        names = [r[0] for r in result.rows if r[1] in kinds and r[-1] != "untuned" and r[0] in built]
        if not names:
            continue
        named = (model, label) in (("bert-base", "matmuls"), ("resnet-50", "convolutions"))
        what = (f"{model}'s {label} against {against} (target {TARGET_OF_CEILING:.0%} of the GEMM ceiling for "
                "bert-base's matmuls and resnet-50's convolutions)")
        if latency is None:
            lines.append(f"not verified: {what}")
            continue
        theirs, profiled = sum(built[n] for n in names), sum(built.values())
        ms = theirs / profiled * latency.median
        gflops = sum(ops[n].flops * ops[n].calls for n in names) / (ms * 1e-3) / 1e9
        share = gflops / ceiling
        verdict = ("met" if share >= TARGET_OF_CEILING else "NOT MET") if named else "info"
        lines.append(f"{verdict}: {what}: {gflops:.1f} GFLOP/s of {FLOPS_COUNTED[label]}, {share:.0%} of it "
                     f"({ms:.1f} ms a run: their share of the tuned build's "
                     f"profile, {theirs:.1f} of {profiled:.1f} ms, times its verified {latency.median:.4g} ms)")
    return lines


def where_time_goes(model: str, batch: int, ops: list[FusedOp], built: dict[str, float], threads: int, folder: Path
                    ) -> list[tuple]:
    """The model's operators, ours (timed inside the tuned build, ``built``: all calls of a run) beside eager's and
    OpenVINO's (its export made in ``folder``; a column of "-" where OpenVINO cannot run): the
    :data:`PROFILE_ROWS` largest by eager's time, then each other one that loses to OpenVINO by at least
    :data:`LOSING_SHARE` of our total, the rest in one row, and the totals."""
    source = load_model(model, batch, SEQ_LEN)
    baselines = {"eager": profile_eager(source, 5, threads), OPENVINO: _openvino_profile(source, threads, folder)}
    matched = match(ours(ops, built), baselines)
    kinds = [m for m in matched if m.signature != OTHER]
    loss_shown = LOSING_SHARE * _total(m.ours_ms for m in matched)
    named = kinds[:PROFILE_ROWS] + [m for m in kinds[PROFILE_ROWS:]
                                    if m.ours_ms - m.theirs_ms.get(OPENVINO, math.nan) >= loss_shown]
    rest = [m for m in matched if m not in named]
    shown = [(" ".join(map(str, m.signature)), m.theirs_ms, m.ours_ms) for m in named]
    shown += [("everything else", {b: _total(m.theirs_ms[b] for m in rest) for b in baselines}, _total(m.ours_ms for m in rest)),
              ("total", {b: _total(m.theirs_ms[b] for m in matched) for b in baselines}, _total(m.ours_ms for m in matched))]
    return [(f"{model}@{batch}", what, *(_ms(theirs[b]) for b in baselines), _ms(mine),
             *(_ratio_text(mine, theirs[b]) for b in baselines))
            for what, theirs, mine in shown]


def _openvino_profile(source: ModelSource, threads: int, folder: Path) -> list[OpTime]:
    """OpenVINO's layers inside the model as its row runs it (none where it cannot run here, or its profile
    fails: a diagnostic's column, which must not cost the case its verified rows)."""
    if why := unavailable(OPENVINO):
        print(f"{source.name}: no OpenVINO profile: {why}")
        return []
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return profile_openvino(framework_onnx(OPENVINO, source, None, folder), source.inputs, 5, threads)
    except Exception as exc:  # noqa: BLE001 - any failure of the diagnostic is a column of "-", said why
        print(f"{source.name}: no OpenVINO profile: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
        return []


def _ratio_text(mine: float, theirs: float) -> str:
    return f"{mine / theirs:.2f}" if theirs > 0 and mine == mine else "-"


def _with_openvino(row: Sequence[str]) -> tuple[str, ...]:
    """A row of the time split; a case kept from before OpenVINO's column with "-" in it."""
    if len(row) == 5:
        case, what, eager, mine, ratio = row
        return case, what, eager, "-", mine, ratio, "-"
    return tuple(row)


def _total(values: Iterable[float]) -> float:
    """The sum of the values a side has (NaN: it has none of these operators, or no profile at all)."""
    known = [v for v in values if v == v]
    return sum(known) if known else math.nan


def _ms(value: float) -> str:
    return f"{value:.3f}" if value == value else "-"


def model_rows(case: str, verified: Verification) -> tuple[list[tuple], list[str]]:
    """The case's table rows, and its footnotes: a note too long for its row (where a reused tuning came from),
    the row pointing to it."""
    rows, footnotes = [], []
    for name, schedule in verified.schedules.items():
        shown = {BEST: OURS, DEFAULTS: "TVM template defaults", METASCHEDULE: "MetaSchedule"}.get(name, name)
        note = verified.notes.get(name, "")
        if len(note) > INLINE_NOTE_CHARS:
            footnotes.append(f"[{case} {len(footnotes) + 1}] {shown}: {note}")
            note = f"see [{case} {len(footnotes)}]"
        if note:
            shown += f" ({note})"
        rows.append((case, shown, spread_text(schedule.latency), spread_text(_ratio(verified, name, EAGER_ROW)),
                     spread_text(_ratio(verified, BEST, name)) if name != BEST else "-", "; ".join(schedule.errors)[:100] or "-"))
    return rows, footnotes


def targets(model: str, batch: int, verified: Verification) -> list[str]:
    """Whether the tuned model met the issues' targets on this host, from the verified rounds."""
    ran = {n: verified.schedules[n].latency for n in FRAMEWORK_ROWS if n in verified.schedules}
    ran = {n: lat for n, lat in ran.items() if lat is not None}
    lines = []
    if ran:
        best = min(ran, key=lambda n: ran[n].median)  # type: ignore[union-attr]
        lines.append(_verdict(f"<= {target_vs_best(model, batch)}x the best baseline ({best})",
                              _ratio(verified, BEST, best), target_vs_best(model, batch), verified.rounds))
    if METASCHEDULE in verified.schedules:
        lines.append(_verdict(f"<= {target_vs_best(model, batch)}x MetaSchedule at equal trials",
                              _ratio(verified, BEST, METASCHEDULE), target_vs_best(model, batch), verified.rounds))
    if model in TARGETS_VS_EAGER and batch == 1:
        lines.append(_verdict(f"<= {TARGETS_VS_EAGER[model]}x eager", _ratio(verified, BEST, EAGER_ROW),
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
