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
import time
from multiprocessing.connection import Listener
from typing import Any

from kvscope.pd.config import AUTHKEY_ENV, KVTransferConfig

READY_TIMEOUT_S = 300.0  # building an engine (loading + probing the model) in a fresh process
ANSWER_TIMEOUT_S = 300.0  # the longest any command (a step of a long prompt on a slow machine) may take
STOPPED_GRACE_S = 2.0  # a process stopped (SIGSTOP, a debugger) this long answers nothing: given up on


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
                 threads: int, secret: bytes | None = None) -> None:
        if kv_config.kv_role is None:
            raise ValueError("an instance's kv_transfer_config names its kv_role (KVTransferConfig.for_role)")
        self.name, self.role, self.kv_config, self.threads = name, kv_config.kv_role, kv_config, threads
        authkey = secrets.token_bytes(16)
        with Listener(family="AF_UNIX", authkey=authkey) as listener:
            env = {**os.environ, AUTHKEY_ENV: authkey.hex(), "OMP_NUM_THREADS": str(threads)}
            self.process = subprocess.Popen([sys.executable, "-m", "kvscope.pd.process", listener.address], env=env)
            self.conn = self._accept(listener)
        self.conn.send((name, model, engine_kwargs, kv_config, threads, secret))  # the KV transport's secret
        self.info: dict[str, Any] = {}
        self.dead: str | None = None  # why it is gone, once it is
        self.pending = False
        self.sent_at = 0.0  # time.monotonic() of the last send: a deadline on its answer
        self.stopped_since: float | None = None  # when it was first seen stopped (state T), while it stays so

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
        self.pending, self.sent_at = True, time.monotonic()
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
        self.sent_at = time.monotonic()
        self.stopped_since = None

    def unresponsive(self, timeout_s: float | None = None) -> str | None:
        """Why the command in flight will not be answered (``None``: it may yet be): the process ended, it has
        been stopped (SIGSTOP) for ``STOPPED_GRACE_S``, or ``timeout_s`` (default ``ANSWER_TIMEOUT_S``) passed
        since the command was sent."""
        if timeout_s is None:
            timeout_s = ANSWER_TIMEOUT_S
        if self.process.poll() is not None:
            return ""
        now = time.monotonic()
        if _stopped(self.process.pid):
            self.stopped_since = self.stopped_since or now
            if now - self.stopped_since >= STOPPED_GRACE_S:
                return f"stopped (SIGSTOP?) for {STOPPED_GRACE_S:.0f} s, not answering: killed"
        else:
            self.stopped_since = None
        if now - self.sent_at >= timeout_s:
            return f"no answer within {timeout_s:.0f} s: killed"
        return None

    def result(self, timeout_s: float | None = None) -> Any:
        """The answer to the last ``send``; ``InstanceError`` if it failed, ``InstanceDied`` if the process
        ended, was stopped or did not answer within ``timeout_s`` (default ``ANSWER_TIMEOUT_S``): every wait
        on an instance ends (``unresponsive``); one given up on is killed."""
        try:
            while not self.conn.poll(0.2):
                why = self.unresponsive(timeout_s)
                if why is not None:
                    raise self._died(why) from None
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
        """It is gone (``detail``: why, if it had not ended by itself; then it is killed, so it cannot come back
        and act on what the router has given up on)."""
        if detail.endswith("killed"):
            self.process.kill()
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        pid = self.info.get("pid", self.process.pid)
        if detail.endswith("killed"):
            self.dead = f"{self.role} instance {self.name} (pid {pid}) {detail}"
        else:
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


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T``: SIGSTOP / SIGTSTP, ``t``: a tracer), from ``/proc`` (Linux; elsewhere
    never: the answer deadline still bounds the wait)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2:].split()  # the command name, in parentheses, may hold spaces
    return bool(fields) and fields[0] in (b"T", b"t")


def main(argv: list[str]) -> None:
    """An instance process: connect to the router, then serve (``kvscope.pd.instance``) until told to close."""
    from multiprocessing.connection import Client

    conn = Client(argv[0], authkey=bytes.fromhex(os.environ.pop(AUTHKEY_ENV)))
    name, model, engine_kwargs, kv_config, threads, secret = conn.recv()
    from kvscope.pd.instance import serve

    serve(conn, name, model, engine_kwargs, kv_config, threads, secret)
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
