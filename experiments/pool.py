"""The coordinator's side of the worker processes: start them, hand each one trial at a time, notice when
one dies, and stop them cleanly.

Workers are started with `spawn`: a fresh interpreter that imports train.py's code itself, and the
coordinator, which never imports torch, starts them at once so that their imports overlap its own work.
"""

import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time

from experiments import worker


class Worker:
    """One worker process and the request it is working on."""

    def __init__(self, ctx, index: int):
        self.index = index
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker.serve, args=(child,), name=f"sweep-worker-{index}")
        self.process.start()
        child.close()
        self.job: dict | None = None  # the trial it runs, if any

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, request: tuple) -> None:
        self.conn.send(request)

    def exit_reason(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"the worker process died ({signal.Signals(-code).name})"
        return f"the worker process ended (exit code {code})"


class Pool:
    """Worker processes, each with at most one request in flight."""

    def __init__(self):
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[Worker] = []
        self.leaving: list[Worker] = []  # told to exit, not yet joined
        self.started = 0
        # A signal wakes `wait` at once (Python retries a wait that a signal handler interrupted).
        self.wakeup, self._wakeup_w = socket.socketpair()
        self.wakeup.setblocking(False)
        self._wakeup_w.setblocking(False)
        self._previous_wakeup = None

    def wake_on_signals(self) -> None:
        self._previous_wakeup = signal.set_wakeup_fd(self._wakeup_w.fileno(), warn_on_full_buffer=False)

    def start(self, n: int = 1) -> None:
        for _ in range(n):
            self.workers.append(Worker(self.ctx, self.started))
            self.started += 1

    def shrink(self, n: int) -> None:
        """Let all but the first `n` workers go."""
        for w in self.workers[n:]:
            w.send(("exit",))
        self.leaving += self.workers[n:]
        self.workers = self.workers[:n]

    def idle(self) -> list[Worker]:
        return [w for w in self.workers if w.job is None and w.process.is_alive()]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.job is not None]

    def request(self, w: Worker, request: tuple, job: dict) -> None:
        w.job = job
        w.send(request)

    def wait(self, timeout: float) -> list[tuple[Worker, dict | None]]:
        """Replies that arrived within `timeout` s, as (worker, reply); (worker, None): the worker ended, and
        is no longer in the pool (its `job` is what it was running)."""
        handles = [h for w in self.workers for h in (w.conn, w.process.sentinel)]
        ready = set(multiprocessing.connection.wait([*handles, self.wakeup], timeout))
        if self.wakeup in ready:
            try:
                self.wakeup.recv(512)
            except BlockingIOError:
                pass
        events = []
        for w in list(self.workers):
            if w.conn not in ready and w.process.sentinel not in ready:
                continue
            try:
                if w.conn.poll():  # a reply, possibly sent just before the worker ended
                    events.append((w, w.conn.recv()))
                    continue
            except (EOFError, OSError):
                pass
            w.process.join(timeout=5)
            if not w.process.is_alive():
                self.workers.remove(w)
                events.append((w, None))
        return events

    def signal(self, signum: int) -> None:
        for w in self.workers:
            if w.process.is_alive():
                try:
                    os.kill(w.pid, signum)
                except ProcessLookupError:
                    pass

    def close(self, timeout: float = 10) -> None:
        """Ask each worker to exit; kill those that do not within `timeout` s."""
        for w in self.workers:
            try:
                w.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + timeout
        for w in self.workers + self.leaving:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        self.workers, self.leaving = [], []
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._previous_wakeup = None
