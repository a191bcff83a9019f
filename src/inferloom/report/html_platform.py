"""The HTML report's ``Platform`` and ``Energy per output token`` sections (:mod:`inferloom.report.html`),
from the breakdown's ``platform`` block (:func:`inferloom.report.platform.platform_breakdown`), like
``report.md``'s platform section: the PRELUDE and CLOSE platform audits (a stable setting that changed
between them is flagged), and the energy per output token beside throughput, for the CLOSE comparison
(stock and the final stack) and for every measurement whose timed runs carry readings. Every number cites
its ledger entry. A ledger without audits (an older session) or without readings says why."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import changes_text, esc, number
from inferloom.report.html_blocks import _absent, _cite, _table

__all__ = ["platform_section", "energy_section"]

# A ledger without platform audits (a session from before inferloom audited the platform) gets neither section:
# its report renders byte for byte as it did (tests/test_spec/paths.py), as report.md leaves out "## Platform".


def _val(v: Any) -> str:
    if v is None:
        return "not readable"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {x}" for k, x in v.items()) or "none"
    return str(v)


def platform_section(b: dict[str, Any]) -> str | None:
    p = b.get("platform")
    if not p:
        return None
    seqs = p.get("audit_seqs") or {}
    cpu = p.get("cpu") or {}
    audits = ", ".join(f"{esc(k)} {_cite(v)}" for k, v in seqs.items())
    out = [f'<p>Read-only audits taken at {audits}; the values below are PRELUDE\'s.</p>',
           '<dl class="kv">']
    for label, v in (("CPU governor", _val(cpu.get("governors"))), ("boost", _val(cpu.get("boost"))),
                     ("SMT", _val(cpu.get("smt_control"))), ("NUMA nodes", _val(cpu.get("numa_nodes"))),
                     ("memory", "not readable" if cpu.get("mem_total_kb") is None
                      else f"{number(cpu['mem_total_kb'], ',.0f')} kB")):
        out.append(f"<dt>{esc(label)}</dt><dd>{esc(v)} {_cite(seqs.get('PRELUDE'))}</dd>")
    out.append("</dl>")
    gpus = p.get("gpus") or []
    if gpus:
        out.append(_table(
            [("GPU", False), ("clocks max (MHz)", False), ("application clocks (MHz)", False), ("ECC", False),
             ("persistence", False), ("power limit (W)", True), ("temperature (C)", True), ("ledger", False)],
            [[esc(f"{g.get('index')} {g.get('name') or ''}"), esc(_val(g.get("clocks_max_mhz"))),
              esc(_val(g.get("clocks_application_mhz"))), esc(_val(g.get("ecc_mode"))),
              esc(_val(g.get("persistence_mode"))), number(g.get("power_limit_w"), ",.0f"),
              number(g.get("temperature_c"), ",.0f"), _cite(seqs.get("PRELUDE"))] for g in gpus]))
    if not p.get("gpu_available"):
        out.append(f'<p class="note">GPU audit skipped: {esc(p.get("energy_skipped"))} {_cite(seqs.get("PRELUDE"))}.</p>')
    changes = p.get("changes") or []
    if changes:
        out.append('<h3><span class="tag bad">changed</span> Settings that changed between PRELUDE and CLOSE</h3>')
        out.append(_table([("setting", False), ("at PRELUDE", False), ("at CLOSE", False), ("ledger", False)],
                          [[f"<code>{esc(c.get('what'))}</code>", esc(_val(c.get("before"))), esc(_val(c.get("after"))),
                            _cite([seqs.get("PRELUDE"), seqs.get("CLOSE")])] for c in changes],
                          ["changed"] * len(changes)))
        out.append('<p class="note">The measurements straddle this change: treat the comparison with care.</p>')
    elif "CLOSE" in seqs:
        out.append(f'<p><span class="tag good">unchanged</span> No platform setting changed between PRELUDE and '
                   f'CLOSE {_cite([seqs.get("PRELUDE"), seqs["CLOSE"]])}.</p>')
    else:
        out.append('<p class="note">No CLOSE audit yet: the session has not reached CLOSE.</p>')
    return "".join(out)


def _jpt(a: dict[str, Any]) -> str:
    return number(a.get("j_per_output_token"), ".4f") + " J"


def energy_section(b: dict[str, Any]) -> str | None:
    p = b.get("platform")
    if not p:
        return None
    out = []
    e = p.get("energy")
    u, r_ = ("image", "images/s") if p.get("per") == "image" else ("token", "tok/s")  # image workloads count images
    rf = ".3f" if u == "image" else ",.1f"
    if e:
        out.append(_table(
            [("arm", False), (f"J / {'image' if u == 'image' else 'output token'}", True), (f"{'images/s' if u == 'image' else 'output tok/s'}", True), ("mean power (W)", True),
             ("timed runs", True), ("method", False), ("ledger", False)],
            [[esc(arm), _jpt(e[arm]), number(e[arm].get("output_tokens_per_s"), rf),
              number(e[arm].get("mean_power_w"), ",.0f"), f"{e[arm].get('runs', 0):,}", esc(e[arm].get("method")),
              _cite(e.get("ledger_seq"))] for arm in ("stock", "final")]))
    else:
        out.append(_absent(f"GPU energy per {'image' if u == 'image' else 'output token'} not measured: {esc(p.get('energy_skipped'))}."))
    if p.get("cpu_energy_skipped"):
        out.append(_absent(f"CPU energy not measured: {esc(p['cpu_energy_skipped'])}."))
    rows = p.get("energy_by_measurement") or []
    if rows:
        out.append("<h3>Every measurement with energy readings</h3>")
        out.append(_table(
            [("measurement", False), ("energy", False), (f"base J/{u}", True), (f"base {r_}", True),
             (f"candidate J/{u}", True), (f"candidate {r_}", True), (f"candidate / base J/{u}", True),
             ("ledger", False)],
            [[(f"trial {esc(r['trial'])} <code>{esc(changes_text(r.get('changes') or {}))}</code>"
               if r.get("trial") is not None else esc(r.get("action"))), esc(r.get("source")),
              _jpt(r["base"]), number(r["base"].get("output_tokens_per_s"), rf), _jpt(r["candidate"]),
              number(r["candidate"].get("output_tokens_per_s"), rf), number(r.get("energy_ratio"), ".3f"),
              _cite(r.get("ledger_seq"))] for r in rows]))
    elif e is None:
        out.append('<p class="note">No timed run of this session carries an energy reading.</p>')
    return "".join(out)
