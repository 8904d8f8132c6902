"""``--replay RUN`` starts from the recorded run's engine settings (issue 37 item 3): the options given are the
what-if, and the setup says what changed; a header or requests that cannot be replayed are refused naming the
file, the field and the fix (issue 38 item 7); ``compare`` knows the replay of a run as such (issue 37 item 4)."""

from __future__ import annotations

import json

import pytest

from kvscope.cli.parser import Parser
from kvscope.engine.engine import Engine
from kvscope.options.parser import OptionError
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.comparison import compare
from kvscope.runs.result.run import Run, load
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import EngineSpec, RunSpec
from kvscope.runs.workload.items import synthetic_workload

SETTINGS = dict(block_size=16, num_blocks=40, max_num_seqs=8, max_num_batched_tokens=192)


def _live(make_engine, workload) -> Run:
    live = LiveRun(make_engine, workload, dashboard=False).start()
    live.wait()
    assert live.error is None, live.error
    return live.run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny run whose pool is small enough to preempt and whose prompts share a prefix (prefix-cache hits)."""
    items = synthetic_workload(24, (16, 96), (8, 32), vocab_size=512, shared_prefix_len=32, seed=3,
                               exclude_ids=(0, 1, 2))
    real = _live(Engine("tiny", **SETTINGS), items)
    path = tmp_path_factory.mktemp("replay") / "real.metrics.jsonl"
    real.save_metrics(path)
    return path, load(path)


def _schedule(run: Run) -> tuple:
    s = run.summary()
    return s["steps"], s["preemptions"], s["prefix_cache_hits"], s["peak_running"], s["output_tokens"]


def _simulate(path, engine: EngineSpec | None = None):
    setup = prepare_simulation(RunSpec(engine=engine or EngineSpec()), SimSpec(replay=str(path)))
    return setup, _live(setup.make_engine, setup.workload)


def test_a_replay_reproduces_the_run_with_its_own_settings(recorded):
    path, real = recorded
    assert real.summary()["preemptions"] > 0 and real.summary()["prefix_cache_hits"] > 0  # the case is a real one
    setup, sim = _simulate(path)
    for name, value in SETTINGS.items():
        assert getattr(setup.config, name) == value, name
    assert sim.meta["num_blocks"] == 40
    assert _schedule(sim) == _schedule(real)
    assert any("no setting changed from the run" in n for n in setup.notes), setup.notes
    replay = sim.meta["simulated"]["replay"]
    assert replay["changed"] == {} and replay["settings"]["max_num_seqs"] == 8
    assert replay["run"]["created_unix_s"] == real.meta["created_unix_s"] and replay["run"]["requests"] == 24

    cmp = compare(real, sim, labels=["real", "replay"])  # the replay of a run: no false warning
    assert cmp.warnings == []
    assert cmp.notes and cmp.notes[0].startswith("replay is a simulation replaying real")


def test_a_num_blocks_what_if_changes_only_that_and_says_so(recorded):
    path, real = recorded
    setup, sim = _simulate(path, EngineSpec(num_blocks=80))
    assert setup.config.num_blocks == 80 and sim.meta["num_blocks"] == 80
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        assert getattr(setup.config, name) == SETTINGS[name], name
    assert sim.meta["simulated"]["replay"]["changed"] == {"num_blocks": {"run": 40, "replay": 80,
                                                                          "why": "--num-blocks"}}
    assert any("num_blocks 40 -> 80 (--num-blocks)" in n for n in setup.notes), setup.notes
    assert sim.summary()["preemptions"] == 0  # twice the memory: none of the run's preemptions
    assert "num_blocks 40 -> 80" in compare(real, sim, labels=["real", "x2"]).notes[0]


def test_a_block_size_what_if_keeps_the_runs_kv_memory(recorded):
    path, _ = recorded
    setup = prepare_simulation(RunSpec(engine=EngineSpec(block_size=32)), SimSpec(replay=str(path)))
    changed = setup.sim_meta["replay"]["changed"]
    assert changed["block_size"]["run"] == 16 and changed["block_size"]["replay"] == 32
    assert changed["num_blocks"]["replay"] == 20 and "KV memory" in changed["num_blocks"]["why"]


def test_the_command_line_passes_on_only_the_options_typed():
    from kvscope.cli.simulate import COMMAND

    parser = Parser(prog="kvscope")
    COMMAND.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(["simulate", "--replay", "r.metrics.jsonl", "--num-blocks", "80"])
    engine = RunSpec.from_args(args).engine
    assert (engine.num_blocks, engine.block_size, engine.prefix_caching, engine.max_num_seqs) == (80, None, None, None)
    args = parser.parse_args(["simulate", "--replay", "r.metrics.jsonl", "--block-size", "16", "--no-prefix-caching"])
    engine = RunSpec.from_args(args).engine
    assert (engine.block_size, engine.prefix_caching) == (16, False)


def _edited(path, tmp_path, meta=None, event=None):
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    if meta:
        meta(header["meta"])
    body = [json.loads(line) for line in lines[1:]]
    for item in body:
        if event and item.get("type") == "event":
            event(item)
    out = tmp_path / "edited.metrics.jsonl"
    out.write_text("\n".join(json.dumps(x) for x in [header, *body]) + "\n")
    return out


@pytest.mark.parametrize(("meta", "event", "message"), [
    (lambda m: m.update(block_size=0), None, "has block_size=0, which must be a power of two"),
    (lambda m: m.pop("block_size"), None, "has no block_size"),
    (lambda m: m["spec"].update(head_dim=0), None, "has spec.head_dim=0"),
    (lambda m: m["config"].update(max_num_seqs=0), None, "has config.max_num_seqs=0"),
    (None, lambda e: e.pop("prompt_token_ids", None), "have no prompt_token_ids"),
    (None, lambda e: e.update(request_id="req-0"), "request id 'req-0' has two 'queued' events"),
])
def test_a_header_or_requests_that_cannot_be_replayed_are_refused_naming_file_field_and_fix(
        recorded, tmp_path, meta, event, message):
    edited = _edited(recorded[0], tmp_path, meta, event)
    with pytest.raises(OptionError, match=message) as caught:
        prepare_simulation(RunSpec(), SimSpec(replay=str(edited)))
    assert "edited.metrics.jsonl" in str(caught.value) and "record the run again" in str(caught.value)


def test_compare_says_when_it_compares_unlike_systems(recorded):
    _, real = recorded
    pd_run = Run(real.records, real.events, {**real.meta, "pd": {"layout": "1P1D", "records_from": "decode-0"}})
    warnings = compare(real, pd_run, labels=["colocated", "pd"]).warnings
    assert any(w.startswith("unlike systems (colocated: colocated, pd: P/D 1P1D)") and "decode-0" in w
               for w in warnings), warnings
    assert compare(pd_run, pd_run).warnings == []


def test_a_static_what_if_says_static_changed_the_batch(recorded):
    path, _ = recorded
    setup = prepare_simulation(RunSpec(engine=EngineSpec(max_model_len=128)), SimSpec(replay=str(path), static=True))
    changed = setup.sim_meta["replay"]["changed"]
    assert changed["max_model_len"] == {"run": 2048, "replay": 128, "why": "--max-model-len"}
    assert changed["max_num_seqs"]["replay"] == 5 and changed["max_num_seqs"]["why"].startswith("--static")
    assert any("static reservation: 128 token slots per request" in n for n in setup.notes)


def test_calibrate_refuses_a_header_whose_block_size_it_would_divide_by(recorded, tmp_path):
    from kvscope.cli.calibrate import COMMAND, cmd_calibrate
    from kvscope.cli.parser import CLIError

    edited = _edited(recorded[0], tmp_path, lambda m: m.update(block_size=0))
    parser = Parser(prog="kvscope")
    COMMAND.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    with pytest.raises(CLIError, match=r"edited\.metrics\.jsonl: its header .* has block_size=0, which must"):
        cmd_calibrate(parser.parse_args(["calibrate", str(edited), "-o", str(tmp_path / "step.json")]))
    assert not (tmp_path / "step.json").exists()
