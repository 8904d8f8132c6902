"""The run options' one home (kvscope/options/run.py): `kvscope run` and `%kvscope` take the same options, with
the same defaults and help, and refuse the same bad values with the same line; options.py is stdlib-only;
neither face imports the other."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from kvscope.cli.main import build_parser as build_cli_parser
from kvscope.cli.main import main
from kvscope.magic.run import build_parser as build_magic_parser
from kvscope.options import run as options
from kvscope.options.run import CLI, MAGIC, RUN_OPTIONS, OptionError

pytestmark = pytest.mark.timeout(300)
PACKAGE = Path(options.__file__).parent
UNWRITABLE = "/proc/kvscope-test.json"  # a folder nobody can create files in, root included (Linux)
HELP = {"-h", "--help"}

# Bad values for every option both faces take, keyed by the option's first long name ({tmp}: the
# ``inputs`` folder). test_every_shared_option_has_bad_values makes a new option add its own here.
BAD = {
    "--model": ["no-such-model", "", "./no/such/folder", "{tmp}/no-config", "a/b/c"],
    "--requests": ["0", "1.5", "two"],
    "--prompts": ["{tmp}/missing.txt", "{tmp}", "{tmp}/blank.txt", "{tmp}/latin1.txt"],
    "--prompt-len": ["10-5", "0", "x", "1-2-3"],
    "--output-len": ["0", "64-16"],
    "--shared-prefix": ["-1", "x"],
    "--ignore-eos": ["yes"],
    "--no-chat-template": ["yes"],
    "--rate": ["0", "-2", "inf", "nan", "x"],
    "--arrival": ["uniform", "gamma", "gamma:0", "gamma:x", "gamma:1000", "poisson:2"],
    "--temperature": ["-1", "inf", "nan", "x"],
    "--top-k": ["-1", "x"],
    "--top-p": ["0", "1.5"],
    "--seed": ["x", "1.5"],
    "--block-size": ["0", "3", "512", "x"],
    "--num-blocks": ["0", "-3"],
    "--kv-memory": ["0", "lots", "-1GiB"],
    "--max-num-batched-tokens": ["-1"],
    "--max-num-seqs": ["0"],
    "--max-model-len": ["0"],
    "--prefix-caching": ["maybe", "ON"],
    "--no-prefix-caching": ["yes"],
    "--profile": ["-1", "x"],
    "--speculative": ["ngram", "ngram:0", "ngram:x", "ngram:4:3-2", "ngram:100", "eagle:3", "draft:tiny",
                      "draft:no-such-model:3"],
    "--pd": ["1P", "0P1D", "1P17D", "P1D", "1D1P", "x"],
    "--capture-slow": ["-1", "x", "3:0", "3:65", "1001", "3:x", ":", "3:2:1"],
    "--step-delay": ["-1", "nan", "inf", "x"],
    "--trace": ["{tmp}", "{tmp}/no/such/t.json", UNWRITABLE],
    "--metrics": ["{tmp}", UNWRITABLE],
    "--html": ["{tmp}", "{tmp}/no/such/r.html"],
    "--quiet": ["yes"],
}


def run_parser() -> argparse.ArgumentParser:
    return build_cli_parser().commands["run"]


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """First long name -> action, for every option but --help."""
    out = {}
    for action in parser._actions:
        if action.option_strings and not set(action.option_strings) & HELP:
            out[next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])] = action
    return out


def face_only(face: str) -> set[str]:
    return {s.name for s in RUN_OPTIONS if s.faces == (face,)}


def shared_cases() -> list[tuple[str, str]]:
    """(option string, bad value): every bad value under the option's first name, the first under each alias."""
    cases = []
    for spec in RUN_OPTIONS:
        if spec.faces == options.BOTH:
            values = BAD.get(spec.name, [])
            cases += [(spec.name, v) for v in values]
            cases += [(alias, values[0]) for alias in spec.flags if alias != spec.name and values]
    return cases


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "latin1.txt").write_bytes("ok\ncafé au lait\n".encode("latin-1"))
    (folder / "blank.txt").write_text("\n   \n\t\n")
    (folder / "no-config").mkdir()
    return folder


