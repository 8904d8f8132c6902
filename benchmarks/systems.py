"""The three systems the throughput benchmark compares, each run over the same workload and model.

- ``KvscopeSystem``: ``kvscope.Engine(model, ...)``, ``engine.generate(prompts, params)``; token times
  from the engine's own telemetry (the end of the step that sampled each token).
- ``hf_static``: ``model.generate`` on left-padded static batches of ``batch_size`` requests in
  arrival order; each batch runs to its longest output and a request keeps its first ``max_tokens``
  tokens. Token times from a streamer (one ``put`` per decoding step).
- ``hf_continuous``: transformers' continuous batching (``init_continuous_batching``) with a
  per-request ``max_new_tokens``; token times from its ``record_timestamps``.
- ``VllmSystem``: a real vLLM in its own virtualenv, as a long-lived subprocess (``vllm_peer.py``)
  driven over a pipe; token times from its step outputs.

Every system sees all requests at ``t0`` (offline serving), so TTFT includes queueing.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import torch
from harness import PeakMemory, RunResult, latencies_from_times
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.streamers import BaseStreamer

from kvscope import Engine
from kvscope.engine.config import cdiv
from kvscope.runs.workload.items import WorkItem
from kvscope.telemetry.frames import token_times


def workload_blocks(items: Sequence[WorkItem], block_size: int) -> int:
    """Pages needed to hold every request of the workload at its full length at once."""
    return sum(cdiv(len(i.prompt) + i.params.max_tokens, block_size) for i in items)


class KvscopeSystem:
    """A fresh engine per run (built inside the memory measurement, outside the timing), so no run
    finds the previous run's prompts in the prefix cache.

    The KV pool holds the whole workload at once (no preemption, the same capacity HF's continuous
    batching gets); ``max_model_len`` is the longest request, as HF's workload hints set it.
    """

    name = "kvscope"

    def __init__(self, model: torch.nn.Module, items: Sequence[WorkItem], block_size: int = 16,
                 max_num_batched_tokens: int = 1024, max_num_seqs: int = 64, **engine_kwargs) -> None:
        self.model = model
        self.kwargs = dict(
            block_size=block_size,
            num_blocks=workload_blocks(items, block_size) + 1,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max(len(i.prompt) + i.params.max_tokens for i in items) + 1,
            **engine_kwargs,
        )
        self.engine: Engine | None = None  # the last run's, kept for inspection

    def run(self, items: Sequence[WorkItem]) -> RunResult:
        self.engine = None  # free the previous pool before measuring
        gc.collect()
        with PeakMemory() as mem:
            engine = self.engine = Engine(self.model, **self.kwargs)
            t0, c0 = time.perf_counter(), time.process_time()
            outs = engine.generate([i.prompt for i in items], [i.params for i in items])
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        times = token_times(engine.recorder.steps)
        result = RunResult(self.name, [o.token_ids for o in outs], wall, cpu, peak_mem_bytes=mem.delta,
                           note=f"block {self.kwargs['block_size']}, {self.kwargs['num_blocks']} blocks, "
                                f"{self.kwargs['max_num_batched_tokens']} tokens/step")
        latencies_from_times(t0, [[t / 1e9 for t in times[o.request_id]] for o in outs], result)
        return result


class _StepClock(BaseStreamer):
    """A streamer that only notes when each decoding step hands back its tokens."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate first puts the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _pad_id(model: torch.nn.Module) -> int:
    pad = model.config.pad_token_id
    if pad is None:
        eos = model.config.eos_token_id
        pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    return int(pad) if pad is not None else 0


