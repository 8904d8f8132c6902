"""The real vLLM the watch tests run against: the virtualenv ``.ci/vllm-env`` prepares, a tiny random Llama
(head size 64) with the tiny tokenizer, and servers on 127.0.0.1 that the fixtures start and always end.

Without the vLLM virtualenv these tests are skipped, with the command that prepares it; when ``CI`` is set
they fail instead (the issue requires them to run in CI, not to be skipped there). A server start costs
40-100 s on two cores, so a module starts at most one and its tests share it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # real_vllm_util


