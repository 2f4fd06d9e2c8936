"""``opbench dataset``, ``opbench predictor`` and ``opbench predict``: tuning logs as data."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from opbench.argtypes import nonneg_int, positive_float, positive_int
from opbench.exceptions import OpBenchError
from opbench.paths import OPEN_DATASET_DIR
from opbench.predictor import PREDICTORS
from opbench.report.progress import table


def dataset_file(value: str) -> str:
    """``--out``: a file whose suffix names a dataset format."""
    from opbench.tracking.dataset.formats import FORMATS

    if Path(value).suffix not in FORMATS:
        raise argparse.ArgumentTypeError(f"'{value}': dataset files end in {', '.join(FORMATS)}")
    return value


def cmd_dataset_export(args: argparse.Namespace) -> int:
    from opbench.tracking.dataset import card, export_mlflow, load_records, write_dataset
    from opbench.tracking.dataset.export import describe
    from opbench.tracking.dataset.formats import CSV_NOTE
    from opbench.tracking.dataset.sources import Filters

    if args.source == "mlflow":
        filters = Filters(tuple(args.status or ()), tuple(args.op or ()), tuple(args.host or ()), args.kind)
        exported = export_mlflow(args.out, args.experiment or (), args.tracking_uri, filters)
        if not exported.rows:
            Path(args.out).unlink(missing_ok=True)
            raise OpBenchError("no records match: check --experiment and the filters")
        print(describe(exported))
        print(f"read {exported.segments} segment(s); {exported.read_run_by_run} record(s) no segment holds, run by run")
    else:
        frame = load_records(args.source, (), args.log or (), args.tracking_uri, args.status or (), args.op or (),
                             args.host or (), args.kind)
        if frame.empty:
            raise OpBenchError("no records match: check --log and the filters")
        write_dataset(frame, args.out)
        print(card(frame))
    if Path(args.out).suffix == ".csv":
        print(CSV_NOTE)
    print(f"wrote {args.out}")
    return 0


def cmd_dataset_import(args: argparse.Namespace) -> int:
    from opbench.tracking.dataset.importer import import_dataset

    study = args.study or f"import-{Path(args.path).resolve().stem}"
    done = import_dataset(args.path, study, args.tracking_uri, args.runs)
    print(f"{done.read} records read from {args.path}: {done.added} added to study '{study}', {done.skipped} it "
          f"already held (import run {done.parent_run_id}{', with a run per record' if args.runs else ''})")
    if args.out:
        from opbench.tracking.dataset import export_mlflow
        from opbench.tracking.dataset.sources import Filters

        export_mlflow(args.out, [study], args.tracking_uri, Filters(kind="trial"))
        print(f"wrote {args.out}")
    return 0


def cmd_dataset_collect(args: argparse.Namespace) -> int:
    from opbench.provenance import source_commit
    from opbench.studies.collect import WORKLOADS, collect
    from opbench.tracking.dataset.open_dataset import OpenDataset
    from opbench.workloads import parse_workload

    workloads = args.workload or WORKLOADS
    for name in workloads:
        parse_workload(name)  # a bad name exits 2 before anything is measured
    dataset = OpenDataset(Path(args.root), commit=source_commit())
    print(f"collecting into {dataset.partition} for {args.minutes:g} minutes: up to {args.trials} random trials of "
          f"each of {len(workloads)} workloads, {args.threads} thread(s)", flush=True)
    done = collect(dataset, args.minutes, args.trials, args.threads, workloads, lambda line: print(line, flush=True))
    print(f"{done.trials} trials run, {done.added} rows added to {dataset.partition} (card: {args.root}/_CARD.md)")
    return 0


def cmd_dataset_featurize(args: argparse.Namespace) -> int:
    from opbench.measure.features import FEATURES_VERSION
    from opbench.tracking.dataset import write_dataset
    from opbench.tracking.dataset.export import read_dataset
    from opbench.tracking.dataset.featurize import OLDER_VERSIONS, add_features

    frame = read_dataset(args.data)
    frame, done = add_features(frame, lambda count, total: print(f"  {count}/{total} records", flush=True), args.jobs)
    write_dataset(frame, args.out)
    for workload, why in done.unparsed.items():
        print(f"  left as they were: the records of '{workload}' ({why})")
    print(f"{done.added} of {len(frame)} records given the features they lacked (features version "
          f"{' or '.join(OLDER_VERSIONS)} -> {FEATURES_VERSION}); wrote {args.out}")
    return 0


def _metrics_table(metrics: dict[str, float]) -> str:
    return table([list(metrics.values())], list(metrics))


def cmd_predictor_train(args: argparse.Namespace) -> int:
    from opbench.predictor.model import LatencyModel, evaluate, feature_columns, split
    from opbench.report.plots import predicted_vs_measured
    from opbench.tracking import log_run
    from opbench.tracking.dataset import read_dataset

    train, test = split(read_dataset(args.data), args.split, args.seed)
    model = LatencyModel(feature_columns(train, static_only=True) if args.static_only else None, args.seed).fit(train)
    metrics = evaluate(model, test)
    out = Path(args.out)
    model.save(out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    plot = predicted_vs_measured(test["latency_ms"], model.predict(test),
                                 f"held-out ({args.split}): {len(test)} trials", out / "predicted_vs_measured.png")
    log_run(args.study, f"xgb-{args.split}", "predictor",
            {"data": str(args.data), "split": args.split, "seed": args.seed, "n_train": len(train),
             "n_features": len(model.columns)}, metrics, (plot,), model.booster, args.tracking_uri)
    print(f"trained on {len(train)} trials, {len(model.columns)} features; held out {len(test)} ({args.split}):")
    print(_metrics_table(metrics))
    print(f"model, metrics and plot in {out} (and an MLflow run in experiment '{args.study}')")
    return 0


def cmd_predictor_eval(args: argparse.Namespace) -> int:
    from opbench.predictor.model import LatencyModel, evaluate
    from opbench.tracking.dataset import read_dataset

    print(_metrics_table(evaluate(LatencyModel.load(args.model), read_dataset(args.data))))
    return 0


def cmd_predictor_study(args: argparse.Namespace) -> int:
    from opbench.predictor.heldout import TOP_K, held_out_study, predictor
    from opbench.tracking.dataset import read_dataset

    result = held_out_study(read_dataset(args.data), args.hold_out, args.folds, args.seeds, predictor(args.predictor),
                            few_shot=args.few_shot)
    groups = result.by_group()
    columns = ["group", "tasks", "rows", *[f"top{k}" for k in TOP_K], "spearman", *[f"random_top{k}" for k in TOP_K]]
    print(table(groups[columns].itertuples(index=False), [c.replace("_", " ") for c in columns]))
    summary = result.summaries()
    for name, what in (("tenset", "TenSet (mean of the groups)"), ("tlp", "TLP (pooled over every task)"),
                       ("random", "a random pick (mean of the groups)")):
        print(f"{what}: " + ", ".join(f"top-{k} {summary[f'{name}_top{k}']:.3f}" for k in TOP_K))
    print(f"groups below a random pick's top-1: {summary['below_random']:.0f} of {len(groups)}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "folds.json").write_text(json.dumps({"hold_out": args.hold_out, "seeds": args.seeds, "predictor": args.predictor,
                                                    "folds": result.folds}, indent=2))
        groups.to_csv(out / "groups.csv", index=False)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"folds, per-group scores and the summary in {out}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import pandas as pd

    from opbench.hardware.resources import Resources, host_facts
    from opbench.hardware.targets import make_target
    from opbench.measure.assembly import config_assembly_features
    from opbench.measure.features import schedule_features, static_features
    from opbench.predictor.model import BUILT_FEATURE_PREFIXES, LatencyModel
    from opbench.space import get_template
    from opbench.tracking.dataset.open_dataset import device_facts
    from opbench.workloads import parse_workload

    try:
        config = json.loads(args.config) if args.config else {}
    except json.JSONDecodeError as exc:
        raise OpBenchError(f"--config: malformed JSON ({exc.msg} at column {exc.colno}): {args.config!r}") from None
    if not isinstance(config, dict):
        raise OpBenchError(f"--config must be a JSON object of knob values, got {type(config).__name__}")
    model = LatencyModel.load(args.model)
    workload = parse_workload(args.workload)
    template = get_template(workload, args.template)
    config = template.validate(config, workload)
    resources = Resources(args.threads)
    host = device_facts(args.device, Path(args.data)) if args.device else host_facts()
    features = static_features(workload, config, template.name, resources, host)
    if any(c.startswith(BUILT_FEATURE_PREFIXES) for c in model.columns):  # trained on what a build tells
        if args.device:
            raise OpBenchError(f"--device: {args.model} takes features of a build for this host's CPU; one trained "
                               "with `opbench predictor train --static-only` predicts for another device")
        target = make_target("llvm", args.threads)
        features.update(schedule_features(template.schedule(workload, config), target))
        features.update(config_assembly_features(workload, template, config, target))
    latency = float(model.predict(pd.DataFrame([features]))[0])
    print(f"{workload.name} threads={args.threads}{f' on {args.device}' if args.device else ''}: predicted {latency:.4f} ms "
          f"({workload.flops / (latency * 1e-3) / 1e9:.1f} GFLOP/s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    _register_dataset(sub)
    _register_predictor(sub)


def _register_dataset(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dataset", help="tuning logs as datasets")
    data = p.add_subparsers(dest="dataset_command", required=True)
    p = data.add_parser("export", help="the record table (one row per trial, with features) to a file, streamed")
    p.add_argument("--experiment", action="append", help="MLflow experiment (study); repeat; default: all")
    p.add_argument("--from", dest="source", default="mlflow", choices=("mlflow", "jsonl"))
    p.add_argument("--log", action="append", help="JSON-lines log (with --from jsonl); repeat")
    p.add_argument("--status", action="append", help="keep only these statuses, e.g. ok; repeat")
    p.add_argument("--op", action="append", help="keep only these operators; repeat")
    p.add_argument("--host", action="append", help="keep only these hosts; repeat")
    p.add_argument("--kind", default="trial", choices=("trial", "corun"),
                   help="trial records (co-run members included), or the co-runs' own records")
    p.add_argument("--tracking-uri")
    p.add_argument("--out", required=True, type=dataset_file,
                   help="F.parquet or F.jsonl (every value kept), or F.csv (a view)")
    p.set_defaults(func=cmd_dataset_export)
    for name, what in (("import", "a .parquet or .jsonl dataset, an Ansor (TenSet) .json log or a MetaSchedule "
                                  "database folder"),
                       ("import-metaschedule", "a MetaSchedule database folder (as `dataset import`)")):
        p = data.add_parser(name, help=f"{what} into a study; records it holds already are skipped")
        p.add_argument("path", help="F.parquet, F.jsonl, an Ansor log F.json, or a folder with database_workload.json "
                                    "and database_tuning_record.json")
        p.add_argument("--study", help="MLflow experiment (default import-<name>)")
        p.add_argument("--runs", action="store_true", help="also a run per record, to compare them in the MLflow UI")
        p.add_argument("--tracking-uri")
        p.add_argument("--out", type=dataset_file, help="also export the study to F.parquet, F.jsonl or F.csv")
        p.set_defaults(func=cmd_dataset_import)

    p = data.add_parser("collect", help="top up the open dataset with random trials on this host, for a time budget")
    p.add_argument("--minutes", type=positive_float, default=30.0, help="start no trial after this many minutes")
    p.add_argument("--trials", type=positive_int, default=64, help="random trials each workload is topped up to")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--workload", action="append", help="collect these workloads (repeat; default: the collection's)")
    p.add_argument("--root", default=str(OPEN_DATASET_DIR), help="the dataset (default: datasets/records in the checkout)")
    p.set_defaults(func=cmd_dataset_collect)

    p = data.add_parser("featurize", help="add the features a dataset's older records lack (the compute nest, the "
                                          "compiled assembly's), from their configs and the CPU each ran on")
    p.add_argument("data", help="a dataset from `opbench dataset export` (.parquet, .jsonl or .csv)")
    p.add_argument("--out", required=True, type=dataset_file, help="F.parquet, F.jsonl or F.csv")
    p.add_argument("--jobs", type=positive_int, default=1, help="processes building the older records' kernels")
    p.set_defaults(func=cmd_dataset_featurize)


def _register_predictor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predictor", help="train and evaluate the XGBoost latency predictor")
    pred = p.add_subparsers(dest="predictor_command", required=True)
    p = pred.add_parser("train", help="train on a dataset, report metrics on a held-out split")
    p.add_argument("--data", required=True, help="a dataset from `opbench dataset export`")
    p.add_argument("--split", default="random", choices=("random", "by-op", "by-threads", "by-model"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for model.json, columns.json, metrics.json, the plot")
    p.add_argument("--study", default="predictor", help="MLflow experiment for the run")
    p.add_argument("--tracking-uri")
    p.add_argument("--static-only", action="store_true", help="only the features known before a build (op, config, "
                   "loop nest, resources, host): it predicts for other devices too (`opbench predict --device`)")
    p.set_defaults(func=cmd_predictor_train)
    p = pred.add_parser("eval", help="metrics of a saved predictor on a dataset")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.set_defaults(func=cmd_predictor_eval)
    p = pred.add_parser("study", help="a model per fold, scored on the groups it never saw (TenSet's and TLP's top-k)")
    p.add_argument("--data", required=True, help="a dataset from `opbench dataset export`, or the open dataset's folder")
    p.add_argument("--hold-out", default="workload", choices=("workload", "op", "model", "device"),
                   help="what a fold holds out: canonical tasks (task_key), op kinds, source models or devices (device_key)")
    p.add_argument("--few-shot", type=nonneg_int, default=0, metavar="K",
                   help="K rows of each held-out group join its fold's training set (a new device's first "
                        "measurements; 0: zero-shot)")
    p.add_argument("--folds", type=positive_int, help="this many folds of groups (default: leave one group out)")
    p.add_argument("--seeds", type=positive_int, default=1, help="train each fold with this many seeds")
    p.add_argument("--predictor", default="latency", choices=PREDICTORS,
                   help="latency: XGBoost regression of log time per FLOP; normalised: of log latency over the task's "
                        "best; pairwise: XGBoost rank:pairwise within each task")
    p.add_argument("--out", help="folder for the folds, the per-group scores and the summary")
    p.set_defaults(func=cmd_predictor_study)
    p = sub.add_parser("predict", help="predicted latency of a workload under a config")
    p.add_argument("workload")
    p.add_argument("--model", required=True, help="folder of a trained predictor")
    p.add_argument("--config", help="knob values as a JSON object (default: the template default)")
    p.add_argument("--template")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--device", help="predict for this device key of the open dataset (default: this host)")
    p.add_argument("--data", default=str(OPEN_DATASET_DIR), help="the open dataset --device is read from")
    p.set_defaults(func=cmd_predict)
