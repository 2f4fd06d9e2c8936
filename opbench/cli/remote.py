"""Remote devices on the command line: ``--device``/``--tracker``/``--key`` flags, ``opbench devices``,
``opbench targets`` and ``opbench board serve``."""
from __future__ import annotations

import argparse
from typing import Any

from opbench import settings
from opbench.argtypes import port, positive_float, positive_int
from opbench.exceptions import ResourceError
from opbench.hardware.resources import LOCAL
from opbench.report.progress import table


def add_device_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every command that measures: where kernels run."""
    g = p.add_argument_group("device (where kernels run)")
    g.add_argument("--device", help="local (default) or rpc://HOST:PORT/KEY: a device of KEY at a TVM RPC tracker")
    g.add_argument("--tracker", metavar="HOST:PORT", help="with --key: the same as --device rpc://HOST:PORT/KEY")
    g.add_argument("--key", help="device key at --tracker, e.g. pynq-z2")
    g.add_argument("--remote-workers", type=positive_int, default=1,
                   help="sessions held on the key's devices: up to this many trials run at once on distinct devices")
    g.add_argument("--connect-timeout", type=positive_float, default=settings.CONNECT_TIMEOUT_S,
                   help="seconds to wait for a free remote device")


def device_of(args: argparse.Namespace) -> str:
    """The device spec the flags name (``local`` by default); contradicting flags are an error."""
    if bool(args.tracker) != bool(args.key):
        raise ResourceError("--tracker and --key go together (or use --device rpc://HOST:PORT/KEY)")
    if args.tracker and args.device:
        raise ResourceError("give either --device or --tracker/--key, not both")
    if args.remote_workers < 1:
        raise ResourceError(f"--remote-workers must be >= 1, got {args.remote_workers}")
    return f"rpc://{args.tracker}/{args.key}" if args.tracker else (args.device or LOCAL)


def cmd_devices(args: argparse.Namespace) -> int:
    from opbench.hardware.devices import parse_tracker
    from opbench.measure.rpc import list_devices

    host, port = parse_tracker(args.tracker)
    keys = list_devices(host, port)
    if not keys:
        print(f"tracker {host}:{port}: no devices registered")
        return 0
    print(table([(k.key, len(k.servers), k.free, k.used, k.pending, " ".join(k.servers)) for k in keys],
                ["key", "devices", "free", "used", "pending requests", "servers"]))
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    import shutil

    from opbench.hardware.targets import BOARDS

    rows: list[tuple[Any, ...]] = [("llvm", "this host's CPU (AVX2/FMA as detected)", "-", "-"),
                                   ("cuda [-arch=sm_XX]", "NVIDIA GPU (local, or through a tracker)", "-", "-")]
    rows += [(b.name, b.description, b.compiler, "yes" if shutil.which(b.compiler) else "no: make cross")
             for b in BOARDS.values()]
    print(table(rows, ["target", "hardware", "cross compiler", "installed"]))
    return 0


def cmd_board_serve(args: argparse.Namespace) -> int:
    from opbench.hardware.board import serve
    from opbench.hardware.devices import parse_tracker

    serve(parse_tracker(args.tracker), args.key, args.host, args.port)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("devices", help="list the device keys at a TVM RPC tracker, free and used")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT")
    p.set_defaults(func=cmd_devices)
    sub.add_parser("targets", help="list compilation targets and board presets").set_defaults(func=cmd_targets)
    p = sub.add_parser("board", help="board side: serve this machine to a tracker")
    board = p.add_subparsers(dest="board_command", required=True)
    p = board.add_parser("serve", help="run TVM's RPC server with OpBench's board functions (facts, energy)")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT")
    p.add_argument("--key", required=True, help="device key to register under, e.g. pynq-z2")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default loopback: name the board's address on the tracker's network "
                        "to be reached; TVM RPC has no authentication)")
    p.add_argument("--port", type=port, default=9090, help="first port to try (up to +100)")
    p.set_defaults(func=cmd_board_serve)