def hf_static(model: torch.nn.Module, items: Sequence[WorkItem], batch_size: int) -> RunResult:
    """``generate`` over left-padded batches of ``batch_size`` requests, in arrival order."""
    model.set_attn_implementation("sdpa")
    pad = _pad_id(model)
    tokens: list[list[int]] = []
    times: list[list[float]] = []
    with PeakMemory() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, len(items), batch_size):
            batch = items[start : start + batch_size]
            width = max(len(i.prompt) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [b, width]
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, item in enumerate(batch):
                ids[row, width - len(item.prompt) :] = torch.tensor(item.prompt)
                mask[row, width - len(item.prompt) :] = 1
            clock = _StepClock()
            out = model.generate(  # [b, width + longest output]
                input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=pad, eos_token_id=None,
                max_new_tokens=max(i.params.max_tokens for i in batch), streamer=clock,
            )
            for row, item in enumerate(batch):
                n = item.params.max_tokens
                tokens.append(out[row, width : width + n].tolist())
                times.append(clock.times[:n])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    result = RunResult(f"hf-static[bs={batch_size}]", tokens, wall, cpu, peak_mem_bytes=mem.delta,
                       note=f"left-padded batches of {batch_size}, arrival order")
    latencies_from_times(t0, times, result)
    return result


def hf_continuous(model: torch.nn.Module, items: Sequence[WorkItem], max_batch_tokens: int,
                  block_size: int = 16, max_requests: int = 64) -> RunResult:
    """transformers' continuous batching, sized like kvscope: pages of ``block_size`` tokens, enough
    of them for the whole workload at once, at most ``max_batch_tokens`` tokens and ``max_requests``
    requests per step; no CUDA graphs or async batching (CPU), EOS disabled (-1)."""
    model.set_attn_implementation("sdpa")
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=_pad_id(model),
                           max_new_tokens=max(i.params.max_tokens for i in items))
    cb = ContinuousBatchingConfig(
        page_size=block_size, num_blocks=workload_blocks(items, block_size) + 1,
        max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_requests,
        use_cuda_graph=False, use_async_batching=False,
    )
    with PeakMemory() as mem:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.start()
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            for k, item in enumerate(items):
                manager.add_request(item.prompt, request_id=f"r{k}", max_new_tokens=item.params.max_tokens,
                                    eos_token_id=-1, record_timestamps=True)
            results = {}
            while len(results) < len(items):
                out = manager.get_result(timeout=1)
                if out is not None and out.is_finished():
                    results[out.request_id] = out
                elif out is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching stopped before finishing the workload")
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            manager.stop(block=True)
            manager.destroy()
    ordered = [results[f"r{k}"] for k in range(len(items))]
    failed = [o.request_id for o in ordered if o.error]
    if failed:
        raise RuntimeError(f"transformers' continuous batching failed requests {failed}: {ordered[0].error}")
    result = RunResult(f"hf-continuous[{max_batch_tokens} tok]", [list(o.generated_tokens) for o in ordered],
                       wall, cpu, peak_mem_bytes=mem.delta,
                       note=f"pages of {block_size}, {max_batch_tokens} tokens/step, sdpa")
    latencies_from_times(t0, [list(o.timestamps or []) for o in ordered], result)
    return result


# ---- vLLM ---------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
VLLM_SETUP = ".ci/vllm-env"


def vllm_python() -> Path | None:
    """The python of vLLM's virtualenv (``$KVSCOPE_VLLM_VENV`` or ``.venv-vllm``), if it is there."""
    venv = Path(os.environ.get("KVSCOPE_VLLM_VENV") or ROOT / ".venv-vllm")
    python = venv / "bin" / "python"
    return python if python.exists() else None


def save_model(model: torch.nn.Module, folder: Path) -> Path:
    """The benchmark's weights as a model folder vLLM can load (config.json + safetensors, float32)."""
    model.save_pretrained(folder)
    return folder


