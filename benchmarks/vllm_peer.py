"""The vLLM side of the throughput benchmark: a long-lived process in vLLM's own virtualenv.

    .venv-vllm/bin/python benchmarks/vllm_peer.py --model DIR --block-size 32 --max-model-len 400

Started by ``systems.VllmSystem`` and driven over a pipe, one JSON object per line: the peer builds
``vllm.LLM`` once (its startup is not timed), answers ``{"ready": ...}``, then for every command reads
one line from stdin and writes one line to stdout:

- ``{"cmd": "run", "prompts": [[ids...], ...], "max_tokens": [n, ...]}``: generate greedily (EOS
  ignored, token-id prompts, no tokenizer); answers the tokens per request in order, wall and CPU
  seconds, per-token arrival times and the peak memory of the round.
- ``{"cmd": "profile", "on": true | false}``: start / stop vLLM's torch profiler (the engine core's
  worker writes its trace to ``--profile-dir``).
- ``{"cmd": "quit"}``.

The requests go in with ``LLM.enqueue`` and run through the loop of ``LLM.generate``
(``llm_engine.step()`` until no request is unfinished), with ``RequestOutputKind.DELTA`` so that each
step's new tokens come back with the step and get a time stamp. CPU time is that of the whole
process tree (this process and vLLM's engine-core process) from psutil; peak memory is the sum over
the tree of the kernel's resident high-water mark (VmHWM, reset at the start of the round) above
each process's resident size then. Everything vLLM logs goes to stderr; stdout carries only the
protocol. Only the standard library, psutil and vllm are imported (not kvscope: this virtualenv has
an older transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _protocol_stream():
    """stdout for the protocol only: a private copy of fd 1, then fd 1 pointed at stderr (which vLLM's
    logs, prints and its spawned engine process inherit)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _tree():
    import psutil

    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def _cpu_seconds(procs) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # a process that just ended
            pass
    return total


def _status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peaks(procs) -> dict[int, int]:
    """Reset every process's VmHWM to its current RSS ("5" to clear_refs); the RSS of each."""
    base = {}
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        base[p.pid] = _status(p.pid, "VmRSS")
    return base


def build_llm(args: argparse.Namespace):
    from vllm import LLM

    kwargs = dict(
        model=args.model, skip_tokenizer_init=True, dtype="float32", block_size=args.block_size,
        enable_prefix_caching=False, max_model_len=args.max_model_len, seed=0,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
    )
    if args.profile_dir:
        kwargs["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": args.profile_dir,
                                     "torch_profiler_with_stack": False, "torch_profiler_record_shapes": True,
                                     "torch_profiler_use_gzip": False}
    kwargs.update(json.loads(args.llm_kwargs))
    return LLM(**kwargs)


def run(llm, prompts: list[list[int]], max_tokens: list[int], stream: bool = True) -> dict:
    """One round. ``stream``: add the requests to ``llm.llm_engine`` with DELTA outputs and run the
    loop of ``LLM.generate`` (per-token times); else ``LLM.generate`` itself (FINAL_ONLY outputs: no
    token times; for checking that streaming costs nothing)."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False, output_kind=kind)
              for n in max_tokens]
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    procs = _tree()
    base = _reset_peaks(procs)
    engine = llm.llm_engine
    tokens: list[list[int]] = [[] for _ in prompts]
    times: list[list[float]] = [[] for _ in prompts]
    t0, c0 = time.perf_counter(), _cpu_seconds(procs)
    if stream:
        tag = f"r{time.monotonic_ns()}-"  # request ids unique across rounds
        for k, (inp, sp) in enumerate(zip(inputs, params)):
            engine.add_request(f"{tag}{k}", inp, sp)
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter() - t0
            for out in outs:
                k = int(out.request_id.removeprefix(tag))
                new = out.outputs[0].token_ids
                tokens[k].extend(new)
                times[k].extend([now] * len(new))
    else:
        for k, out in enumerate(llm.generate(inputs, params, use_tqdm=False)):
            tokens[k] = list(out.outputs[0].token_ids)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds(procs) - c0
    peak = sum(max(_status(pid, "VmHWM") - rss, 0) for pid, rss in base.items())
    rss = sum(_status(p.pid, "VmRSS") for p in procs)
    return dict(tokens=tokens, times=times, wall_s=wall, cpu_s=cpu, peak_mem_bytes=peak, rss_bytes=rss)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (config.json + safetensors)")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--profile-dir", default="", help="enable vLLM's torch profiler, traces here")
    p.add_argument("--llm-kwargs", default="{}", help="more keyword arguments of vllm.LLM, as JSON")
    args = p.parse_args(argv)
    proto = _protocol_stream()
    t0 = time.perf_counter()
    llm = build_llm(args)
    import vllm

    procs = _tree()
    proto.write(json.dumps(dict(ready=True, startup_s=time.perf_counter() - t0, version=vllm.__version__,
                                pids=[q.pid for q in procs], rss_bytes=sum(_status(q.pid, "VmRSS") for q in procs)))
                + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "quit":
                break
            if cmd["cmd"] == "run":
                answer = run(llm, cmd["prompts"], cmd["max_tokens"], cmd.get("stream", True))
            elif cmd["cmd"] == "profile":
                llm.start_profile() if cmd["on"] else llm.stop_profile()
                answer = dict(ok=True)
            else:
                answer = dict(error=f"unknown command {cmd['cmd']!r}")
        except Exception as exc:  # reported to the benchmark, which raises it there
            answer = dict(error=f"{type(exc).__name__}: {exc}")
        proto.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":  # the guard vLLM's spawned engine process needs
    sys.exit(main())
