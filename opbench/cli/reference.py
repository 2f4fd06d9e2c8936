"""``python -m opbench.cli.reference [cli|records]``: the command reference (every command's ``--help``)
and the record's columns (from :class:`opbench.record.TrialRecord`) as Markdown, what
``docs/reference/cli.md`` and ``docs/reference/records.md`` hold (``make docs`` writes them; a test checks
that they are current)."""
from __future__ import annotations

import argparse
import inspect
import os
import re
import sys


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _subcommands(sub, f"{prefix} {name}")
    return out


def cli_reference() -> str:
    """Markdown: a section per command, its help as argparse prints it at 100 columns."""
    from opbench.cli import build_parser
    from opbench.engines.optuna.storage import STORAGE_ENV

    # argparse wraps to the terminal, and $OPBENCH_STORAGE makes `worker --storage` optional: the file
    # must depend on neither
    saved = {k: os.environ.pop(k, None) for k in ("COLUMNS", STORAGE_ENV)}
    os.environ["COLUMNS"] = "100"
    try:
        commands = _subcommands(build_parser(), "opbench")
        parts = ["# Command reference\n\nGenerated from the parser (`make docs`): every command's `--help`.\n"]
        parts += [f"## `{name}`\n\n```\n{parser.format_help().rstrip()}\n```\n" for name, parser in commands]
    finally:
        os.environ.pop("COLUMNS")
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    return "\n".join(parts)


def record_reference() -> str:
    """Markdown: the record's columns as :class:`~opbench.record.TrialRecord` declares them, a table per
    group of fields (its comment), each column with where it lives in MLflow and its comment."""
    from opbench.record import TrialRecord, kind_of

    parts = ["# TrialRecord columns\n\nGenerated from `opbench.record.TrialRecord` (`make docs`). Params and tags are "
             "strings in MLflow, metrics numbers; `knob.<name>` columns are params, `feat.<name>` columns one JSON "
             "artifact per run (`features.json`); `mem.<name>` columns, bytes (`opbench.measure.memory`: "
             "`mem.input`, `mem.output`, `mem.<scope>` peaks, `mem.workspace` their sum, `mem.workspace_total` "
             "with a parallel loop's buffers once per thread, `mem.prepacked`; a torch baseline's only "
             "`mem.torch_allocated`, what PyTorch's profiler saw its operators allocate in one call), sit in that "
             "artifact too, but for `mem.workspace`, a metric; any other column is a tag.\n"]
    field = re.compile(r"^    (\w+): ([^=]+?) = [^#]*?(?:#\s*(.*))?$")
    for line in inspect.getsource(TrialRecord).splitlines():
        if (heading := re.match(r"^    # (.*)$", line)) is not None:
            parts.append(f"\n## {heading.group(1)[0].upper()}{heading.group(1)[1:]}\n\n| column | in MLflow | type | notes |\n"
                         "|---|---|---|---|")
        elif (column := field.match(line)) is not None and column.group(1) not in ("knobs", "features", "tags"):
            name, kind = column.group(1), kind_of(column.group(1))
            type_ = column.group(2).replace(" | None", "").strip()  # every column may be missing
            parts.append(f"| `{name}` | {kind} | `{type_}` | {column.group(3) or ''} |")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(record_reference() if sys.argv[1:] == ["records"] else cli_reference(), end="")
