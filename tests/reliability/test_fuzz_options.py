"""Fuzzing the run options (kvscope/options/run.py) and the prompt reader: any value, any command line, any
prompts text. A value parser returns a value inside its documented range or refuses with one short
``OptionError`` line, never another exception (a huge seed, a size that overflows to infinity, a delay no
thread can wait for, 5,000 digits); both faces parse a command line alike; a prompts file's lines are its
``\\n``-separated lines, numbered as an editor numbers them. Each fuzzer runs inside the test that checks its
count (as in test_fuzz_loaders.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.cli.main import build_parser as build_cli_parser
from kvscope.cli.parser import CLIError
from kvscope.magic.run import build_parser as build_magic_parser
from kvscope.options import run as options
from kvscope.options.run import INT64_MAX, MAX_REQUESTS, MAX_STEP_DELAY, MAX_TOKENS, SEED_MAX, OptionError
from kvscope.runs.workload.items import read_prompt_lines

COUNTS = {"option values": 0, "command lines": 0, "prompts texts": 0}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# What each parser promises of a value it accepts.
PARSERS = {
    options.positive_int: lambda v: type(v) is int and 1 <= v <= INT64_MAX,
    options.nonneg_int: lambda v: type(v) is int and 0 <= v <= INT64_MAX,
    options.num_requests: lambda v: type(v) is int and 1 <= v <= MAX_REQUESTS,
    options.tokens: lambda v: type(v) is int and 0 <= v <= MAX_TOKENS,
    options.int64: lambda v: type(v) is int and abs(v) <= INT64_MAX,
    options.seed: lambda v: type(v) is int and 0 <= v <= SEED_MAX,
    options.block_size: lambda v: v in {2**i for i in range(9)},
    options.size: lambda v: type(v) is int and 1 <= v <= INT64_MAX,
    options.nonneg_size: lambda v: type(v) is int and 0 <= v <= INT64_MAX,
    options.length_range: lambda v: 1 <= v[0] <= v[1] <= MAX_TOKENS,
    options.seconds: lambda v: 0 <= v <= MAX_STEP_DELAY,
    options.refresh_rate: lambda v: 0.5 <= v <= 10,
}
EDGES = ["0", "-0", "1", "-1", "nan", "NaN", "inf", "-inf", "1e400", "1e-400", "1e400GiB", "9" * 400, "9" * 5000,
         "9" * 400 + "GiB", "1" + "0" * 19, str(2**63), str(2**63 - 1), str(2**64), str(2**64 - 1), str(-(2**63)),
         "18446744073709551616", "0x10", "1_000", " 7 ", "16-64", "64-16", "1-2-3", "8:16", "1.5", ".5", "5.",
         "1.5GiB", "1TB", "8EiB", "8191PiB", "2e3", "", " ", "\x00", "٣", "１２", "½", "+5", "--5"]
numberish = st.from_regex(r"[+-]?[0-9_]{0,25}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,4})?\s?([KMGTP]i?B?)?", fullmatch=True)
values = st.one_of(st.sampled_from(EDGES), numberish, st.text(max_size=12),
                   st.integers(-(2**70), 2**70).map(str), st.floats().map(repr),
                   st.tuples(st.integers(-5, 2**30), st.integers(-5, 2**30)).map(lambda t: f"{t[0]}-{t[1]}"))


def _check_one(parse, text: str) -> None:
    COUNTS["option values"] += 1
    try:
        value = parse(text)
    except OptionError as exc:
        line = str(exc)
        assert line and "\n" not in line and len(line) < 300, (parse.__name__, text[:50], line[:400])
        return
    assert PARSERS[parse](value), (parse.__name__, text[:50], value)
    if isinstance(value, float):
        assert math.isfinite(value)


@FUZZ
@given(text=values, parse=st.sampled_from(list(PARSERS)))
def fuzz_value_parsers(text, parse):
    _check_one(parse, text)


@FUZZ
@given(n=st.integers(-(2**80), 2**80))
def fuzz_whole_numbers_round_trip(n):
    for parse, lo, hi in ((options.positive_int, 1, INT64_MAX), (options.seed, 0, SEED_MAX),
                          (options.int64, -INT64_MAX, INT64_MAX), (options.size, 1, INT64_MAX)):
        COUNTS["option values"] += 1
        if lo <= n <= hi:
            assert parse(str(n)) == n
        else:
            with pytest.raises(OptionError):
                parse(str(n))


def test_option_value_fuzzers():
    before = COUNTS["option values"]
    fuzz_value_parsers()
    fuzz_whole_numbers_round_trip()
    assert COUNTS["option values"] - before >= 1000, COUNTS


# ---- whole command lines, both faces --------------------------------------------------------------------
def _shared_flags() -> list[str]:
    return [f for spec in options.RUN_OPTIONS if spec.faces == options.BOTH for f in spec.flags
            if f not in ("-h", "--help")]


ONE_FACE = {f for spec in options.RUN_OPTIONS if spec.faces != options.BOTH for f in spec.flags}
flags = st.sampled_from([*_shared_flags(), *sorted(ONE_FACE), "--o", "--max-new", "--frobnicate", "-z"])
joined = st.tuples(flags, values).map(lambda t: f"{t[0]}={t[1]}")  # --seed=99...9
argvs = st.lists(st.one_of(flags, joined, values), max_size=8)


def _parse(parser, argv):
    try:
        return "ok", vars(parser.parse_args(argv))
    except (OptionError, CLIError) as exc:
        if isinstance(exc, CLIError):
            assert exc.code == 2
        line = str(exc)
        assert line and "\n" not in line, line
        return "refused", line


@FUZZ
@given(argv=argvs)
def fuzz_command_lines_parse_alike_on_both_faces(argv):
    COUNTS["command lines"] += 1
    cli = _parse(build_cli_parser().commands["run"], argv)
    magic = _parse(build_magic_parser(), argv)
    if {a.split("=", 1)[0] for a in argv} & ONE_FACE:
        return  # an option only one face has (both refused or parsed cleanly above)
    assert cli[0] == magic[0], (argv, cli, magic)
    if cli[0] == "refused":
        assert cli[1].replace("kvscope run --help", "%kvscope --help") == magic[1], (argv, cli, magic)
    else:
        shared = {k: v for k, v in cli[1].items() if k in magic[1]}
        assert shared == {k: magic[1][k] for k in shared}


def test_command_line_fuzzer():
    before = COUNTS["command lines"]
    fuzz_command_lines_parse_alike_on_both_faces()
    assert COUNTS["command lines"] - before >= 250, COUNTS


# ---- the prompt reader ----------------------------------------------------------------------------------
SEPARATORS = ["\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", " ", "\t"]
prompt_texts = st.lists(st.one_of(st.sampled_from(SEPARATORS), st.text(max_size=6)), max_size=20).map("".join)


@FUZZ
@given(text=prompt_texts, bom=st.booleans())
def fuzz_prompt_lines_are_the_files_lines(tmp_path, text, bom):
    COUNTS["prompts texts"] += 1
    path = tmp_path / "prompts.txt"
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8", "surrogatepass"))
    expected = [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    try:
        got = read_prompt_lines(path)
    except ValueError as exc:
        assert "prompts file" in str(exc) and "\n" not in str(exc)
        assert not expected or "not UTF-8" in str(exc)  # (lone surrogates are no UTF-8)
        return
    assert got == expected
    assert all("\n" not in p and p.strip() for _, p in got)  # (a CR before a CRLF is text: '0\r\r\n' -> '0\r')


def test_prompt_reader_fuzzer(tmp_path):
    before = COUNTS["prompts texts"]
    fuzz_prompt_lines_are_the_files_lines(tmp_path=tmp_path)
    assert COUNTS["prompts texts"] - before >= 250, COUNTS
