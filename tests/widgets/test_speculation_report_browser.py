"""A speculative run's HTML report in headless Chromium: the speculation panels and the draft model's
page map render, and the step slider replays the draft page map and the draft-slot marks too."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
NUM_FIGURES = 8 + 1 + 2 + 1  # the usual eight, prefix misses, draft tokens + acceptance, the draft page map
DATA_JS = """(name) => {
  const m = Bokeh.documents[0].get_model_by_name(name);
  return m.data !== undefined ? Object.fromEntries(Object.entries(m.data).map(([k, v]) => [k, [...v]])) : m.value;
}"""
VIEWS_JS = """(type) => [...Bokeh.index.all_views()].filter(v => v.model.type == type).length"""


@pytest.fixture(scope="module")
def spec_run():
    """The tiny model with an early-exit draft (its first layer), small blocks, a few requests."""
    from kvscope import Engine, SamplingParams
    from kvscope.engine.spec_decode.draft_model import early_exit_draft
    from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer
    from kvscope.runs.result.run import Run

    target = build_tiny_model("llama")
    engine = Engine(target, tokenizer=build_tiny_tokenizer(), block_size=4, num_blocks=96, speculative_config={
        "method": "draft_model", "model": early_exit_draft(target, 1), "num_speculative_tokens": 3})
    prompts = [[5 + i, 9, 13, 5 + i, 9, 13, 40 + i, 41] * 2 for i in range(4)]
    engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    return Run.from_engine(engine)


@pytest.fixture(scope="module")
def report(spec_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "spec.html"
    spec_run.save_html(path)
    return path


def test_speculation_panels_render_and_the_slider_replays_the_draft_pool(page, report, spec_run, artifacts):
    page.goto(report.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({VIEWS_JS})('Figure') >= {NUM_FIGURES}", timeout=30_000)
    page.wait_for_timeout(500)
    assert page.evaluate(VIEWS_JS, "Figure") == NUM_FIGURES
    tokens = page.evaluate(DATA_JS, "spec-tokens")
    spec_steps = [r for r in spec_run.records if r.spec_decode is not None]
    assert tokens["accepted"] == [r.spec_decode.num_accepted_tokens for r in spec_steps]
    summary = spec_run.summary()
    assert f"{summary['spec_acceptance_rate']:.1%}" in page.get_by_text("Speculative decoding —").inner_text()

    # to a step with drafts: the target's marks and the draft pool's map follow the slider
    step = next(r.step for r in spec_steps if r.spec_decode.num_drafts and r.step > 2)
    handle = page.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("Home")
    first = page.evaluate(DATA_JS, "page-map-slider")
    for _ in range(step - first):
        page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    assert page.evaluate(DATA_JS, "page-map-slider") == step
    marks = page.evaluate(DATA_JS, "page-map-draft-slots")
    record = next(r for r in spec_run.records if r.step == step)
    assert marks["block"] == sorted(record.spec_decode.draft_slots)
    assert page.get_by_text(f"draft page map after step {step}:").count() == 1
    page.screenshot(path=str(artifacts / "report_speculative.png"), full_page=True)
    log = page.kvscope_log
    assert log["blocked"] == [] and log["errors"] == [] and log["dialogs"] == []
