"""The router's side of an instance: its process, a connection to it (``multiprocessing.connection`` over a Unix
socket, with a random authkey), and calls that either answer, raise the instance's own error, or raise
``InstanceDied``.

The process is a fresh interpreter, ``python -m kvscope.pd.process ADDRESS`` (``main``; the authkey in the
environment), rather than ``multiprocessing``'s spawn: spawn re-imports the parent's ``__main__``, which a script
without an ``if __name__ == "__main__":`` guard cannot survive. It connects back before importing anything heavy,
then ``kvscope.pd.instance.serve`` builds its engine and answers."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from multiprocessing.connection import Listener
from typing import Any

from kvscope.pd.config import AUTHKEY_ENV, KVTransferConfig

READY_TIMEOUT_S = 300.0  # building an engine (loading + probing the model) in a fresh process


class InstanceError(RuntimeError):
    """An instance answered a command with an error."""

    def __init__(self, instance: str, kind: str, message: str) -> None:
        super().__init__(f"{instance}: {kind}: {message}")
        self.kind, self.message = kind, message


class InstanceDied(RuntimeError):
    """An instance's process ended (killed, crashed) while the router needed it."""


class InstanceProcess:
    """One instance's process and its pipe. ``send`` + ``result`` (several instances work at once) or
    ``call``; ``close`` ends the process (joined, else terminated, else killed)."""

    def __init__(self, name: str, model: str, engine_kwargs: dict[str, Any], kv_config: KVTransferConfig,
                 threads: int) -> None:
        if kv_config.kv_role is None:
            raise ValueError("an instance's kv_transfer_config names its kv_role (KVTransferConfig.for_role)")
        self.name, self.role, self.kv_config, self.threads = name, kv_config.kv_role, kv_config, threads
        authkey = secrets.token_bytes(16)
        with Listener(family="AF_UNIX", authkey=authkey) as listener:
            env = {**os.environ, AUTHKEY_ENV: authkey.hex(), "OMP_NUM_THREADS": str(threads)}
            self.process = subprocess.Popen([sys.executable, "-m", "kvscope.pd.process", listener.address], env=env)
            self.conn = self._accept(listener)
        self.conn.send((name, model, engine_kwargs, kv_config, threads))
        self.info: dict[str, Any] = {}
        self.dead: str | None = None  # why it is gone, once it is
        self.pending = False

    def _accept(self, listener: Listener):
        got: list = []
        thread = threading.Thread(target=lambda: got.append(listener.accept()), daemon=True)
        thread.start()
        while thread.is_alive() and self.process.poll() is None:
            thread.join(0.1)
        thread.join(1.0)
        if not got:
            self.process.kill()
            self.process.wait()
            raise InstanceDied(f"{self.role} instance {self.name} exited (code {self.process.returncode}) "
                               "before it connected")
        return got[0]

    @property
    def alive(self) -> bool:
        return self.dead is None

    def wait_ready(self) -> dict[str, Any]:
        self.pending = True
        self.info = self.result(READY_TIMEOUT_S)
        return self.info

    def send(self, cmd: str, *args: Any) -> None:
        if self.dead is not None:
            raise InstanceDied(self.dead)
        try:
            self.conn.send((cmd, args))
        except (OSError, BrokenPipeError) as exc:
            raise self._died(f"the pipe broke: {exc}") from None
        self.pending = True

    def result(self, timeout_s: float | None = None) -> Any:
        """The answer to the last ``send``; ``InstanceError`` if it failed, ``InstanceDied`` if the process
        ended (``timeout_s``: also if no answer came in time)."""
        waited = 0.0
        try:
            while not self.conn.poll(0.2):
                waited += 0.2
                if self.process.poll() is not None:
                    raise self._died("") from None
                if timeout_s is not None and waited >= timeout_s:
                    raise self._died(f"no answer within {timeout_s:.0f} s")
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died(str(exc)) from None
        finally:
            self.pending = False
        if reply[0] == "ok":
            return reply[1]
        if reply[1] in ("ValueError", "TypeError"):
            raise (ValueError if reply[1] == "ValueError" else TypeError)(reply[2])
        raise InstanceError(self.name, reply[1], reply[2])

    def call(self, cmd: str, *args: Any, timeout_s: float | None = None) -> Any:
        self.send(cmd, *args)
        return self.result(timeout_s)

    def _died(self, detail: str) -> InstanceDied:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        pid = self.info.get("pid", self.process.pid)
        self.dead = (f"{self.role} instance {self.name} (pid {pid}) died (exit code {code})"
                     + (f": {detail}" if detail else ""))
        return InstanceDied(self.dead)

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask the instance to stop, then make sure its process is gone."""
        if self.dead is None and self.process.poll() is None:
            try:
                if self.pending:  # an unanswered command: its answer would be read as close's
                    self.result(timeout_s)
                self.conn.send(("close", ()))
                if self.conn.poll(timeout_s):
                    self.conn.recv()
            except (OSError, EOFError, InstanceDied, InstanceError, ValueError, TypeError):
                pass
        for stop in (None, self.process.terminate, self.process.kill):
            if stop is not None:
                stop()
            try:
                self.process.wait(timeout_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.conn.close()
        if self.dead is None:
            self.dead = f"{self.role} instance {self.name} was closed"


def main(argv: list[str]) -> None:
    """An instance process: connect to the router, then serve (``kvscope.pd.instance``) until told to close."""
    from multiprocessing.connection import Client

    conn = Client(argv[0], authkey=bytes.fromhex(os.environ.pop(AUTHKEY_ENV)))
    name, model, engine_kwargs, kv_config, threads = conn.recv()
    from kvscope.pd.instance import serve

    serve(conn, name, model, engine_kwargs, kv_config, threads)
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
