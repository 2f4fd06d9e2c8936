"""``python -m opbench.integration.nni.service SOCKET [--idle-timeout S]``: run a measurement service (clients start it)."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from opbench.integration.nni.service.server import IDLE_TIMEOUT_S, serve
from opbench.lifecycle import skip_final_collection
from opbench.plugins import load_plugins

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m opbench.integration.nni.service", description=__doc__.splitlines()[0])
    parser.add_argument("socket", type=Path)
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S, help="seconds without a trial before it exits")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    load_plugins()
    serve(args.socket, args.idle_timeout)
    skip_final_collection()
