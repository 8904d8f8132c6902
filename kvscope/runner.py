"""ModelRunner: the HF model, its paged KV tensors, and the packing of one step into one flat batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import AttentionMetadata
from .config import ModelSpec
from .kernels import KernelBackend
from .request import Request
from .sampler import sample
from .scheduler import SchedulerOutput


@dataclass(slots=True)
class ModelInput:
    """One step, packed: all scheduled tokens of all requests as a single sequence ``[1, T]``."""

    input_ids: torch.Tensor  # [1, T]
    positions: torch.Tensor  # [1, T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [S]: packed positions whose logits produce a token
    sample_requests: list[Request]  # request of each logits row
    num_tokens: int


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        spec: ModelSpec,
        block_size: int,
        num_blocks: int,
        backend: KernelBackend,
        device: torch.device,
    ) -> None:
        self.model = model
        self.spec = spec
        self.block_size = block_size
        self.backend = backend
        self.device = device
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.allocate_kv(num_blocks)

    def allocate_kv(self, num_blocks: int) -> None:
        """Per layer, K and V pages ``[num_blocks, block_size, num_kv_heads, head_dim]``, zeroed (so a
        masked-out page never holds NaN)."""
        self.kv_caches = []  # free the old pages first
        shape = (num_blocks, self.block_size, self.spec.num_kv_heads, self.spec.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.spec.dtype, device=self.device),
                torch.zeros(shape, dtype=self.spec.dtype, device=self.device),
            )
            for _ in range(self.spec.num_layers)
        ]
        self.num_blocks = num_blocks

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)

    def prepare(self, sched: SchedulerOutput) -> ModelInput:
        """Pack the scheduled tokens: decodes (one token) first, then prefill chunks.

        The per-request loop only gathers Python lists; positions, slots and offsets are computed with
        numpy over all tokens at once.
        """
        # Decodes first, shortest context first (the torch path buckets them by length), then prefills.
        order = sorted(
            range(len(sched.requests)),
            key=lambda i: (0, sched.requests[i].num_computed_tokens) if sched.num_tokens[i] == 1 else (1, 0),
        )
        requests = [sched.requests[i] for i in order]
        query_lens = [sched.num_tokens[i] for i in order]
        starts = [r.num_computed_tokens for r in requests]
        num_decodes = sum(1 for n in query_lens if n == 1)

        token_ids: list[int] = []
        max_blocks = max(len(r.block_ids) for r in requests)
        block_tables = np.zeros((len(requests), max_blocks), dtype=np.int64)  # [B, max_blocks]
        for i, r in enumerate(requests):
            token_ids.extend(r.all_token_ids[starts[i] : starts[i] + query_lens[i]])
            block_tables[i, : len(r.block_ids)] = r.block_ids

        q_lens = np.asarray(query_lens, dtype=np.int64)  # [B]
        seq_lens = np.asarray(starts, dtype=np.int64) + q_lens  # [B]
        query_start_loc = np.zeros(len(requests) + 1, dtype=np.int64)  # [B + 1]
        np.cumsum(q_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        seq_of_token = np.repeat(np.arange(len(requests)), q_lens)  # [T]
        positions = np.arange(num_tokens) - query_start_loc[seq_of_token] + np.repeat(starts, q_lens)  # [T]
        bs = self.block_size
        slot_mapping = block_tables[seq_of_token, positions // bs] * bs + positions % bs  # [T]

        # A request produces a token when this step reaches the end of everything it has.
        samples = [i for i, r in enumerate(requests) if seq_lens[i] == r.num_tokens]
        logits_indices = query_start_loc[1:][samples] - 1

        dev = self.device
        seq_lens_list = seq_lens.tolist()
        block_tables_t = torch.from_numpy(block_tables).to(dev)
        plan = None
        if self.backend.build_plan is not None:
            spec = self.spec
            plan = self.backend.build_plan(block_tables_t, query_lens, seq_lens_list, num_decodes, bs,
                              spec.num_heads // spec.num_kv_heads, spec.dtype, spec.num_kv_heads * spec.head_dim)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            block_tables=block_tables_t,
            query_start_loc=torch.from_numpy(query_start_loc).to(dev, torch.int32),
            seq_lens=torch.from_numpy(seq_lens).to(dev, torch.int32),
            num_decodes=num_decodes,
            query_lens=query_lens,
            seq_lens_list=seq_lens_list,
            kv_caches=self.kv_caches,
            backend=self.backend,
            plan=plan,
        )
        return ModelInput(
            input_ids=torch.tensor(token_ids, dtype=torch.long, device=dev)[None],
            positions=torch.from_numpy(positions).to(dev)[None],
            meta=meta,
            logits_indices=torch.from_numpy(logits_indices).to(dev),
            sample_requests=[requests[i] for i in samples],
            num_tokens=num_tokens,
        )

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> torch.Tensor:
        """Run the model over the packed batch; logits only where a token is sampled: ``[S, vocab]``."""
        out = self.model(
            input_ids=inp.input_ids,
            position_ids=inp.positions,
            use_cache=False,
            logits_to_keep=inp.logits_indices,
            kvscope_meta=inp.meta,
        )
        if inp.meta.num_layer_calls != self.spec.num_layers:
            raise RuntimeError(
                f"the model ran the kvscope attention {inp.meta.num_layer_calls} times for "
                f"{self.spec.num_layers} layers: its attention does not go through transformers' "
                "AttentionInterface, so kvscope cannot run it"
            )
        return out.logits[0].float()  # [S, vocab]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, inp: ModelInput) -> list[int]:
        if not inp.sample_requests:
            return []
        return sample(logits, inp.sample_requests)
