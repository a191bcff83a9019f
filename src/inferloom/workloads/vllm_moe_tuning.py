"""inferloom's side of the fused-MoE tuning pass (issue 33): what to tune, running the pass in the server's
own Python, checking what it wrote, and a cache of the result.

* :func:`batch_sizes`: the ``M`` the pass times, from the traffic: every decode batch up to the
  concurrency (powers of two, the concurrency itself), one prompt's prefill (``input_len`` tokens), the
  whole wave's prefill (``concurrency x input_len``) cut into vLLM's chunks (``max_num_batched_tokens``,
  :data:`PREFILL_CHUNK` when unset), and the powers of two between (vLLM takes the entry nearest each
  call's ``M``).
* :func:`tune_request`: the pass's request for a model's MoE layers (None for a dense model).
* :func:`run_pass`: ``<server python> vllm_moe_tune_pass.py --request R --out O`` (the script imports
  nothing of inferloom; ``VLLM_TUNED_CONFIG_FOLDER`` and ``PYTHONPATH`` are removed from its environment
  so its stock config is the installed vLLM's), then :func:`check_result`: the schema, every ``M``'s record,
  the table (``vllm_moe_configs.check_configs``), the file name vLLM's own function gave against
  :func:`~inferloom.workloads.vllm_moe_configs.config_file_name`, that each config written is the trial the
  record says was chosen, and that each tuned one is clearly faster than the stock one by the pass's own
  rule (``vllm_moe_tune_pass.clearly_faster``); ``improved`` lists those ``M`` (empty: nothing to offer).
* :func:`tuned_tables`: the cached result for (request, device, server version) when there is one, else
  the pass (so it runs once per shape, device and vLLM version, not once per session or server);
  :func:`summary`: what a ledger entry keeps of it per ``M``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.errors import InferloomError
from inferloom.models.tokenizer import cache_root
from inferloom.process_group import run_in_group
from inferloom.workloads.vllm_moe_configs import check_configs, config_file_name, moe_shape
from inferloom.workloads.vllm_moe_tune_pass import SCHEMA, clearly_faster
from inferloom.workloads.vllm_plugins import EngineOverlayError

__all__ = ["TUNE_SCRIPT", "PREFILL_CHUNK", "LIMITS", "MoETuningError", "batch_sizes", "tune_request", "run_pass",
           "check_result", "cache_file", "tuned_tables", "summary"]

TUNE_SCRIPT = Path(__file__).with_name("vllm_moe_tune_pass.py")
PREFILL_CHUNK = 8192  # vLLM V1's max_num_batched_tokens for an OpenAI server on a datacenter GPU
MAX_BATCH_SIZES = 16
#: the search's bounds: configs per M, seconds for the whole pass, CUDA-event repeats, calls per repeat
LIMITS: dict[str, Any] = {"max_configs": 24, "max_seconds": 300.0, "repeats": 5, "iters": 20}


class MoETuningError(InferloomError, RuntimeError):
    """The tuning pass failed or wrote something unusable (a failed run: exit 1; the candidate fails, the
    stock configs stay in use)."""

    exit_code = 1


def batch_sizes(concurrency: int, input_len: int, chunk: int | None = None) -> list[int]:
    """See the module docstring (at most :data:`MAX_BATCH_SIZES`, the traffic's own points kept)."""
    c, n, chunk = max(1, int(concurrency)), max(1, int(input_len)), int(chunk or PREFILL_CHUNK)
    wave = min(c * n, chunk)
    points = {c, min(n, chunk), wave}
    pow2 = [1 << i for i in range(wave.bit_length()) if 1 << i <= wave]
    out = sorted(points | set(pow2))
    while len(out) > MAX_BATCH_SIZES:  # thin the powers of two between the traffic's points, largest gaps kept
        extra = [m for m in out if m not in points and m != 1]
        out.remove(extra[len(extra) // 2])
    return out


def tune_request(hf_config: Mapping[str, Any], dtype: str, concurrency: int, input_len: int,
                 chunk: int | None = None, tensor_parallel: int = 1, **limits: Any) -> dict[str, Any] | None:
    """The pass's request (shape, batch sizes, bounds), None for a model without MoE layers."""
    shape = moe_shape(hf_config, tensor_parallel)
    if shape is None:
        return None
    cfg = hf_config.get("text_config") or hf_config
    topk = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or cfg.get("num_selected_experts") or 0)
    if topk < 1:
        raise EngineOverlayError("the model's config names no experts per token (num_experts_per_tok); the "
                                 "fused-MoE tuning pass needs it")
    dt = dtype if dtype in ("bfloat16", "float16") else "bfloat16"
    return {"E": shape[0], "N": shape[1], "K": int(cfg["hidden_size"]), "topk": topk, "dtype": dt,
            "batch_sizes": batch_sizes(concurrency, input_len, chunk), **LIMITS, **limits, "seed": 0}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("VLLM_TUNED_CONFIG_FOLDER", "PYTHONPATH")}


def run_pass(python: str, request: Mapping[str, Any], work_dir: str | Path, progress: Callable[[str], None],
             timeout_s: float | None = None) -> dict[str, Any]:
    """Run the pass (its stderr kept in ``work_dir/moe-tune.log``) and return its checked result."""
    d = Path(work_dir)
    d.mkdir(parents=True, exist_ok=True)
    req, out, log = d / "moe-tune-request.json", d / "moe-tune-result.json", d / "moe-tune.log"
    req.write_text(json.dumps(dict(request), indent=1))
    out.unlink(missing_ok=True)
    limit = timeout_s or float(request["max_seconds"]) * 1.5 + 300.0
    progress(f"fused-MoE tuning pass: E={request['E']} N={request['N']} K={request['K']} top-{request['topk']}, "
             f"M in {request['batch_sizes']}, <= {request['max_configs']} configs per M, <= {request['max_seconds']:.0f} s")
    try:
        rc, _, err = run_in_group([python, str(TUNE_SCRIPT), "--request", str(req), "--out", str(out)],
                                  timeout=limit, env=_env(), text=True)
    except OSError as exc:
        raise MoETuningError(f"fused-MoE tuning pass: {python} could not start ({exc})") from None
    log.write_text(err or "")
    if rc != 0:
        tail = " | ".join((err or "").strip().splitlines()[-3:])[:400]
        raise MoETuningError(f"fused-MoE tuning pass: {'ran past ' + format(limit, '.0f') + ' s' if rc is None else 'exit ' + str(rc)} "
                             f"({tail or 'no output'}; its log: {log})")
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        raise MoETuningError(f"fused-MoE tuning pass: no readable result in {out} ({exc})") from None
    return check_result(result, request)


def check_result(result: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """The pass's result, checked (see the module docstring); MoETuningError naming what is wrong (a record
    of the wrong shape too: a damaged cache or a foreign file is refused, never a traceback)."""
    try:
        return _checked(result, request)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MoETuningError(f"fused-MoE tuning pass result: a record of the wrong shape "
                             f"({type(exc).__name__}: {exc})") from None


def _checked(result: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    def bad(why: str) -> MoETuningError:
        return MoETuningError(f"fused-MoE tuning pass result: {why}")

    if not isinstance(result, Mapping) or result.get("schema") != SCHEMA:
        raise bad(f"schema {result.get('schema') if isinstance(result, Mapping) else None!r}, expected {SCHEMA}")
    for k in ("device_name", "vllm_version", "file_name", "results", "configs", "improved"):
        if k not in result:
            raise bad(f"no {k!r}")
    want = config_file_name(int(request["E"]), int(request["N"]), str(result["device_name"]))
    if result["file_name"] != want:
        raise bad(f"vLLM names the file {result['file_name']!r}, inferloom {want!r}: the installed vLLM's naming "
                  "changed; update vllm_moe_configs.config_file_name")
    res = result["results"]
    if sorted(int(m) for m in res) != sorted(int(m) for m in request["batch_sizes"]):
        raise bad(f"batch sizes {sorted(res, key=int)}, requested {request['batch_sizes']}")
    try:
        table = check_configs(result["configs"])
    except EngineOverlayError as exc:
        raise bad(str(exc)) from None
    for m, r in res.items():
        trials = r.get("trials") or []
        if not trials or len(trials) != r.get("tried") or len(trials) > int(request["max_configs"]):
            raise bad(f"M={m}: {len(trials)} trials recorded, {r.get('tried')} counted, at most "
                      f"{request['max_configs']} allowed")
        if r.get("best") is None:
            if m in table:
                raise bad(f"M={m}: a config written with no timed trial")
            continue
        timed = [t for t in trials if t.get("config") == r["best"] and "us" in t and "refused" not in t]
        if not timed or table.get(str(int(m))) != r["best"] or timed[0]["us"] != r["best_us"]:
            raise bad(f"M={m}: the written config is not the recorded best trial")
        if r.get("stock_us") is not None and r["best_us"] > r["stock_us"]:
            raise bad(f"M={m}: best {r['best_us']} us is slower than stock {r['stock_us']} us")
        if r.get("chosen") == "tuned" and r.get("stock_us") is not None and not clearly_faster(timed[0], trials[0]):
            raise bad(f"M={m}: the tuned config ({r['best_us']} us) is not clearly faster than stock "
                      f"({r['stock_us']} us) by the pass's rule")
        if r.get("chosen") not in ("tuned", "stock") or (r["chosen"] == "stock" and r["best"] != r.get("stock")):
            raise bad(f"M={m}: chosen {r.get('chosen')!r} does not match the config written")
    improved = sorted(int(m) for m, r in res.items() if r.get("chosen") == "tuned")
    if sorted(int(m) for m in result["improved"]) != improved:
        raise bad(f"improved {result['improved']}, but the records choose a tuned config at {improved}")
    return {**result, "configs": table}


def cache_file(request: Mapping[str, Any], device_name: str, server_version: str) -> Path:
    """Where the result for this request on this device and server version is kept."""
    key = json.dumps({"request": dict(request), "device": device_name, "server": server_version}, sort_keys=True)
    return cache_root() / "moe-tuning" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def tuned_tables(python: str, request: Mapping[str, Any], device_name: str, server_version: str,
                 work_dir: str | Path, progress: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    """``(result, source)``: the cached result (``cache``) or a fresh pass's (``tuned``), checked either way."""
    f = cache_file(request, device_name, server_version)
    if f.is_file():
        try:
            res = check_result(json.loads(f.read_text()), request)
            progress(f"fused-MoE configs: the cached tuning {f.name} (same shape, device and vLLM)")
            return res, "cache"
        except (OSError, ValueError, MoETuningError) as exc:
            progress(f"fused-MoE configs: cached tuning {f} unusable ({exc}); tuning again")
    res = run_pass(python, request, work_dir, progress)
    f.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=f.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(res, tmp)
    os.replace(tmp.name, f)
    return res, "tuned"


def summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """Per ``M``: stock and best time, configs tried / failed / refused, why the search stopped."""
    per = {m: {k: r.get(k) for k in ("stock_source", "stock_us", "best_us", "chosen", "tried", "failed", "refused",
                                     "stopped")}
           for m, r in result["results"].items()}
    return {"file_name": result["file_name"], "device_name": result["device_name"], "improved": result["improved"],
            "vllm_version": result["vllm_version"], "elapsed_s": result.get("elapsed_s"), "per_batch": per}
