"""`inferloom report DIR --html`: one self-contained page, charts as inline SVG."""

import json
import re
from html.parser import HTMLParser

from inferloom.cli import main
from inferloom.measure.costs import mean_decode_context, step_costs
from inferloom.measure.roofline import amdahl_check, roofline
from inferloom.phases.runner import start
from inferloom.report.html import SECTIONS, render_html

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
SVG_LEAVES = {"line", "circle", "rect", "path", "polygon", "polyline"}  # written self-closed


class StrictParser(HTMLParser):
    """html.parser never raises; this one records unbalanced tags."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page):
    p = StrictParser()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    return p


CEILINGS = {"memory_bandwidth_bytes_per_s": 2.7e10, "matmul_flops_per_s": 3.7e11, "device_name": "Test CPU <x>",
            "matmul_dtype": "float32", "measured_at": "2026-01-01T00:00:00+00:00"}


def _roof(tok):
    costs = step_costs("llama-tiny", 4, mean_decode_context(32, 16), 4, input_len=32)
    return roofline(CEILINGS, costs, tok, 4, 16, 32)


def full_breakdown():
    """Shaped like breakdown_from_ledger's output for a real-engine session."""
    sweep = [{"point": [c, n], "cycle": 1, "ratio": r, "ci_low": r - 0.04, "ci_high": r + 0.05, "ledger_seq": seq}
             for (c, n, r, seq) in ((2, 16, 1.497, 19), (2, 32, 1.416, 20), (4, 16, 1.403, 21), (4, 32, 1.385, 22))]
    sweep.append({"point": [8, 32], "cycle": 1, "ratio": None, "ci_low": None, "ci_high": None, "ledger_seq": 23})
    cats = {"gemm": ("GEMM", 0.21), "attention": ("attention", 0.095), "normalization": ("normalization", 0.084),
            "elementwise": ("elementwise / activation", 0.048), "memory_copy": ("memory copy", 0.062),
            "communication": ("communication", 0.0), "other": ("other", 0.008), "idle": ("idle / launch gaps (host)", 0.493)}
    stock_r, final_r = _roof(1417.7), _roof(2034.0)
    return {
        "schema_version": 1,
        "stock": {"objective_median": 1417.7, "ledger_seq": 1,
                  "noise": {"ratio": 0.9497, "ci_low": 0.819, "ci_high": 1.101, "n_pairs": 5}},
        "final": {"objective_median": 2034.0, "stock_median_same_run": 1489.0, "ratio": 1.3191, "ci_low": 1.0304,
                  "ci_high": 1.6887, "n_pairs": 3, "protocol_verdict": "keep", "quality_passed": True,
                  "quality_failed": [], "ledger_seq": 24},
        "action_path": [
            {"trial": 2, "cycle": 1, "changes": {"cache_implementation": "static"}, "ratio": 1.12, "ci_low": 1.08,
             "ci_high": 1.16, "lesson": "kept", "quality_passed": True, "ledger_seq": 12},
            {"trial": 3, "cycle": 1, "changes": {"compile_mode": "default"}, "ratio": 1.18, "ci_low": 1.1,
             "ci_high": 1.25, "lesson": "kept", "quality_passed": None, "ledger_seq": 15}],
        "rejected": [{"trial": 1, "changes": {"compile_mode": "max-autotune"}, "outcome": "inconclusive",
                      "ratio": 0.3555, "ci_low": 0.0406, "ci_high": 3.1145,
                      "lesson": "<b>inconclusive</b> & reverted", "ledger_seq": 10}],
        "refusals": [{"rule": "pinned", "why": "dtype is pinned", "agent": "orchestrator", "ledger_seq": 7}],
        "unscored_keep_count": 1,
        "predicted_vs_measured": [{"trial": 1, "changes": {"compile_mode": "max-autotune"}, "predicted_gain": 0.3,
                                   "measured_ratio": 0.3555, "ledger_seq": 10}],
        "time_s": {"total": 109.8, "benchmark_runs": 55.0, "compilation": 33.2, "warmup_excluding_compilation": 7.2,
                   "quality_probes": 4.8, "harness": 9.5},
        "stop_reason": "budget: 3 trials used", "close_ledger_seq": 26,
        "stock_config": {"cache_implementation": "dynamic", "compile_mode": "off"},
        "final_config": {"cache_implementation": "static", "compile_mode": "default"},
        "sweep": sweep,
        "profile": {"categories": {k: {"label": lab, "seconds": s * 0.129, "share": s} for k, (lab, s) in cats.items()},
                    "top_ops": [{"name": "aten::linear", "category": "gemm", "seconds": 0.027, "share": 0.21, "count": 928}],
                    "wall_s": 0.129, "error": None, "ledger_seq": 3},
        "roofline": {"ceilings": CEILINGS, "stock": stock_r, "final": final_r,
                     "amdahl": amdahl_check(1.3191, stock_r["headroom"]), "ledger_seqs": [4, 12, 25],
                     "kept": [{"trial": 1, "cycle": 1, "changes": {"compile_mode": "default"}, "roofline": _roof(2900.0),
                               "ledger_seq": 12}], "stock_seq": 4, "final_seq": 25},
        "warm_replay": {"chosen": None, "confidence": 0.0, "ledger_seq": 2, "replayed": []},
        "phases": [{"from": "PRELUDE", "to": "FRAMEWORK", "why": "stock measured", "ledger_seq": 5},
                   {"from": "SWEEP", "to": "CLOSE", "why": "done", "ledger_seq": 23}],
    }


