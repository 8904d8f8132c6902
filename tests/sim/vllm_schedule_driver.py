"""vLLM's own ``Scheduler`` driven without a model, as vLLM's unit tests drive it: run by the vLLM virtualenv's
python (``.venv-vllm/bin/python tests/sim/vllm_schedule_driver.py``), never imported by kvscope or its tests.

It reads scenarios as JSON on stdin and writes their schedules as JSON on stdout (plain data both ways; nothing
is unpickled or executed). Input: ``{"scenarios": [SCENARIO, ...]}``, each scenario::

    {"block_size": 16, "num_blocks": 40, "max_num_seqs": 8, "max_num_batched_tokens": 64,
     "max_model_len": 512, "enable_prefix_caching": true, "reserve_full_isl": true,
     "long_prefill_token_threshold": 0,
     "requests": [{"id": "r0", "prompt": [5, 6, ...], "max_tokens": 4, "arrival_step": 0}, ...]}

``num_blocks`` is the number of blocks requests can use (kvscope's pool); vLLM's pool gets one more, the null
block it keeps for itself. Output: ``{"schedules": [{"steps": [STEP, ...], "error": None | str}, ...]}``, each step
``{"tokens": [[id, n], ...] (in schedule order), "preempted": [id, ...], "admitted": [[id, computed], ...]}``
(``computed``: the request's computed tokens when it was admitted: its prefix-cache hit).

The loop: before step ``s`` the requests whose ``arrival_step <= s`` are added, in input order; a step with
nothing to run jumps to the next arrival. After each step every request that reached the end of its known
tokens samples one fake token (id 7; EOS is ignored), so a request ends after ``max_tokens`` outputs.
Asynchronous scheduling is off (as on vLLM's CPU backend); the policy is FCFS.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback

FAKE_TOKEN = 7
MAX_STEPS = 20000


def _model_dir(max_model_len: int) -> str:
    """A folder holding only a tiny Llama's config.json: what ``ModelConfig`` reads (no weights, no tokenizer)."""
    folder = tempfile.mkdtemp(prefix="kvscope-vllm-sched-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1,
              "num_hidden_layers": 1, "vocab_size": 512, "max_position_embeddings": max(max_model_len, 8192),
              "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


class Driver:
    def __init__(self) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch, self.CacheConfig, self.ModelConfig = torch, CacheConfig, ModelConfig
        self.SchedulerConfig, self.VllmConfig, self.SamplingParams = SchedulerConfig, VllmConfig, SamplingParams
        self.Scheduler, self.FullAttentionSpec = Scheduler, FullAttentionSpec
        self.KVCacheConfig, self.KVCacheGroupSpec = KVCacheConfig, KVCacheGroupSpec
        self.ModelRunnerOutput, self.Request, self.StructuredOutputManager = ModelRunnerOutput, Request, \
            StructuredOutputManager
        self.sha256, self.get_request_block_hasher = sha256, get_request_block_hasher
        init_none_hash(sha256)
        self.model_dir = _model_dir(8192)
        self._model_configs: dict[int, object] = {}

    def model_config(self, max_model_len: int):
        if max_model_len not in self._model_configs:
            self._model_configs[max_model_len] = self.ModelConfig(
                model=self.model_dir, skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32",
                seed=0)
        return self._model_configs[max_model_len]

    def scheduler(self, sc: dict):
        bs, num_blocks = sc["block_size"], sc["num_blocks"] + 1  # + vLLM's null block
        scheduler_config = self.SchedulerConfig(
            max_num_seqs=sc["max_num_seqs"], max_num_batched_tokens=sc["max_num_batched_tokens"],
            max_model_len=sc["max_model_len"], enable_chunked_prefill=True, is_encoder_decoder=False,
            async_scheduling=False, policy="fcfs", scheduler_reserve_full_isl=sc.get("reserve_full_isl", True),
            long_prefill_token_threshold=sc.get("long_prefill_token_threshold", 0))
        cache_config = self.CacheConfig(block_size=bs, enable_prefix_caching=sc.get("enable_prefix_caching", True),
                                        cache_dtype="auto")
        cache_config.num_gpu_blocks = num_blocks
        vllm_config = self.VllmConfig(scheduler_config=scheduler_config, model_config=self.model_config(
            sc["max_model_len"]), cache_config=cache_config)
        kv_cache_config = self.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            self.KVCacheGroupSpec(["layer"], self.FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=64,
                                                                     dtype=self.torch.float32))])
        return self.Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=bs,
                              structured_output_manager=self.StructuredOutputManager(vllm_config), log_stats=True)

    def run(self, sc: dict) -> dict:
        scheduler = self.scheduler(sc)
        hasher = self.get_request_block_hasher(sc["block_size"], self.sha256)
        pending = sorted(enumerate(sc["requests"]), key=lambda p: (p[1]["arrival_step"], p[0]))
        requests: dict[str, object] = {}
        steps: list[dict] = []
        step = 0
        while pending or scheduler.has_unfinished_requests():
            if not scheduler.has_unfinished_requests() and pending[0][1]["arrival_step"] > step:
                step = pending[0][1]["arrival_step"]
            while pending and pending[0][1]["arrival_step"] <= step:
                r = pending.pop(0)[1]
                params = self.SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0)
                request = self.Request(request_id=r["id"], prompt_token_ids=list(r["prompt"]), sampling_params=params,
                                       pooling_params=None, arrival_time=float(step), block_hasher=hasher)
                requests[r["id"]] = request
                scheduler.add_request(request)
            out = scheduler.schedule()
            admitted = [[d.req_id, d.num_computed_tokens] for d in out.scheduled_new_reqs]
            cached = out.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                if rid in cached.resumed_req_ids:
                    admitted.append([rid, cached.num_computed_tokens[i]])
            steps.append({"tokens": [[rid, n] for rid, n in out.num_scheduled_tokens.items()],
                          "preempted": sorted(out.preempted_req_ids or ()), "admitted": sorted(admitted)})
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for rid in ids:
                req = requests[rid]
                # the step has run: a request whose computed tokens reach its known tokens samples one
                sampled.append([FAKE_TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
            result = self.ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                                            sampled_token_ids=sampled)
            scheduler.update_from_output(out, result)
            step += 1
            if len(steps) > MAX_STEPS:
                return {"steps": steps, "error": f"no end after {MAX_STEPS} steps"}
        return {"steps": steps, "error": None}


def main() -> int:
    scenarios = json.load(sys.stdin)["scenarios"]
    driver = Driver()
    schedules = []
    try:
        for sc in scenarios:
            try:
                schedules.append(driver.run(sc))
            except Exception:  # one scenario's failure is reported, the others still run
                schedules.append({"steps": [], "error": traceback.format_exc(limit=6)})
    finally:
        shutil.rmtree(driver.model_dir, ignore_errors=True)
    json.dump({"schedules": schedules}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
