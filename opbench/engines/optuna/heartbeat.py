"""A heartbeat for the trials a process has in flight on a shared database, so the study's other workers
fail a trial only when its process or host is gone."""
from __future__ import annotations

import contextlib
import threading
from typing import Any

from opbench import settings


class Heartbeat:
    """Records a heartbeat for each trial in ``trial_ids`` every ``HEARTBEAT_S`` (in a thread), so the
    study's other workers fail a trial only when its process or host is gone."""

    def __init__(self, storage: Any, trial_ids: set[int]) -> None:
        self._storage, self._trial_ids = storage, trial_ids
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="opbench-optuna-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, trial_id: int) -> None:
        with contextlib.suppress(Exception):  # a trial told meanwhile, or the database away: the next beat goes on
            self._storage.record_heartbeat(trial_id)

    def _beat(self) -> None:
        while not self._stopped.wait(settings.heartbeat_s()):
            for trial_id in list(self._trial_ids):
                self.beat(trial_id)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
