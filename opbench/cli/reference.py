"""``python -m opbench.cli.reference``: the command reference (every command's ``--help``) as Markdown,
what ``docs/reference/cli.md`` holds (``make docs`` writes it; a test checks that it is current)."""
from __future__ import annotations

import argparse
import os


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


if __name__ == "__main__":
    print(cli_reference(), end="")
