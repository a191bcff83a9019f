"""Every bad input is one line, exit 2, nothing lost (issue 12, item 4 and the fuzz half of item 8).

Property-based (hypothesis, derandomized: the same cases on every run): specs,
flag vectors, session directories and KB files, mutated, run in-process through
``inferloom.cli.main``. Each case must end with exit 0 or 2 (1 only where a
resumed run may legitimately fail), never an uncaught exception, an error of
one line, and no file written outside the command's named output (the whole
scratch directory is snapshotted before and after). The real inputs are made
once per module: a small closed session and an interrupted one with the
synthetic adapter, and a KB export holding the closed session's recipe.
Below the properties, one regression test per case the issue lists.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import tempfile
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from inferloom.cli import main
from inferloom.phases.runner import start
from inferloom.spec import ProtocolSpec, QualitySpec, ServingSpec, Traffic, WorkloadSpec, load_spec
from inferloom.workloads.synthetic import SyntheticAdapter

FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])
SMALL = ["--framework", "synthetic", "--model", "llama-tiny", "--device", "cpu"]
BASE_SPEC = {"model": "llama-tiny", "framework": "synthetic", "device": "cpu", "seed": 0,
             "traffic": {"concurrency": 4, "input_len": 32, "output_len": 16, "num_prompts": 8},
             "quality": {"eval_prompts": 4, "heldout_prompts": 4, "prompt_len": 8, "continuation_len": 8},
             "protocol": {"min_pairs": 3, "max_pairs": 3, "bootstrap_resamples": 199, "min_gain": 0.01},
             "serving": {"startup_timeout_s": 300}, "pinned": {}}
RUNS: list[int] = []
#: INFERLOOM_FUZZ_SCALE=10 runs ten times the examples (a deeper local run; CI keeps 1)
SCALE = float(os.environ.get("INFERLOOM_FUZZ_SCALE", "1"))


def _n(examples: int) -> int:
    return max(1, int(examples * SCALE))

  # one count per fuzz case run (the report's total)


class Outcome:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(argv: list[str], root: Path, may_write: tuple[Path, ...] = (), ok: tuple[int, ...] = (0, 2)) -> Outcome:
    """``main(argv)`` in-process, in ``root``; asserts the contract (see the module docstring)."""
    before = _snapshot(root)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse: --help or a usage error
                rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - the property under test
        pytest.fail(f"uncaught exception for {argv!r}:\n{traceback.format_exc()}")
    finally:
        os.chdir(cwd)
    RUNS.append(1)
    o = Outcome(rc, out.getvalue(), err.getvalue())
    assert rc in ok, (argv, rc, o.err[-2000:])
    assert "Traceback" not in o.err and "Traceback" not in o.out, (argv, o.err[-2000:])
    if rc == 2:
        lines = [ln for ln in o.err.splitlines() if ln.strip().startswith("inferloom")]
        assert len(lines) == 1 and "error:" in lines[0], (argv, o.err[-2000:])
    after = _snapshot(root)
    allowed = [str(p.relative_to(root)) for p in may_write]
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    outside = sorted(k for k in changed if not any(k == a or k.startswith(a + "/") for a in allowed))
    assert not outside, (argv, "wrote outside its named output", outside)
    return o


# ---------------------------------------------------------------- real inputs, made once
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A closed session, an interrupted one, and a KB export, made once with the synthetic adapter."""
    w = tmp_path_factory.mktemp("fuzz-world")
    kb = w / "kb.sqlite"
    assert main(["optimize", *SMALL, "--seed", "3", "--budget-minutes", "5", "--max-trials", "2", "--cycles", "1",
                 "--no-sweep", "--min-pairs", "3", "--max-pairs", "3", "--kb", str(kb), "--out", str(w / "closed"),
                 "--quiet"]) == 0
    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                            "protocol.bootstrap_resamples": 199, "protocol.min_pairs": 3, "protocol.max_pairs": 3,
                            "quality.eval_prompts": 2, "quality.heldout_prompts": 2, "quality.prompt_len": 8,
                            "quality.continuation_len": 8})
    seen = []

    def stop_after_a_few(msg: str) -> None:
        seen.append(msg)
        if len(seen) == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start(w / "open", spec, budget_minutes=5, max_trials=2, adapter=SyntheticAdapter(), kb_url=None,
              progress=stop_after_a_few, sweep=False, cycle_ceiling=1)
    assert main(["kb", "--kb", str(kb), "export", str(w / "kb.json")]) == 0
    return w


