"""Writes a ready NNI experiment folder: ``config.yml``, ``search_space.json`` and a README line."""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opbench import settings
from opbench.engines.nni.engine import EVOLUTION_POPULATION, TUNERS
from opbench.exceptions import OpBenchError, SearchSpaceError
from opbench.hardware.resources import Resources
from opbench.paths import PROJECT_ROOT
from opbench.space import get_template
from opbench.workloads import parse_workload

# The project's virtual environment when there is one (trials run from the project root), else python3.
PYTHON = "$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)"
MODEL_TUNER = "opbench.integration.nni.model_tuner.ModelTuner"  # OpBench's model engine as a custom NNI tuner
ORDER_SAFE_TPE = "opbench.engines.nni.tuners.OrderSafeTpe"  # NNI's TPE, safe with a result after the trial's end
EXPERIMENT_TUNERS = (*TUNERS, "Model")


@dataclass
class ExperimentSpec:
    workload: str
    tuner: str = "TPE"
    trials: int = 64
    concurrency: int = 1
    threads: int = 1
    search_threads: list[int] | None = None
    study: str | None = None
    seed: int | None = 0
    repeat: int = settings.REPEAT
    template: str | None = None
    knobs: dict[str, list[Any] | None] | None = None  # search only these knobs (values optional)
    warm_start: str | None = None  # tuner Model: train its first predictor on this dataset
    target: str = "llvm"
    device: str = "local"  # or rpc://HOST:PORT/KEY: each concurrent trial gets its own device of the key


def class_args(tuner: str, seed: int | None) -> dict[str, Any]:
    """The ``tuner.classArgs`` NNI's built-in tuner takes to minimise latency."""
    if tuner not in TUNERS:
        raise OpBenchError(f"unknown NNI tuner '{tuner}'; tuners: {', '.join(EXPERIMENT_TUNERS)}")
    args: dict[str, Any] = {} if tuner in ("GridSearch", "Random") else {"optimize_mode": "minimize"}
    if tuner in ("TPE", "Random") and seed is not None:
        args["seed"] = seed
    if tuner == "Evolution":
        args["population_size"] = EVOLUTION_POPULATION
    return args


def tuner_config(spec: ExperimentSpec, out: Path) -> dict[str, Any]:
    """The config's ``tuner`` section: a built-in tuner by name, or by class where OpBench's is used
    (its model tuner; TPE, as :class:`~opbench.engines.nni.tuners.OrderSafeTpe`)."""
    code = os.path.relpath(PROJECT_ROOT, out.resolve())
    if spec.tuner != "Model":
        if spec.warm_start:
            raise OpBenchError("--warm-start needs --tuner Model")
        args = class_args(spec.tuner, spec.seed)
        if spec.tuner == "TPE":
            return {"codeDirectory": code, "className": ORDER_SAFE_TPE, "classArgs": args}
        return {"name": spec.tuner, **({"classArgs": args} if args else {})}
    args = {"workload": spec.workload, "threads": spec.threads, "seed": spec.seed}
    if spec.template:
        args["template"] = spec.template
    if spec.warm_start:
        path = Path(spec.warm_start).resolve()  # the dispatcher's working directory is NNI's, not ours
        if not path.is_file():
            raise OpBenchError(f"warm-start dataset {spec.warm_start} does not exist")
        args["warm_start"] = str(path)
    return {"codeDirectory": code, "className": MODEL_TUNER, "classArgs": args}


def restrict_space(space: dict[str, Any], knobs: dict[str, list[Any] | None]) -> dict[str, Any]:
    """Keep only ``knobs`` (the rest take the template default), optionally only some of their values."""
    out = {}
    for name, values in knobs.items():
        if name not in space:
            raise SearchSpaceError(f"knob '{name}' is not in the search space (knobs: {', '.join(space)})")
        choices = space[name]["_value"]
        bad = [v for v in values or () if v not in choices]
        if bad:
            raise SearchSpaceError(f"knob '{name}': values {bad} are not among its choices {choices}")
        out[name] = {"_type": "choice", "_value": list(values) if values else choices}
    return out


def trial_command(spec: ExperimentSpec, study: str) -> str:
    args = [spec.workload, "--threads", str(spec.threads), "--study", study, "--tuner", spec.tuner,
            "--repeat", str(spec.repeat)]
    if spec.template:
        args += ["--template", spec.template]
    if spec.target != "llvm":
        args += ["--target", spec.target]
    if spec.device != "local":
        args += ["--device", spec.device]
    return f"{PYTHON} -m opbench.integration.nni.trial " + " ".join(shlex.quote(a) for a in args)


def write_experiment(spec: ExperimentSpec, out: Path) -> Path:
    """Write ``out/config.yml`` (+ search space, README); returns the config path."""
    import yaml

    workload = parse_workload(spec.workload)
    if spec.trials < 1 or spec.concurrency < 1:
        raise OpBenchError(f"--trials and --concurrency must be >= 1, got {spec.trials} and {spec.concurrency}")
    Resources(spec.threads, target=spec.target, device=spec.device)  # a bad target or device fails here
    space = get_template(workload, spec.template, spec.target).search_space(workload)
    if spec.knobs:
        space = restrict_space(space, spec.knobs)
    if spec.search_threads:
        space["threads"] = {"_type": "choice", "_value": spec.search_threads}
    if not space:
        raise OpBenchError(f"template of {workload.name} has no knobs to tune")
    study = spec.study or f"nni-{out.name}"
    config = {
        "experimentName": f"opbench-{out.name}",
        "searchSpaceFile": "search_space.json",
        "trialCodeDirectory": os.path.relpath(PROJECT_ROOT, out.resolve()),
        "trialCommand": trial_command(spec, study),
        "trialConcurrency": spec.concurrency,
        "maxTrialNumber": spec.trials,
        "tuner": tuner_config(spec, out),
        "trainingService": {"platform": "local", "useActiveGpu": False},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "search_space.json").write_text(json.dumps(space, indent=2) + "\n")
    path = out / "config.yml"
    tuner = {"Model": f"OpBench's model engine ({MODEL_TUNER})",
             "TPE": f"NNI's TPE ({ORDER_SAFE_TPE}: fixes microsoft/nni#5689)"}.get(spec.tuner, f"NNI's {spec.tuner}")
    header = (f"# {workload.name} tuned by {tuner}: {spec.trials} trials, {spec.concurrency} at a time.\n"
              f"# Written by `opbench nni new`. Run from anywhere: nnictl create --config {path}\n"
              f"# Trials log to the MLflow experiment '{study}' (opbench ui).\n")
    path.write_text(header + yaml.safe_dump(config, sort_keys=False, width=1000))
    (out / "README.md").write_text(
        f"# {out.name}\n\n{workload.name} ({workload.spec}) tuned by {tuner}: "
        f"{spec.trials} trials, concurrency {spec.concurrency}, "
        f"threads {'searched over ' + str(spec.search_threads) if spec.search_threads else spec.threads}. "
        f"`nnictl create --config {path}`; results in the MLflow experiment `{study}`.\n")
    return path
