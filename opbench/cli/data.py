"""``opbench dataset``, ``opbench predictor`` and ``opbench predict``: tuning logs as data."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from opbench.argtypes import positive_int
from opbench.exceptions import OpBenchError
from opbench.report.progress import table


def cmd_dataset_export(args: argparse.Namespace) -> int:
    from opbench.tracking.dataset import card, load_records, write_dataset

    frame = load_records(args.source, args.experiment or (), args.log or (), args.tracking_uri,
                         args.status or (), args.op or (), args.host or (), args.kind)
    if frame.empty:
        raise OpBenchError("no records match: check --experiment/--log and the filters")
    path = write_dataset(frame, args.out)
    print(card(frame))
    print(f"wrote {path}")
    return 0


def cmd_dataset_import_ms(args: argparse.Namespace) -> int:
    from opbench.tracking import Recorder
    from opbench.tracking.dataset import card, write_dataset
    from opbench.tracking.dataset.metaschedule_import import import_metaschedule
    from opbench.tracking.jsonl import records_frame

    study = args.study or f"ms-import-{Path(args.folder).resolve().name}"
    records = import_metaschedule(args.folder, study)
    with Recorder(study, args.tracking_uri) as recorder:
        for record in records:
            recorder(record)
    frame = records_frame(records)
    print(card(frame))
    if args.out:
        print(f"wrote {write_dataset(frame, args.out)}")
    print(f"{len(records)} records in MLflow experiment '{study}'")
    return 0


def _log_predictor_run(args: argparse.Namespace, model, metrics: dict[str, float], plot: Path, n_train: int) -> None:
    import mlflow.xgboost

    import mlflow
    from opbench.tracking.mlflow_store import default_tracking_uri, ensure_store, experiment_id

    uri = args.tracking_uri or default_tracking_uri()
    exp = experiment_id(ensure_store(uri), args.study, uri)
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=exp, run_name=f"xgb-{args.split}", tags={"opbench.kind": "predictor"}):
        mlflow.log_params({"data": str(args.data), "split": args.split, "seed": args.seed, "n_train": n_train,
                           "n_features": len(model.columns)})
        mlflow.log_metrics({k: v for k, v in metrics.items() if v == v})
        mlflow.log_artifact(str(plot), "plots")
        mlflow.xgboost.log_model(model.booster, name="model")


def _metrics_table(metrics: dict[str, float]) -> str:
    return table([list(metrics.values())], list(metrics))


def cmd_predictor_train(args: argparse.Namespace) -> int:
    from opbench.predictor.model import LatencyModel, evaluate, split
    from opbench.report.plots import predicted_vs_measured
    from opbench.tracking.dataset import read_dataset

    train, test = split(read_dataset(args.data), args.split, args.seed)
    model = LatencyModel(seed=args.seed).fit(train)
    metrics = evaluate(model, test)
    out = Path(args.out)
    model.save(out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    plot = predicted_vs_measured(test["latency_ms"], model.predict(test),
                                 f"held-out ({args.split}): {len(test)} trials", out / "predicted_vs_measured.png")
    _log_predictor_run(args, model, metrics, plot, len(train))
    print(f"trained on {len(train)} trials, {len(model.columns)} features; held out {len(test)} ({args.split}):")
    print(_metrics_table(metrics))
    print(f"model, metrics and plot in {out} (and an MLflow run in experiment '{args.study}')")
    return 0


def cmd_predictor_eval(args: argparse.Namespace) -> int:
    from opbench.predictor.model import LatencyModel, evaluate
    from opbench.tracking.dataset import read_dataset

    print(_metrics_table(evaluate(LatencyModel.load(args.model), read_dataset(args.data))))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import pandas as pd

    from opbench.hardware.resources import Resources, host_facts
    from opbench.hardware.targets import make_target
    from opbench.measure.features import schedule_features, static_features
    from opbench.predictor.model import LatencyModel
    from opbench.space import get_template
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
    features = static_features(workload, config, template.name, resources, host_facts())
    if any(c.startswith("feat.ms") for c in model.columns):
        features.update(schedule_features(template.schedule(workload, config), make_target("llvm", args.threads)))
    latency = float(model.predict(pd.DataFrame([features]))[0])
    print(f"{workload.name} threads={args.threads}: predicted {latency:.4f} ms "
          f"({workload.flops / (latency * 1e-3) / 1e9:.1f} GFLOP/s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dataset", help="tuning logs as datasets")
    data = p.add_subparsers(dest="dataset_command", required=True)
    p = data.add_parser("export", help="the record table (one row per trial, with features) to a file")
    p.add_argument("--experiment", action="append", help="MLflow experiment (study); repeat; default: all")
    p.add_argument("--from", dest="source", default="mlflow", choices=("mlflow", "jsonl"))
    p.add_argument("--log", action="append", help="JSON-lines log (with --from jsonl); repeat")
    p.add_argument("--status", action="append", help="keep only these statuses, e.g. ok; repeat")
    p.add_argument("--op", action="append", help="keep only these operators; repeat")
    p.add_argument("--host", action="append", help="keep only these hosts; repeat")
    p.add_argument("--kind", default="trial", choices=("trial", "corun"),
                   help="trial records (co-run members included), or the co-runs' own records")
    p.add_argument("--tracking-uri")
    p.add_argument("--out", required=True, help="F.parquet or F.csv")
    p.set_defaults(func=cmd_dataset_export)
    p = data.add_parser("import-metaschedule", help="a MetaSchedule JSON database as records in MLflow")
    p.add_argument("folder", help="folder with database_workload.json and database_tuning_record.json")
    p.add_argument("--study", help="MLflow experiment (default ms-import-<folder>)")
    p.add_argument("--tracking-uri")
    p.add_argument("--out", help="also write the records to F.parquet or F.csv")
    p.set_defaults(func=cmd_dataset_import_ms)

    p = sub.add_parser("predictor", help="train and evaluate the XGBoost latency predictor")
    pred = p.add_subparsers(dest="predictor_command", required=True)
    p = pred.add_parser("train", help="train on a dataset, report metrics on a held-out split")
    p.add_argument("--data", required=True, help="a dataset from `opbench dataset export`")
    p.add_argument("--split", default="random", choices=("random", "by-op", "by-threads", "by-model"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for model.json, columns.json, metrics.json, the plot")
    p.add_argument("--study", default="predictor", help="MLflow experiment for the run")
    p.add_argument("--tracking-uri")
    p.set_defaults(func=cmd_predictor_train)
    p = pred.add_parser("eval", help="metrics of a saved predictor on a dataset")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.set_defaults(func=cmd_predictor_eval)
    p = sub.add_parser("predict", help="predicted latency of a workload under a config")
    p.add_argument("workload")
    p.add_argument("--model", required=True, help="folder of a trained predictor")
    p.add_argument("--config", help="knob values as a JSON object (default: the template default)")
    p.add_argument("--template")
    p.add_argument("--threads", type=positive_int, default=1)
    p.set_defaults(func=cmd_predict)