class VllmSystem:
    """vLLM (``LLM`` in its own virtualenv, offline, token-id prompts, no tokenizer) as a subprocess.

    Started once (its startup and a warm-up are not timed), then driven over a pipe: each ``run`` sends
    the workload and reads back tokens, timings and memory (``vllm_peer.py``). Between its rounds the
    process tree is stopped (SIGSTOP): vLLM's idle worker polls its queue (~15% of a core measured
    here), which would take CPU from the systems timed meanwhile. Settings as kvscope's where vLLM has
    them (token budget, sequences per step, greedy, EOS ignored), prefix caching off, float32, block
    size ``block_size`` (its CPU attention needs a multiple of 32), a 1 GiB KV pool
    (``VLLM_CPU_KVCACHE_SPACE=1``), OpenMP threads bound as ``bind`` says (vLLM's ``auto``: one core
    for the model, one kept for its front-end process, on this 2-core machine).
    """

    def __init__(self, model_dir: Path, items: Sequence[WorkItem], block_size: int = 32,
                 max_num_batched_tokens: int = 1024, max_num_seqs: int = 64, bind: str = "auto",
                 python: Path | None = None, llm_kwargs: dict | None = None, profile_dir: str = "") -> None:
        self.python = python or vllm_python()
        if self.python is None:
            raise FileNotFoundError(f"no vLLM virtualenv: make one with `{VLLM_SETUP}`")
        self.bind = bind
        self.name = "vllm" if bind == "auto" else f"vllm[bind {bind}]"
        self.args = ["--model", str(model_dir), "--block-size", str(block_size),
                     "--max-model-len", str(max(len(i.prompt) + i.params.max_tokens for i in items) + 1),
                     "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(max_num_batched_tokens),
                     "--llm-kwargs", json.dumps(llm_kwargs or {})]
        if profile_dir:
            self.args += ["--profile-dir", profile_dir]
        fd, self.log = tempfile.mkstemp(prefix="kvscope-vllm-", suffix=".log")  # vLLM's own output
        os.close(fd)
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.note = f"block {block_size}, {max_num_batched_tokens} tokens/step, OpenMP bind {bind}"

    def start(self, timeout_s: float = 900) -> dict:
        """Start vLLM and wait until it is ready; returns its hello (startup_s, version, pids, rss_bytes)."""
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=self.bind, HF_HUB_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
        env.pop("VIRTUAL_ENV", None)
        log = os.open(self.log, os.O_WRONLY | os.O_APPEND)
        try:
            self.proc = subprocess.Popen([str(self.python), str(Path(__file__).with_name("vllm_peer.py")), *self.args],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env=env, cwd=ROOT)
        finally:
            os.close(log)
        self.info = self._read(timeout_s)
        self.pause()
        return self.info

    def _read(self, timeout_s: float | None = None) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        import select

        if timeout_s is not None and not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            raise TimeoutError(f"vLLM did not answer within {timeout_s:.0f} s (log: {self.log})")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM exited (code {self.proc.poll()}); its log: {self.log}\n{self.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM failed: {answer['error']} (log: {self.log})")
        return answer

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])

    def _signal(self, sig: int) -> None:
        pids = self.info.get("pids") or ([self.proc.pid] if self.proc else [])
        try:
            tree = [psutil.Process(pids[0]), *psutil.Process(pids[0]).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in tree if sig == signal.SIGCONT else reversed(tree):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def command(self, **cmd) -> dict:
        assert self.proc is not None and self.proc.stdin is not None
        self.resume()
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            return self._read()
        finally:
            self.pause()

    def run(self, items: Sequence[WorkItem]) -> RunResult:
        for item in items:
            if not (item.params.greedy and item.params.ignore_eos):
                raise ValueError("the vLLM peer runs greedy requests with EOS ignored only")
        answer = self.command(cmd="run", prompts=[list(i.prompt) for i in items],
                              max_tokens=[i.params.max_tokens for i in items])
        result = RunResult(self.name, answer["tokens"], answer["wall_s"], answer["cpu_s"],
                           peak_mem_bytes=answer["peak_mem_bytes"], resident_bytes=answer["rss_bytes"],
                           note=self.note)
        latencies_from_times(0.0, answer["times"], result)
        return result

    def close(self) -> None:
        if self.proc is None:
            return
        self.resume()
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
        self.proc = None