def _section(page, sid):
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, sid
    return m.group(1)


def _cited(page, seq):
    return re.search(rf'class="cite">\(ledger [^)]*#{seq}\b', page) is not None


def assert_self_contained(page):
    low = page.lower()
    assert "http://" not in low and "https://" not in low
    assert "<script" not in low and "<link" not in low and "<img" not in low and "url(" not in low


def test_full_page_parses_and_has_every_section_and_chart():
    b = full_breakdown()
    page = render_html(b)
    p = parse(page)
    assert_self_contained(page)
    headings = [t for t, _ in p.tags if t == "h2"]
    # no source patches (not a custom workload), no LLM agents, no platform audit (so neither Platform nor Energy),
    # no Deploy section (the page is rendered from a breakdown alone: the command needs the session's files)
    absent = ("patches", "llm", "platform", "energy", "deploy")
    assert "platform" not in b and len(headings) == len(SECTIONS) - len(absent)
    for key, title in SECTIONS.items():
        assert (f"<h2>{title}</h2>" in page.replace("&amp;", "&")) == (key not in absent)
    # the headline and its citation
    assert "x1.319" in page and "+31.9%" in _section(page, "summary") and _cited(page, 24)
    # every charted number's ledger entry is cited on the page
    for seq in [1, 3, 4, 7, 10, 12, 15, 19, 20, 21, 22, 23, 24, 25, 26]:
        assert _cited(page, seq), seq
    # charts: one SVG each in action path, profile, roofline, sweep
    for sid in ("action-path", "profile", "roofline", "sweep"):
        sec = _section(page, sid)
        assert sec.count("<svg") == 1, sid
        assert "<path" in sec or "<rect" in sec
        assert 'class="absent"' not in sec, sid
    sweep = _section(page, "sweep")
    assert "input len 16" in sweep and "input len 32" in sweep and "stock = 1.0" in sweep
    assert sweep.count("<circle") >= 4
    assert "failed (ledger #23)</title>" in sweep  # a failed point: a cross on the axis, and a table row
    roof = _section(page, "roofline")
    assert "memory bandwidth" in roof and "matmul" in roof and ">stock<" in roof and ">final<" in roof
    assert ">after trial 1<" in roof and _cited(roof, 12)  # each kept stack has its row
    assert "GEMM" in _section(page, "profile") and "idle / launch gaps (host)" in _section(page, "profile")
    # text is escaped
    assert "&lt;b&gt;inconclusive&lt;/b&gt; &amp; reverted" in page and "<b>inconclusive" not in page
    assert "Test CPU &lt;x&gt;" in page


def test_llm_section_counts_calls_cost_per_gain_and_refusals_by_rule():
    b = full_breakdown()
    b["llm"] = {"calls": 5, "tokens": 1234, "latency_s": 2.5, "cost_usd": 0.0123,
                "by_role": {"orchestrator": {"calls": 4, "input_tokens": 1000, "output_tokens": 100, "errors": 1},
                            "kernel_author": {"calls": 1, "input_tokens": 100, "output_tokens": 34, "errors": 0}},
                "kept_gain_pct": 31.9, "cost_usd_per_gain_pct": 0.0123 / 31.9, "tokens_per_gain_pct": 1234 / 31.9,
                "refusals_by_rule": {"kernel_incorrect": {"count": 1, "agents": ["llm-kernel-author"],
                                                          "ledger_seqs": [41]},
                                     "unknown_knob": {"count": 2, "agents": ["llm-orchestrator"],
                                                      "ledger_seqs": [31, 33]}},
                "errors": [], "ledger_seqs": [30, 40]}
    page = render_html(b)
    assert_self_contained(page)
    sec = _section(page, "llm")
    assert "$0.0123" in sec and "1,234" in sec and "39 tokens per +1%" in sec and "+31.9% over stock" in sec
    assert "kernel_author" in sec and "<code>kernel_incorrect</code>" in sec and "llm-kernel-author" in sec
    for seq in (30, 40, 41, 31, 33):
        assert _cited(sec, seq), seq
    b["llm"].update(cost_usd=None, cost_usd_per_gain_pct=None, kept_gain_pct=None, refusals_by_rule={})
    sec = _section(render_html(b), "llm")
    assert "not priced" in sec and "n/a (the final stack is not faster" in sec and "No output of an LLM" in sec