# ---- one home, stdlib only ------------------------------------------------------------------------------
def test_importing_options_and_building_both_parsers_loads_nothing_heavy(tmp_path):
    code = ("import argparse, json, sys\n"
            "import kvscope.options.run as o\n"
            "for face in (o.CLI, o.MAGIC):\n"
            "    p = o.OptionParser(prog='x')\n"
            "    o.add_run_options(p, face)\n"
            "    p.parse_args(['--block-size', '8', '--requests', '3', '--step-delay', '0.1', '--trace', 't.json'])\n"
            "heavy = ('torch', 'IPython', 'transformers', 'numpy', 'bokeh', 'pandas', 'kvscope.engine.config')\n"
            "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_specs_are_well_formed():
    flags = [f for s in RUN_OPTIONS for f in s.flags]
    assert len(flags) == len(set(flags)), "an option string is declared twice"
    for spec in RUN_OPTIONS:
        assert spec.help and spec.group and spec.faces and set(spec.faces) <= {CLI, MAGIC}, spec.name
        assert all(f.startswith("-") for f in spec.flags), spec.name
    with pytest.raises(ValueError, match="face must be"):
        options.add_run_options(argparse.ArgumentParser(), "web")


@pytest.mark.parametrize("parse, text, value", [
    (options.positive_int, "7", 7), (options.nonneg_int, "0", 0), (options.block_size, "64", 64),
    (options.size, "2MiB", 2 << 20), (options.nonneg_size, "0", 0), (options.length_range, "8-16", (8, 16)),
    (options.length_range, "5", (5, 5)), (options.seconds, "0.25", 0.25), (options.refresh_rate, "0.5", 0.5),
    (options.capture_slow, "5", (5, options.DEFAULT_CAPTURE_WINDOWS)), (options.capture_slow, " 2:7 ", (2, 7)),
    (options.capture_slow, "off", None), (options.capture_slow, "0", None),
])
def test_value_parsers_read_good_values(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse, text, why", [
    (options.positive_int, "0", "'0' must be at least 1"),
    (options.positive_int, "x", "'x' is not a whole number"),
    (options.nonneg_int, "-1", "'-1' must be 0 or more"),
    (options.block_size, "48", "'48' must be a power of two between 1 and 256, like 16"),
    (options.size, "lots", "cannot read 'lots' as a size"),
    (options.length_range, "9-3", "the upper end 3 is below the lower end 9"),
    (options.seconds, "nan", "'nan' must be a number of seconds >= 0"),
    (options.seconds, "soon", "'soon' is not a number"),
    (options.refresh_rate, "11", "'11' must be between 0.5 and 10 updates per second"),
    (options.capture_slow, "4:0", "'4:0': write STEPS or STEPS:WINDOWS"),
    (options.out_path, "/no/such/dir/t.json", "the folder of '/no/such/dir/t.json' does not exist"),
])
def test_value_parsers_refuse_with_one_neutral_error(parse, text, why):
    with pytest.raises(OptionError, match=why) as caught:
        parse(text)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


# ---- parity -----------------------------------------------------------------------------------------------
def test_every_cli_option_is_in_the_magic_and_back():
    """The same names, aliases, dests, defaults, choices, arity and help on both faces, but for the options
    declared for one face only (the CLI's --out; the magic's display options)."""
    cli, magic = option_actions(run_parser()), option_actions(build_magic_parser())
    assert face_only(CLI) == {"--out"}
    assert face_only(MAGIC) == {"--refresh", "--rollover", "--wait", "--return-run"}
    assert set(cli) - face_only(CLI) == set(magic) - face_only(MAGIC)
    assert set(cli) == {s.name for s in RUN_OPTIONS if CLI in s.faces}
    for name in set(cli) - face_only(CLI):
        a, b = cli[name], magic[name]
        for field in ("option_strings", "dest", "default", "const", "choices", "nargs", "metavar", "help",
                      "type"):
            assert getattr(a, field) == getattr(b, field), (name, field)
        assert type(a) is type(b), name


def test_run_options_match_the_magic():
    """Every option of %kvscope that is not about the notebook display exists in `kvscope run`
    (moved here from tests/test_cli.py)."""
    magic_parser = build_magic_parser()
    display_only = {"--refresh", "--rollover", "--wait", "-w", "-o", "--return-run"}
    magic = {s for a in magic_parser._actions for s in a.option_strings} - display_only - {"-h", "--help"}
    run = {s for a in run_parser()._actions for s in a.option_strings}
    assert magic <= run, sorted(magic - run)
    magic_defaults = vars(magic_parser.parse_args([]))
    run_defaults = vars(run_parser().parse_args([]))
    for action in magic_parser._actions:
        if action.option_strings and not set(action.option_strings) & display_only and action.dest != "help":
            assert run_defaults[action.dest] == magic_defaults[action.dest], action.dest


