"""Before anything runs: a configuration that can't work is refused with one
line (a :class:`~inferloom.spec.SpecError`, exit 2) naming the spec field and
the resolved path, before a session directory is created or a server is
started.

What is checked (:func:`check_runnable`), per framework (the checks its
descriptor's ``preflight`` names, :mod:`inferloom.frameworks`):

* ``server_env`` (vllm): ``serving.python`` exists and is executable (a bare name: found on
  ``PATH``); ``serving.module`` is a module name and, unless ``imports=False``,
  ``python -c "import MODULE"`` succeeds in the server's environment
  (``serving.env`` included) within :data:`IMPORT_TIMEOUT_S` (a slower import
  is not refused: the server's own start decides).
* ``source_repo`` (custom): ``custom.repo`` is a git checkout with a commit; the entrypoint's
  program exists (absolute, on ``PATH``, or a file committed in the checkout:
  every run happens in a copy of the checkout's HEAD); each of
  ``custom.entrypoint_files`` is committed in the checkout;
  ``custom.patches.dir`` is a directory; the Specialist's program exists.
* ``model_dir`` / ``pipeline_dir`` (every other framework): a model (or
  diffusers pipeline) directory exists; every framework: the prompts files exist (the spec's
  own validation checks them when it is read; a manifest read back by
  ``resume`` is checked again here, the files may have gone since), and each
  holds the lines its flag says (``traffic.chat_template`` /
  ``quality.chat_template``: all ``{"messages": [...]}`` chats, else all
  ``{"text": ...}`` texts; parsed, not tokenized); chats need a framework
  whose descriptor names the ``chat_prompts`` check (transformers, vllm) and
  a model whose tokenizer has a chat template (its files, or a GGUF's
  ``tokenizer.chat_template``: nothing is loaded).

The enablement ladder is for a server or workload that starts and then
fails, never for a file that isn't there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

from inferloom.frameworks import framework
from inferloom.models.diffusion_presets import DIFFUSION_PRESETS, is_pipeline_dir
from inferloom.models.gguf import inspect_gguf
from inferloom.models.presets import PRESETS
from inferloom.models.tokenizer import has_chat_template
from inferloom.process_group import run_in_group
from inferloom.spec import SpecError, WorkloadSpec
from inferloom.workloads.prompts import load_prompt_file

__all__ = ["check_runnable", "IMPORT_TIMEOUT_S"]

#: seconds the server module's import may take before the check gives up (not a refusal)
IMPORT_TIMEOUT_S = 120.0
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _program(field: str, value: str, where: str = "") -> str:
    """The executable ``value`` names (a path, or a command on PATH), or a SpecError."""
    if "/" in value:
        if not os.path.isfile(value):
            raise SpecError(f"{field}: {value} does not exist{where}; expected an executable file "
                                     "(a relative path in a spec file is relative to the spec file's folder)")
        if not os.access(value, os.X_OK):
            raise SpecError(f"{field}: {value} is not executable; expected an executable file")
        return value
    found = shutil.which(value)
    if found is None:
        raise SpecError(f"{field}: '{value}' is not a command on PATH; give the path of the executable")
    return found


def _git_ok(repo: str, *args: str) -> bool:
    res = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                         env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"})
    return res.returncode == 0


def _committed(repo: str, rel: str) -> bool:
    """``rel`` (relative to the checkout) is in the checkout's HEAD."""
    return not rel.startswith("..") and _git_ok(repo, "cat-file", "-e", f"HEAD:{rel}")


def _check_vllm(spec: WorkloadSpec, imports: bool, timeout_s: float) -> None:
    s = spec.serving
    python = _program("serving.python", s.python, " (the server environment's Python; `make vllm-env` builds "
                      ".venv-vllm)")
    if not _MODULE.match(s.module):
        raise SpecError(f"serving.module: {s.module!r} is not a module name; expected e.g. "
                                 "vllm.entrypoints.openai.api_server")
    if not imports:
        return
    env: Mapping[str, str] = {**os.environ, **s.env}
    try:
        rc, _out, err = run_in_group([python, "-c", f"import {s.module}"], timeout=timeout_s, env=env, text=True,
                                     cwd="/")
    except OSError as exc:
        raise SpecError(f"serving.python: {python} can't be run ({exc.strerror or exc})") from None
    if rc not in (0, None):  # None: slower than the timeout; the server's own start decides
        last = ((err or "").strip().splitlines() or [f"exit code {rc}"])[-1][:300]
        raise SpecError(f"serving.module: `import {s.module}` fails in {python}'s environment ({last}); "
                                 f"install {spec.framework} there or point serving.python at a Python that has it")