@pytest.fixture()
def fresh(tmp_path):
    """A new empty directory per call (hypothesis runs many examples in one test call)."""
    return lambda: Path(tempfile.mkdtemp(dir=tmp_path))


# ---------------------------------------------------------------- hostile values
HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([0, -1, -2, 2**31, 2**63, 2**64, -(2**63) - 1, 10**19, 10**30, 1e9, 1e12, 1e308, -1e308, 0.5,
                     float("nan"), float("inf"), float("-inf"), "1e9", "1e400", "nan", "9" * 5000, True, False]),
    st.integers(), st.floats())
HOSTILE = st.one_of(HOSTILE_NUMBERS, st.none(), st.text(max_size=12), st.just([]), st.just({}),
                    st.just({"a": [1, {"b": None}]}), st.lists(st.integers(), max_size=3))


def _deep(n: int) -> str:
    """A marker :func:`_dumps` writes as ``n`` nested lists (too deep for json.dumps itself)."""
    return f"@@DEEP{n}@@"


def _set_path(doc: object, path: list, value: object) -> object:
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return doc


def _paths(doc: object, prefix: tuple = ()) -> list:
    out = [list(prefix)] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated_json(draw, doc: object) -> object:
    """``doc`` with one to three edits: a value replaced by a hostile one, a key removed, a deep nest."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["value", "value", "remove", "deep"]))
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        if kind == "remove":
            del parent[path[-1]]
        else:
            _set_path(doc, path, _deep(draw(st.sampled_from([70, 3000]))) if kind == "deep" else copy.deepcopy(draw(HOSTILE)))
    return doc


def _dumps(doc: object) -> str:
    """JSON of ``doc``, with the deep-nesting markers expanded and 5000-digit integers written out."""
    try:
        text = json.dumps(doc)
    except ValueError:  # a 5000-digit integer can't be written by json: write its digits
        text = json.dumps(doc, default=str).replace('"' + "9" * 5000 + '"', "9" * 5000)
    for n in (70, 3000):
        text = text.replace(f'"{_deep(n)}"', "[" * n + "]" * n)
    return text


# ---------------------------------------------------------------- specs
def _yaml_of(doc: object) -> str:
    return _dumps(doc)  # JSON is YAML (flow style)


@st.composite
def spec_bytes(draw) -> bytes:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "alias", "duplicate", "deep", "encoding",
                                 "garbage", "number"]))
    if kind == "mutated":
        return _yaml_of(draw(mutated_json(BASE_SPEC))).encode()
    block = "model: llama-tiny\nframework: synthetic\ndevice: cpu\n"
    if kind == "alias":
        n = draw(st.integers(1, 9))
        lines = ["pinned:", "  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, n)]
        return (block + "\n".join(lines) + "\n").encode()
    if kind == "duplicate":
        key = draw(st.sampled_from(["seed: 1", "traffic: {concurrency: 2}", "model: llama-tiny"]))
        return (block + key + "\n" + key + "\n").encode()
    if kind == "deep":
        n = draw(st.sampled_from([65, 500, 20000]))
        return (block + "pinned: {a: " + "[" * n + "]" * n + "}\n").encode()
    if kind == "encoding":
        enc = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "utf-8-sig"]))
        return (block + "# café\n").encode(enc)
    if kind == "number":
        key = draw(st.sampled_from(["seed", "traffic.concurrency", "protocol.max_pairs",
                                    "protocol.bootstrap_resamples", "traffic.num_prompts", "serving.request_rate"]))
        val = draw(st.sampled_from(["9" * 5000, "1e9", "1000000000", "1.0e400", ".nan", "-.inf", "0x7fffffffffffffffff",
                                    "-1", "1_000_000_000_000", "2001-12-14", "!!binary aGk=", "!!set {a}"]))
        top, _, sub = key.partition(".")
        return (block + (f"{top}:\n  {sub}: {val}\n" if sub else f"{top}: {val}\n")).encode()
    raw = bytearray(_yaml_of(BASE_SPEC).encode())
    for _ in range(draw(st.integers(1, 4))):
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


@settings(FUZZ, max_examples=_n(150))
@given(data=spec_bytes(), command=st.sampled_from(["validate", "validate", "knobs"]))
def test_fuzzed_specs_are_exit_0_or_2_never_a_traceback(data, command, fresh):
    scratch = fresh()
    spec = scratch / "spec.yaml"
    spec.write_bytes(data)
    run_cli([command, str(spec)], scratch)


# ---------------------------------------------------------------- flags
FLAG_VALUES = st.one_of(st.sampled_from(["0", "-1", "-2", "nan", "inf", "-inf", "1e9", "1e400", "", "9" * 5000,
                                          "0x10", "3", "4", "9", "15", "true", "=", "a=b", "fast_path=true", "1.5"]),
                        st.integers(-10, 10**12).map(str), st.floats().map(str), st.text(max_size=8))
COMMON_FLAGS = ["--min-pairs", "--max-pairs", "--concurrency", "--input-len", "--output-len", "--num-prompts",
                "--seed", "--min-gain", "--confidence", "--warmup-runs", "--pin", "--dtype", "--device"]
FLAGS = {"optimize": COMMON_FLAGS + ["--budget-minutes", "--max-trials", "--cycles"],
         "bench": COMMON_FLAGS + ["--candidate"], "validate": COMMON_FLAGS,
         "kb lookup": COMMON_FLAGS + ["--min-confidence"]}


@settings(FUZZ, max_examples=_n(150))
@given(command=st.sampled_from(sorted(FLAGS)), data=st.data())
def test_fuzzed_flags_are_exit_0_or_2_never_a_traceback(command, data, world, fresh):
    scratch = fresh()
    flags = data.draw(st.lists(st.sampled_from(FLAGS[command]), min_size=1, max_size=4))
    argv = command.split() + SMALL + [f"{f}={data.draw(FLAG_VALUES)}" for f in flags]
    if command == "optimize":  # an existing session: valid flags stop there, before any run (exit 2)
        shutil.copytree(world / "closed", scratch / "s")
        argv += ["--no-kb", "--quiet", "--out", str(scratch / "s")]
    elif command == "kb lookup":
        argv = ["kb", "--kb", str(scratch / "kb.sqlite")] + argv[1:]
    run_cli(argv, scratch, may_write=(scratch / "kb.sqlite",))


# ---------------------------------------------------------------- session directories
@st.composite
def mutated_session_file(draw, src: Path) -> tuple[str, bytes | None]:
    """One file of the session ``src``, damaged: (name, new bytes or None to delete it)."""
    name = draw(st.sampled_from(["ledger.jsonl", "ledger.jsonl", "ledger.jsonl", "state.json", "manifest.json"]))
    data = (src / name).read_bytes()
    kind = draw(st.sampled_from(["json", "json", "json", "lines", "bytes", "truncate", "delete", "empty", "deep"]))
    if kind == "delete":
        return name, None
    if kind == "empty":
        return name, b""
    if kind == "truncate":
        return name, data[:draw(st.integers(0, len(data) - 1))]
    if kind == "bytes":
        raw = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            raw.insert(draw(st.integers(0, len(raw))), draw(st.sampled_from([0, 0xff, 0xfe, 0x80, ord("{"),
                                                                             ord("\n"), ord('"')])))
        return name, bytes(raw)
    lines = data.decode().splitlines() if name == "ledger.jsonl" else [data.decode()]
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "deep":
        lines[i] = lines[i][:-1] + ', "deep": ' + "[" * 20000 + "]" * 20000 + "}"
    elif kind == "json":
        lines[i] = _dumps(draw(mutated_json(json.loads(lines[i]))))
    elif len(lines) > 1:
        op = draw(st.sampled_from(["duplicate", "drop", "swap", "cut"]))
        j = draw(st.integers(0, len(lines) - 1))
        if op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "drop":
            del lines[i]
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = lines[i][:len(lines[i]) // 2]
    return name, ("\n".join(lines) + ("\n" if name == "ledger.jsonl" else "")).encode()


def _damaged_copy(world: Path, which: str, scratch: Path, data) -> Path:
    d = scratch / "s"
    shutil.copytree(world / which, d)
    name, new = data.draw(mutated_session_file(world / which))
    if new is None:
        (d / name).unlink()
    else:
        (d / name).write_bytes(new)
    return d


@settings(FUZZ, max_examples=_n(120))
@given(command=st.sampled_from(["report", "report --html", "export", "resume"]), data=st.data())
def test_fuzzed_closed_sessions_are_exit_0_or_2_never_a_traceback(command, data, world, fresh):
    scratch = fresh()
    d = _damaged_copy(world, "closed", scratch, data)
    argv = command.split() + [str(d)]
    outputs: tuple[Path, ...] = (d,)
    if command == "export":
        argv += ["--out", str(scratch / "exp")]
        outputs = (scratch / "exp",)
    run_cli(argv + (["--quiet"] if command == "resume" else []), scratch, may_write=outputs)


@settings(FUZZ, max_examples=_n(12))
@given(data=st.data())
def test_fuzzed_interrupted_sessions_resume_or_refuse_never_a_traceback(data, world, fresh):
    scratch = fresh()
    d = _damaged_copy(world, "open", scratch, data)
    run_cli(["resume", str(d), "--quiet"], scratch, may_write=(d,), ok=(0, 1, 2))


# ---------------------------------------------------------------- KB files
@settings(FUZZ, max_examples=_n(60))
@given(data=st.data())
def test_fuzzed_kb_exports_import_or_refuse_never_a_traceback(data, world, fresh):
    scratch = fresh()
    doc = json.loads((world / "kb.json").read_text())
    kind = data.draw(st.sampled_from(["json", "json", "json", "deep", "bytes", "number"]))
    f = scratch / "kb.json"
    if kind == "json":
        f.write_text(_dumps(data.draw(mutated_json(doc))))
    elif kind == "deep":
        f.write_text('{"format": "inferloom-kb", "schema_version": 1, "recipes": ' + "[" * 20000 + "]" * 20000 + "}")
    elif kind == "number":
        f.write_text(json.dumps(doc).replace('"schema_version": 1', '"schema_version": ' +
                                             data.draw(st.sampled_from(["9" * 5000, "1e999", "NaN", "18446744073709551616"]))))
    else:
        raw = bytearray(json.dumps(doc).encode())
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        f.write_bytes(bytes(raw))
    kb = scratch / "kb.sqlite"
    run_cli(["kb", "--kb", str(kb), "import", str(f)], scratch, may_write=(kb,))
    run_cli(["kb", "--kb", str(kb), "list"], scratch, may_write=(kb,))


@settings(FUZZ, max_examples=_n(30))
@given(rid=st.one_of(st.integers().map(str), st.sampled_from(["9" * 5000, str(2**63), str(2**64), "-1", "0", "1e3",
                                                              "abc", "", "1.5"])), garbage=st.booleans())
def test_fuzzed_kb_show_ids_and_damaged_kb_files(rid, garbage, world, fresh):
    scratch = fresh()
    kb = scratch / "kb.sqlite"
    shutil.copy(world / "kb.sqlite", kb)
    if garbage:
        raw = bytearray(kb.read_bytes())
        raw[:16] = b"not a database!!"
        kb.write_bytes(bytes(raw))
    run_cli(["kb", "--kb", str(kb), "show", rid], scratch, may_write=(kb,))


@pytest.fixture(scope="module", autouse=True)
def _count_runs():
    yield
    print(f"\nfuzz: {len(RUNS)} CLI runs in-process, 0 tracebacks")  # any traceback failed its test


# ---------------------------------------------------------------- the issue's cases, one by one
def _one_error_line(capsys, needle: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


BOMB = "pinned:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {b}: &{b} [" + ", ".join([f"*{a}"] * 9) + "]\n" for a, b in zip("abcdefg", "bcdefgh"))
HEAD = "model: llama-tiny\nframework: synthetic\ndevice: cpu\n"
SPEC_CASES = {
    "utf16": ((HEAD + "seed: 1\n").encode("utf-16"), "encoded as UTF-16 (it starts with a UTF-16 byte-order mark)"),
    "non_utf8": ((HEAD + "# caf\xe9\n").encode("latin-1"), "not UTF-8: byte 0xe9 at line 4"),
    "nesting_20000": ((HEAD + "pinned: {a: " + "[" * 20000 + "]" * 20000 + "}\n").encode(), "nested more than 64 levels"),
    "int_5000_digits": ((HEAD + "seed: " + "9" * 5000 + "\n").encode(), "an integer of 5000 digits at line 4"),
    "max_pairs_1e9": ((HEAD + "protocol:\n  max_pairs: 1e9\n").encode(), "protocol.max_pairs"),
    "max_pairs_10e9": ((HEAD + "protocol:\n  max_pairs: 1000000000\n").encode(), "less than or equal to 200"),
    "resamples_1e12": ((HEAD + "protocol:\n  bootstrap_resamples: 1000000000000\n").encode(),
                       "less than or equal to 100000"),
    "num_prompts_1e11": ((HEAD + "traffic:\n  num_prompts: 100000000000\n").encode(), "less than or equal to 100000"),
    "alias_bomb": ((HEAD + BOMB).encode(), "anchors and aliases are not allowed"),
    "duplicate_key": ((HEAD + "seed: 1\nseed: 2\n").encode(), "duplicate key 'seed' at line 5 (first at line 4)"),
    "nan": ((HEAD + "protocol:\n  min_gain: .nan\n").encode(), "is not finite"),
    "concurrency": ((HEAD + "traffic:\n  concurrency: 100000\n").encode(), "traffic.concurrency"),
    # CI's fuzz run found it (2026-12-03): an unhashable framework reached a dict lookup before validation
    "framework_list": (b"model: llama-tiny\nframework: []\ndevice: cpu\n", "framework"),
    "framework_map": (b"model: llama-tiny\nframework: {vllm: 1}\ndevice: cpu\n", "framework"),
}


@pytest.mark.parametrize("name", sorted(SPEC_CASES))
def test_issue_spec_cases_are_one_line_exit_2(name, tmp_path, capsys):
    data, needle = SPEC_CASES[name]
    if name == "alias_bomb":
        assert len(BOMB) < 400
    f = tmp_path / "spec.yaml"
    f.write_bytes(data)
    assert main(["validate", str(f)]) == 2
    line = _one_error_line(capsys, needle)
    assert str(f) in line or "spec key" in line


@pytest.mark.parametrize("argv, needle", [
    (["--budget-minutes", "0"], "--budget-minutes: got '0', expected a number over 0"),
    (["--budget-minutes", "-1"], "--budget-minutes: got '-1'"),
    (["--budget-minutes", "nan"], "--budget-minutes: got 'nan'"),
    (["--budget-minutes", "inf"], "--budget-minutes: got 'inf'"),
    (["--max-trials", "0"], "--max-trials: got '0', expected an integer from 1 to 10000"),
    (["--cycles", "0"], "--cycles: got '0', expected an integer from 1 to 100"),
    (["--cycles", "-2"], "--cycles: got '-2'"),
    (["--min-pairs", "9", "--max-pairs", "4"], "max_pairs (4) is below min_pairs (9)"),
])
def test_issue_flag_cases_are_one_line_exit_2(argv, needle, tmp_path, capsys):
    out = tmp_path / "s"
    with pytest.raises(SystemExit) if "pairs" not in argv[0] else contextlib.nullcontext():
        rc = main(["optimize", *SMALL, *argv, "--no-kb", "--quiet", "--out", str(out)])
        assert rc == 2
    _one_error_line(capsys, needle)
    assert not out.exists()  # refused before anything was written


def _edit_ledger(d: Path, how: str) -> None:
    lines = (d / "ledger.jsonl").read_text().splitlines()
    mid = len(lines) // 2
    if how == "truncated_middle_line":
        lines[mid] = lines[mid][: len(lines[mid]) // 2]
    elif how == "duplicated_seq":
        lines.insert(mid, lines[mid])
    else:
        e = json.loads(lines[mid])
        del e["kind"]
        lines[mid] = json.dumps(e)
    (d / "ledger.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("how, needle", [("truncated_middle_line", "is not a JSON object but is not the last line"),
                                         ("duplicated_seq", "expected"), ("missing_kind", "has no string 'kind'")])
@pytest.mark.parametrize("command", ["report", "resume", "export"])
def test_issue_damaged_ledgers_are_one_line_exit_2(how, needle, command, world, tmp_path, capsys):
    d = tmp_path / "s"  # resume reads the ledger of a session it continues: the interrupted one
    shutil.copytree(world / ("open" if command == "resume" else "closed"), d)
    _edit_ledger(d, how)
    before = _snapshot(tmp_path)
    extra = {"export": ["--out", str(tmp_path / "x")], "resume": ["--quiet"]}.get(command, [])
    assert main([command, str(d), *extra]) == 2
    assert "ledger.jsonl: line" in _one_error_line(capsys, needle)
    assert _snapshot(tmp_path) == before  # nothing written, nothing lost


@pytest.mark.parametrize("body, needle", [
    ('{"format": "inferloom-kb", "schema_version": 1, "recipes": ' + "[" * 20000 + "]" * 20000 + "}",
     "nested more than 64 levels"),
    ('{"format": "inferloom-kb", "schema_version": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ('{"format": "inferloom-kb", "schema_version": 1, "recipes": [{"created_at": 1e999}]}', "overflows a float"),
    ('{"format": "inferloom-kb", "schema_version": 1, "recipes": [{"id": 18446744073709551616}]}',
     "outside the signed 64-bit range"),
])
def test_issue_kb_import_cases_are_one_line_exit_2(body, needle, tmp_path, capsys):
    f = tmp_path / "kb.json"
    f.write_text(body)
    assert main(["kb", "--kb", str(tmp_path / "kb.sqlite"), "import", str(f)]) == 2
    assert str(f) in _one_error_line(capsys, needle)


@pytest.mark.parametrize("rid", [str(2**63), str(2**64), "9" * 5000, "-1"])
def test_issue_kb_show_ids_past_2_63_are_one_line_exit_2(rid, world, tmp_path, capsys):
    kb = tmp_path / "kb.sqlite"
    shutil.copy(world / "kb.sqlite", kb)
    assert main(["kb", "--kb", str(kb), "show", rid]) == 2
    _one_error_line(capsys, "is not a recipe id")


def test_every_spec_field_that_sizes_work_is_bounded_and_states_its_bounds():
    seen, todo = 0, [WorkloadSpec]
    while todo:
        model = todo.pop()
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                todo.append(ann)
            if any(type(m).__name__ == "Le" and m.le > 1 for m in f.metadata):  # not a share or a probability
                seen += 1
                assert "at most" in (f.description or ""), (model.__name__, name)
    assert seen >= 25
    for model, name in [(Traffic, "concurrency"), (Traffic, "input_len"), (Traffic, "output_len"),
                        (Traffic, "num_prompts"), (ProtocolSpec, "max_pairs"), (ProtocolSpec, "bootstrap_resamples"),
                        (ProtocolSpec, "warmup_runs"), (QualitySpec, "eval_prompts"), (ServingSpec, "request_timeout_s")]:
        assert "at most" in model.model_fields[name].description, name
    # the largest values in use (examples/*.yaml, docs/benchmarks.md: the 8B shape on one H200) are legal
    load_spec(None, {"model": "llama-3.1-8b", "traffic.concurrency": 64, "traffic.input_len": 256,
                     "traffic.output_len": 128, "traffic.num_prompts": 64, "protocol.max_pairs": 15})
