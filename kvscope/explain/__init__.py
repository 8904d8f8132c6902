"""Why: explanations read from a run's records (never from a live engine).

- ``sharing``: which earlier prompt each prompt shares the most with (whole blocks, the first differing token),
  and vLLM's rules applied to prompts sent one after another (``predict_vllm``: its prefix-cache counters);
- ``prefix``: per request, what the prefix cache gave, what it could have given, and why not (``prefix_misses``);
- ``report``: run totals, top divergence points, the table ``kvscope explain`` prints, the JSON it writes;
- ``waits``: each request's queue time split by why it waited, and the tokens recomputed after preemptions;
- ``slow``: steps far above what a step-time model (passed in) expects, and what set them apart.

This package reads plain records (``kvscope.telemetry``) only; it sits beside the widgets, which draw it.
"""