def _check_custom(spec: WorkloadSpec) -> None:
    c = spec.custom
    repo = c.repo
    if not (Path(repo) / ".git").exists():
        raise SpecError(f"custom.repo: {repo} is not a git checkout (no .git); expected a git working tree")
    if not _git_ok(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"):
        raise SpecError(f"custom.repo: {repo} has no commit; inferloom runs copies of its HEAD, so commit "
                                 "the workload first")
    prog = c.entrypoint[0]
    if "/" in prog and not os.path.isabs(prog):
        if not _committed(repo, os.path.normpath(prog)):
            raise SpecError(f"custom.entrypoint: {prog} is not a file committed in {repo}; a relative "
                                     "program runs from inferloom's copy of the checkout's HEAD (use an absolute path "
                                     "or a command on PATH for an interpreter outside it)")
    else:
        _program("custom.entrypoint", prog)
    for f in c.entrypoint_files:
        if not _committed(repo, os.path.normpath(f)):
            raise SpecError(f"custom.entrypoint_files: {f} is not a file committed in {repo} (at HEAD); "
                                     "list files of the checkout, relative to it")
    p = c.patches
    if p.dir is not None and not os.path.isdir(p.dir):
        raise SpecError(f"custom.patches.dir: {p.dir} is not a directory")
    if p.command:
        _program("custom.patches.command", p.command[0])


def _check_files(spec: WorkloadSpec) -> None:
    checks = framework(spec.framework).preflight
    if "pipeline_dir" in checks:
        if spec.model not in DIFFUSION_PRESETS and not is_pipeline_dir(spec.model):
            raise SpecError(f"model: {spec.model} is not a diffusers pipeline directory (no model_index.json)")
    elif "model_dir" in checks and spec.model not in PRESETS and not os.path.isfile(
            os.path.join(spec.model, "config.json")) and not (  # a GGUF not yet converted (validate): a file
            spec.model.endswith(".gguf") and os.path.isfile(spec.model)):
        raise SpecError(f"model: {spec.model} is not a Hugging Face model directory (no config.json)")
    for field, value in (("traffic.prompts", spec.traffic.prompts), ("quality.prompts_file", spec.quality.prompts_file)):
        if value not in (None, "random") and not os.path.isfile(value):
            raise SpecError(f"{field}: {value} does not exist; expected a .jsonl file")
    _check_chats(spec)


def _check_chats(spec: WorkloadSpec) -> None:
    """The prompts files parse as their flags say; chats have a model with a chat template (module docstring)."""
    files = (("traffic", spec.traffic.prompts, spec.traffic.chat_template),
             ("quality", spec.quality.prompts_file, spec.quality.chat_template))
    for section, path, chat in files:
        if path not in (None, "random"):
            load_prompt_file(path, chat, f"{section}.chat_template")
    flags = [f"{section}.chat_template" for section, _, chat in files if chat]
    if not flags:
        return
    if "chat_prompts" not in framework(spec.framework).preflight:
        raise SpecError(f"{flags[0]}: chats are rendered with the model's chat template by the transformers and "
                        f"vllm adapters only, got framework {spec.framework}")
    if spec.model in PRESETS:
        has = False
    elif spec.model.endswith(".gguf") and os.path.isfile(spec.model):  # validate: not converted yet
        has = bool(inspect_gguf(spec.model).get("chat_template"))
    else:
        has = has_chat_template(spec.model)
    if not has:
        raise SpecError(f"{flags[0]}: model {spec.model} has no chat template (no chat_template in "
                        "tokenizer_config.json, no chat_template.jinja); use {\"text\": ...} lines with "
                        f"{flags[0]}: false, or a model with a chat template")


def check_runnable(spec: WorkloadSpec, *, imports: bool = True, timeout_s: float = IMPORT_TIMEOUT_S) -> None:
    """Refuse (:class:`SpecError`, exit 2) a ``spec`` that can't work
    (see the module docstring); ``imports=False`` skips the server module's
    import (``validate`` and ``knobs``: existence checks only, fast). A spec
    that passed the import check is not imported again in this process (the
    command checks before its first line, the session runner again)."""
    _check_files(spec)
    checks = framework(spec.framework).preflight
    if "server_env" in checks:
        key = json.dumps(spec.serving.model_dump(mode="json"), sort_keys=True)
        _check_vllm(spec, imports and key not in _IMPORTED, timeout_s)
        if imports:
            _IMPORTED.add(key)
    elif "source_repo" in checks and spec.custom is not None:
        _check_custom(spec)


_IMPORTED: set[str] = set()  # serving sections whose module imported (or timed out) in this process