def test_absent_sections_say_why():
    b = full_breakdown()
    for k in ("profile", "sweep", "warm_replay"):
        b.pop(k)
    b["roofline"] = {"ceilings": None, "stock": None, "final": None, "amdahl": None, "ledger_seqs": [22]}  # synthetic
    b["action_path"], b["final"] = [], {"ratio": 1.0, "note": "nothing was kept: the final stack is stock"}
    page = render_html(b)
    parse(page)
    assert_self_contained(page)
    assert "<svg" not in page
    assert "no profile entry" in _section(page, "profile")
    assert "synthetic" in _section(page, "roofline") and _cited(page, 22)
    assert "nothing was kept" in _section(page, "sweep")
    assert "Nothing was kept" in _section(page, "action-path")
    assert "x1.000" in _section(page, "summary")
    # a kept stack but no sweep: the skip reason from the phase log
    b2 = full_breakdown()
    b2["sweep"] = []
    b2["phases"] += [{"from": "KERNEL", "to": "SWEEP", "why": "kernel skipped", "ledger_seq": 30},
                     {"from": None, "to": None, "why": "sweep disabled", "ledger_seq": 31}]
    sec = _section(render_html(b2), "sweep")
    assert "sweep disabled" in sec and "#31" in sec
    # a profiler failure is shown as such
    b3 = full_breakdown()
    b3["profile"] = {"categories": None, "top_ops": [], "error": "RuntimeError: <boom>", "ledger_seq": 3}
    sec = _section(render_html(b3), "profile")
    assert "profiler failed" in sec and "&lt;boom&gt;" in sec and "<svg" not in sec


def test_sparse_and_odd_breakdowns_render():
    # an old-schema / mid-session breakdown: most keys missing
    parse(render_html({"schema_version": 1, "final": {"ratio": 1.0}}))
    b = full_breakdown()
    b["roofline"]["final"] = None  # kept, but no final roofline
    b["sweep"] = [dict(p, cycle=2, ratio=p["ratio"] and p["ratio"] + 0.1, ledger_seq=p["ledger_seq"] + 40)
                  for p in b["sweep"]] + b["sweep"]  # two cycles: the chart shows the last
    page = render_html(b)
    parse(page)
    assert "No final-stack point" in _section(page, "roofline")
    assert "Cycle 2." in _section(page, "sweep")


def _two_knob_adapter():
    from inferloom.workloads.base import Knob
    from inferloom.workloads.synthetic import SyntheticAdapter

    knobs = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("useless", "bool", False, "synthetic 0%")]
    return SyntheticAdapter(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={},
                            knobs=knobs, noise_sd=0.05)


def test_cli_report_html_on_a_synthetic_session(tmp_path, capsys):
    from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
    from inferloom.spec import load_spec

    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                            "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                            "quality.prompt_len": 8, "quality.continuation_len": 8})
    d = tmp_path / "s"
    start(d, spec, budget_minutes=10, max_trials=2, adapter=_two_knob_adapter(), kb_url=None, progress=lambda m: None,
          agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()})
    md = (d / "report.md").read_text()

    assert main(["report", str(d), "--html"]) == 0
    assert "report.html" in capsys.readouterr().out
    page = (d / "report.html").read_text()
    assert (d / "report.md").read_text() == md  # the markdown report is unchanged
    parse(page)
    assert_self_contained(page)
    assert "llama-tiny" in page  # the header names the workload (manifest)
    assert "no profile entry" in _section(page, "profile")  # synthetic: no profiler, and says so
    assert 'class="absent"' in _section(page, "roofline")
    b = json.loads((d / "session_breakdown.json").read_text())
    assert b["final"].get("ledger_seq") and b["sweep"]  # the +20% knob was kept: headline, path and sweep are drawn
    assert f"x{b['final']['ratio']:.3f}" in page and _cited(page, b["final"]["ledger_seq"])
    assert _section(page, "action-path").count("<svg") == 1
    assert _section(page, "sweep").count("<svg") == 1

    out = tmp_path / "elsewhere" / "page.html"
    assert main(["report", str(d), "--html", "--out", str(out)]) == 2  # its directory must exist
    assert not out.parent.exists()
    out.parent.mkdir()
    assert main(["report", str(d), "--html", "--out", str(out)]) == 0
    assert out.read_text() == page
    assert main(["report", str(d), "--html", "--out", str(out)]) == 2  # never over an existing file...
    assert main(["report", str(d), "--html", "--out", str(out), "--force"]) == 0  # ...unless asked
    assert main(["report", str(d), "--html", "--out", str(d / "report.html")]) == 0  # its own page, in place
    assert main(["report", str(d), "--out", str(out)]) == 2  # --out without --html is a usage error
