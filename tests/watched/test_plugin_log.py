"""Tailing the plugin's JSONL: a file not there yet, lines cut mid-write, damaged lines, a file truncated or
replaced (read from its start), and lines too long to be lines."""

from __future__ import annotations

import json
import os

from kvscope.watched.plugin_log import MAX_LINE, PluginLog


def line(**fields) -> str:
    return json.dumps({"type": "step", **fields}) + "\n"


def test_tail_grows_with_the_file(tmp_path):
    path = tmp_path / "steps.jsonl"
    log = PluginLog(path)
    assert log.read() == []  # not there yet
    path.write_text(line(step=0) + '{"type": "step", "st')  # the second line is still being written
    assert [x["step"] for x in log.read()] == [0]
    with open(path, "a") as f:
        f.write('ep": 1}\n' + line(step=2))
    assert [x["step"] for x in log.read()] == [1, 2]
    assert log.read() == [] and log.num_lines == 3 and log.num_malformed == 0


def test_damaged_lines_are_counted_and_skipped(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("not json\n[1, 2]\n{\"no_type\": 1}\n\n" + "[" * 100_000 + "\n" + line(step=5))
    log = PluginLog(path)
    assert [x["step"] for x in log.read()] == [5]
    assert log.num_malformed == 4


def test_truncated_or_replaced_files_are_read_from_their_start(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text(line(step=0) + line(step=1))
    log = PluginLog(path)
    assert len(log.read()) == 2
    path.write_text(line(step=9))  # truncated and rewritten: shorter than before
    assert [x["step"] for x in log.read()] == [9]
    other = tmp_path / "new.jsonl"
    other.write_text(line(step=7) + line(step=8) + line(step=10))
    os.replace(other, path)  # a new file under the name (a server started again)
    assert [x["step"] for x in log.read()] == [7, 8, 10]


def test_a_line_longer_than_a_line_is_dropped(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("x" * (MAX_LINE + 10))
    log = PluginLog(path)
    assert log.read() == [] and log.num_malformed == 1
    with open(path, "a") as f:
        f.write("\n" + line(step=3))
    assert [x["step"] for x in log.read()] == [3]
