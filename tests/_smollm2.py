"""The real trained model the real-text tests run on: SmolLM2-135M-Instruct, fetched into the cache by
``make real-models`` (``make test`` fetches it first). A test skips, saying why, only when it is not
fetched; and the spec helpers shared by the transformers and vLLM tests (real text prompts from
examples/real-model-cpu/texts.jsonl, the shipped task set ``smollm2-135m-instruct``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m-instruct"
TEXTS = ROOT / "examples" / "real-model-cpu" / "texts.jsonl"


def require_smollm2() -> Path:
    from inferloom.models.real import is_fetched, real_model_dir

    if not is_fetched(NAME):
        pytest.skip(f"{NAME} is not fetched: run `make real-models` (`inferloom models fetch {NAME}`)")
    return real_model_dir(NAME)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys -> a nested spec mapping."""
    spec: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return spec


def bench(tmp_path: Path, flat: dict[str, Any], *args: str, name: str = "res", timeout: int = 900) -> dict[str, Any]:
    """`inferloom bench SPEC ARGS --out` on the nested spec of ``flat``; its result JSON."""
    spec_file = tmp_path / f"{name}.yaml"
    spec_file.write_text(yaml.safe_dump(nested(flat)))
    out = tmp_path / f"{name}.json"
    res = subprocess.run([sys.executable, "-m", "inferloom.cli", "bench", str(spec_file), *args, "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


def task_values_consistent(s: dict[str, Any], max_drop: float) -> None:
    """A quality set's task-gate values agree with each other and with its verdict."""
    v = s["values"]
    n, b, c = v["task_n"], v["task_lost"], v["task_gained"]
    assert n > 0 and 0 <= b <= n and 0 <= c <= n
    assert v["task_accuracy_stock"] - v["task_accuracy"] == pytest.approx((b - c) / n)
    assert v["task_drop"] == pytest.approx((b - c) / n)
    assert (v["task_drop_upper"] == 0.0) == (b + c == 0)
    if b + c == 0:
        assert v["task_mcnemar_p"] == 1.0
    task_ok = v["task_drop_upper"] <= max_drop
    assert ("task accuracy" in s["details"]["task"]) and (("within" in s["details"]["task"]) == task_ok)
    if not task_ok:
        assert not s["passed"]