def test_every_shared_option_has_bad_values():
    shared = {s.name for s in RUN_OPTIONS if s.faces == options.BOTH}
    assert set(BAD) == shared, sorted(set(BAD) ^ shared)
    assert all(BAD[name] for name in shared)


@pytest.mark.parametrize(("flag", "value"), shared_cases())
def test_a_bad_value_gets_the_same_refusal_from_both_faces(ip, capsys, inputs, tmp_path, flag, value):
    value = value.format(tmp=inputs)
    out = tmp_path / "out"
    out.mkdir()
    code = main(["run", "--out", str(out / "run"), "-q", flag, value])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvscope: error: ") and "Traceback" not in err, err
    assert list(out.iterdir()) == []
    with pytest.raises(UsageError) as caught:
        run = ip.run_line_magic("kvscope", f"-q -o {flag} {shlex.quote(value)}")
        run.stop()  # not refused: stop what started (the test fails above all the same)
    magic_line = str(caught.value)
    assert "\n" not in magic_line
    cli_line = lines[0].removeprefix("kvscope: error: ").replace("(see 'kvscope run --help')",
                                                                 "(see '%kvscope --help')")
    assert cli_line == magic_line


# ---- no face imports the other ------------------------------------------------------------------------
def kvscope_imports(module: str) -> set[str]:
    """The kvscope modules ``module`` imports by name, at the top or inside functions (as import-linter
    counts them: importing ``kvscope.a.b`` is no import of the packages ``kvscope`` and ``kvscope.a``)."""
    spec = importlib.util.find_spec(module)
    package = module if spec.submodule_search_locations is not None else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kvscope"}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            if target.split(".")[0] != "kvscope":
                continue
            for alias in node.names:  # `from . import x`: the submodule x if there is one, else the package
                found.add(f"{target}.{alias.name}" if is_module(f"{target}.{alias.name}") else target)
    return found


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # an attribute of a module, not a submodule
        return False


def reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for imported in kvscope_imports(todo.pop()) - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


CLI_SIDE = {"kvscope.cli.main", "kvscope.cli.parser", "kvscope.cli.run", "kvscope.runs.setup.demo",
            "kvscope.__main__"}


def test_the_chain_finder_follows_imports_inside_functions():
    assert "kvscope.runs.setup.prepare" in kvscope_imports("kvscope.cli.run")  # only inside cmd_run
    needed = {"kvscope.runs.setup.prepare", "kvscope.options.run", "kvscope.engine.config"}
    assert needed <= reachable("kvscope.magic.run")


@pytest.mark.parametrize("module", sorted(CLI_SIDE))
def test_the_cli_does_not_import_the_magic(module):
    assert "kvscope.magic.run" not in reachable(module)


@pytest.mark.parametrize("module", ["kvscope.magic.run", "kvscope.options.run", "kvscope.runs.setup.prepare"])
def test_the_magic_and_the_shared_modules_do_not_import_the_cli(module):
    assert not reachable(module) & CLI_SIDE
    if module != "kvscope.magic.run":
        assert "kvscope.magic.run" not in reachable(module)


def test_memory_sizes_refuse_a_bare_number_too_small_to_be_bytes():
    """``kvscope plan --gpu-mem 40`` was planned as 40 bytes: a bare number below 1 MiB is a unit left out."""
    from kvscope.options.values import memory_size, nonneg_memory_size

    for text, unit in (("40", "40GiB"), ("1.5", "1.5GiB"), (" 80 ", "80GiB"), ("1048575", "1048575GiB")):
        with pytest.raises(OptionError, match=f"did you mean {re.escape(unit)}\\?"):
            memory_size(text)
    assert memory_size("40GiB") == memory_size("40G") == 40 << 30
    assert memory_size("1048576") == 1 << 20 and memory_size("512KiB") == 512 << 10  # bytes, or a unit: as given
    assert nonneg_memory_size("0") == 0
    with pytest.raises(OptionError, match="did you mean 4GiB"):
        nonneg_memory_size("4")
