"""The RPC runner: kernels built here (cross-compiled for boards) and timed on a device the tracker hands out.

Each runner slot is a client worker process holding one session across trials (getting one costs
seconds), so a hung upload or a lost device costs a trial, never the study. With several slots,
trials run at once on as many devices of the key. A trial's placements are fresh allocations of its
arguments on the device it got (the library uploaded once).
"""
from __future__ import annotations

import queue
import threading

from opbench import settings
from opbench.hardware.devices import RemoteDevice
from opbench.hardware.resources import Resources
from opbench.measure.protocol import RemoteConnect, RemoteSession, RunInput, RunResult
from opbench.measure.runner._base import Runner
from opbench.measure.runner.placements import place
from opbench.measure.worker import WorkerError
from opbench.measure.worker.zygotes import one_thread_worker
from opbench.record import Status


class _Slot:
    """A client worker and the session it holds (None until connected, or after the device was lost)."""

    def __init__(self) -> None:
        self.worker = one_thread_worker()
        self.session: RemoteSession | None = None
        self.lost = False
        self.retired = False


class RPCRunner(Runner[RunInput, RunResult]):
    """Times kernels on the devices of one tracker key, ``slots`` at once.

    A slot whose device is lost (or that gets none) is retired while other slots live, so the study
    goes on on the remaining devices; the last slot keeps asking the tracker on every trial.
    """

    def __init__(self, device: RemoteDevice, slots: int = 1, run_timeout_s: float = settings.RUN_TIMEOUT_S,
                 connect_timeout_s: float = settings.CONNECT_TIMEOUT_S) -> None:
        self.device = device
        self.run_timeout_s = run_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._slots = [_Slot() for _ in range(max(1, slots))]
        self._idle: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self._slots:
            self._idle.put(slot)
        self._live = len(self._slots)
        self._mutex = threading.Lock()

    @property
    def slots(self) -> int:
        return self._live

    def warm_up(self, resources: Resources | None = None) -> None:
        """Connect every slot now (in parallel), so getting sessions is not charged to trials."""
        slots = [self._idle.get() for _ in range(self._live)]
        threads = [threading.Thread(target=self._connect, args=(s,)) for s in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for slot in slots:
            self._release(slot)

    def run(self, inp: RunInput) -> RunResult:
        slot = self._idle.get()
        try:
            return place([inp], lambda _: self._run_on(slot, inp))[0]
        finally:
            self._release(slot)

    def _release(self, slot: _Slot) -> None:
        with self._mutex:
            retire = slot.lost and self._live > 1
            if retire:
                self._live -= 1
        if retire:
            slot.retired = True
            slot.worker.close()
        else:
            self._idle.put(slot)

    def _connect(self, slot: _Slot) -> RemoteSession:
        if slot.session is not None:
            return slot.session
        try:
            session = slot.worker.call(RemoteConnect(self.device.host, self.device.port, self.device.key),
                                       self.connect_timeout_s)
        except WorkerError as exc:
            session = RemoteSession(Status.DEVICE_ERROR, (
                f"no free '{self.device.key}' device at tracker {self.device.tracker} within "
                f"{self.connect_timeout_s:.0f} s" if exc.timed_out else f"RPC client died while connecting: {exc}"))
        slot.lost = session.status is not Status.OK
        slot.session = None if slot.lost else session
        return session

    def _run_on(self, slot: _Slot, inp: RunInput) -> RunResult:
        session = self._connect(slot)
        if session.status is not Status.OK:
            return RunResult(session.status, session.error)
        try:
            result: RunResult = slot.worker.call(inp, self.run_timeout_s)
        except WorkerError as exc:
            slot.session, slot.lost = None, True
            status = Status.TIMEOUT if exc.timed_out else Status.DEVICE_ERROR
            what = f"upload and run took longer than {self.run_timeout_s:.0f} s" if exc.timed_out else str(exc)
            result = RunResult(status, f"remote {session.addr}: {what}; session dropped")
        if result.status is Status.DEVICE_ERROR:
            slot.session, slot.lost = None, True
        result.device_addr, result.device_facts = session.addr, session.facts
        return result

    def close(self) -> None:
        for slot in self._slots:
            if not slot.retired:
                slot.worker.close()
