"""The trial's side of NNI 3.0's trial command channel, without importing NNI.

NNI's local training service (v3) hands each trial process an HTTP channel URL in
``NNI_TRIAL_COMMAND_CHANNEL``: the trial PUTs ``{"type": "request_parameter"}`` and GETs its parameter
record; it PUTs a ``metric`` command to report (``nni.runtime.command_channel.http`` and
``nni.runtime.trial_command_channel.v3`` are the reference). ``import nni`` costs ~2–3 s of CPU per
trial process (it pulls in pandas, numpy, json_tricks and more); these few JSON requests cost
milliseconds. Any other platform (NNI's legacy file channel, a standalone run) goes through NNI itself.
The requests go over a plain socket (:func:`_http`): ``urllib.request`` would cost the trial ~45 ms of
imports (ssl, email), which is what a whole request to the local manager costs ten times over.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_OK_STATUS = 200
_TIMEOUT_STATUS = 408  # the manager had nothing to send within its poll window: ask again
_GONE_STATUS = 410  # the manager is shutting down


@dataclass(frozen=True)
class TrialIdentity:
    experiment: str
    trial: str
    sequence: int


def identity() -> TrialIdentity:
    """This trial's experiment id, trial id and sequence number, from the environment NNI sets."""
    return TrialIdentity(os.environ.get("NNI_EXP_ID", "STANDALONE"), os.environ.get("NNI_TRIAL_JOB_ID", "STANDALONE"),
                         int(os.environ.get("NNI_TRIAL_SEQ_ID", "0")))


class TrialChannel:
    """Next parameter and final result: over HTTP where NNI offers it, else through ``nni``."""

    def __init__(self, url: str | None = None) -> None:
        self._url = url if url is not None else os.environ.get("NNI_TRIAL_COMMAND_CHANNEL", "")
        self._parameter_id: Any = None

    @property
    def _api(self) -> str:
        """NNI's REST API, beside the trial's channel (``<prefix>/env/<env>/<trial>``)."""
        return f"{self._url.split('/env/')[0]}/api/v1/nni"

    @property
    def direct(self) -> bool:
        """True when this channel talks to NNI's manager itself (no ``import nni``)."""
        return self._url.startswith("http://")

    def next_parameter(self) -> dict[str, Any]:
        if not self.direct:
            import nni
            return nni.get_next_parameter() or {}
        self._put({"type": "request_parameter"})
        while (reply := _http("GET", self._url, timeout=30))[0] == _TIMEOUT_STATUS:
            pass
        if reply[0] == _GONE_STATUS:
            raise ConnectionError(f"NNI's trial channel {self._url} is closed")
        if reply[0] != _OK_STATUS:
            raise ConnectionError(f"NNI's trial channel {self._url} answered HTTP {reply[0]}")
        command = json.loads(reply[1])
        if command.get("type") != "parameter":
            raise ConnectionError(f"NNI's trial channel sent {command.get('type')!r}, not a parameter")
        # NNI 3.0's local service hands parameters out in the order trials ask, not to the trial each
        # was made for: with concurrent trials, NNI's trial table would show another trial's parameters
        # beside this one's result. The trial's own job, from the manager's REST API, has the right ones.
        record = json.loads((self._own_parameters() or [command["parameter"]])[0])
        self._parameter_id = record.get("parameter_id")
        return dict(record.get("parameters") or {})

    def _own_parameters(self, limit_s: float = 2.0) -> list[str]:
        """The parameter records of this trial's job (the manager stores them just after starting it)."""
        deadline = time.monotonic() + limit_s
        while not (own := _get(f"{self._api}/trial-jobs/{identity().trial}", {}).get("hyperParameters")) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        return own or []

    def report_final(self, metric: dict[str, float]) -> None:
        if not self.direct:
            import nni
            nni.report_final_result(metric)
            return
        trial = identity().trial
        body = {"parameter_id": self._parameter_id, "trial_job_id": trial, "type": "FINAL", "sequence": 0,
                "value": json.dumps(metric)}
        self._put({"type": "metric", "metric": json.dumps(body)})
        self._wait_until_stored(trial)

    def _wait_until_stored(self, trial: str, limit_s: float = 10.0) -> None:
        """Return once NNI's manager has stored the final result, which it then hands to the tuner:
        the trial's end, which NNI sees when this process exits, comes after its result."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not any(m.get("type") == "FINAL" for m in _get(f"{self._api}/metric-data/{trial}", [])):
            time.sleep(0.005)

    def _put(self, command: dict[str, Any]) -> None:
        status, _ = _http("PUT", self._url, json.dumps(command).encode(), timeout=30)
        if status != _OK_STATUS:
            raise ConnectionError(f"NNI's trial channel {self._url} refused a {command['type']} command: HTTP {status}")


def _get(url: str, default: Any) -> Any:
    """The JSON at ``url``, or ``default`` when the manager does not answer."""
    try:
        status, body = _http("GET", url, timeout=5)
        return json.loads(body) if status == _OK_STATUS else default
    except (OSError, ValueError):
        return default


def _http(method: str, url: str, body: bytes = b"", timeout: float = 30) -> tuple[int, bytes]:
    """One HTTP/1.1 request to NNI's manager (``http://host:port/...``, on this host): status and body."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    head = (f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as conn:
        conn.sendall(head.encode("latin-1") + body)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    header, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if any(line.lower().replace(" ", "") == "transfer-encoding:chunked" for line in lines[1:]):
        payload = _dechunk(payload)
    return status, payload


def _dechunk(payload: bytes) -> bytes:
    """The body of a ``Transfer-Encoding: chunked`` response."""
    out = []
    while payload:
        size_line, _, payload = payload.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(payload[:size])
        payload = payload[size + 2:]
    return b"".join(out)
