"""Texts as a vLLM server's prompts: token ids from the model directory's own
tokenizer, computed in inferloom's process (inferloom never imports vLLM).

* The tokenizer (:func:`server_tokenizer`): the files of the directory the
  server loads, through ``AutoTokenizer`` with local files only
  (:func:`inferloom.models.tokenizer.load_tokenizer`); a preset's directory
  holds the locally built BPE. A directory with none of ``tokenizer.json``,
  ``tokenizer.model``, ``vocab.json`` is a :class:`PromptError` (exit 2) that
  names the file missing: the engine's fallback (a BPE built here) would not be
  the tokenizer the server encodes with.
* ``traffic.prompts`` (:class:`ServerTexts`): the JSONL pool is read and
  tokenized once; run ``seed`` takes its window of the pool (the rule every
  engine uses: :func:`inferloom.workloads.prompts.pool_window`), each text's
  ids truncated to ``input_len``, and the load generator sends them as
  token-id prompts, exactly as random ids are sent. Input lengths vary; every
  request's is recorded (the serving result's ``input_lens``).
* chats (``traffic.chat_template: true``, :func:`inferloom.workloads.prompts.render_chats`, the
  transformers engine's rendering too): each chat rendered by the model's chat template in inferloom's
  process and sent as token ids, whole (a chat longer than ``input_len`` is refused before a server
  starts; ``serving.prefix: shared`` would cut it: refused too). The ids are the ones the server's
  ``/v1/chat/completions`` builds from the same messages (tests/test_chat_prompts.py measures it).
* ``quality.prompts_file``: the quality sets tokenize with the same tokenizer
  (``VLLMAdapter.tokenizer``, read by :func:`inferloom.measure.quality.quality_prompt_sets`).
* :func:`check_server_texts`: every text source of a spec read and tokenized
  before a server starts (a missing tokenizer, a file that tokenizes to
  nothing, a quality file of one text: one line, exit 2). The adapter runs it
  at its first ``prepare``; a preflight may run it before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from inferloom.models.presets import PRESETS
from inferloom.models.tokenizer import has_tokenizer_files, load_tokenizer
from inferloom.workloads.prompts import PromptError, load_prompt_file, pool_state, tokenize_prompts, window_prompts

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["ServerTexts", "server_tokenizer", "check_server_texts", "TOKENIZER_FILES"]

#: the files one of which makes a directory's own tokenizer (the first is the one asked for)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _uses(spec: WorkloadSpec) -> list[str]:
    """The spec fields whose texts need the model's tokenizer."""
    sources = (("traffic.prompts", spec.traffic.prompts), ("quality.prompts_file", spec.quality.prompts_file))
    return [f for f, v in sources if v not in (None, "random")]


def server_tokenizer(model: str, why: str = "text prompts") -> Any:
    """The tokenizer of the server's model: a preset's built BPE, else the directory's own files;
    :class:`PromptError` naming the missing file when the directory has none."""
    if model in PRESETS:
        return load_tokenizer(model)
    d = Path(model)
    if not has_tokenizer_files(d):
        raise PromptError(f"model {model}: no {TOKENIZER_FILES[0]} (nor {', '.join(TOKENIZER_FILES[1:])}) in the "
                          f"directory; {why} are encoded with the model's own tokenizer: save it there "
                          "(tokenizer.save_pretrained)")
    try:
        return load_tokenizer(str(d))
    except Exception as exc:  # noqa: BLE001 - a damaged tokenizer file: one line
        raise PromptError(f"model {model}: its tokenizer can't be loaded ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


def _quality_texts(path: str, tokenizer: Any, chat: bool = False) -> None:
    texts = load_prompt_file(path, chat, "quality.chat_template")
    if len(texts) < 2:
        raise PromptError(f"quality.prompts_file '{path}': needs at least 2 texts (half eval, half held out)")
    tokenize_prompts(texts, tokenizer, f"quality.prompts_file '{path}'", chat, chat_flag="quality.chat_template")


class ServerTexts:
    """The text prompts of one vLLM adapter (``model_dir()``: the directory its servers load)."""

    def __init__(self, spec: WorkloadSpec, model_dir: Callable[[], str]) -> None:
        self.spec = spec
        self._model_dir = model_dir
        self._tokenizer: Any = None
        self._pool: list[list[int]] | None = None
        self._checked = False

    @property
    def source(self) -> str:
        """``random`` or the traffic prompts file."""
        return str(self.spec.traffic.prompts)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = server_tokenizer(self._model_dir(), " and ".join(_uses(self.spec)) or "text prompts")
        return self._tokenizer

    def pool(self) -> list[list[int]]:
        """The traffic pool's token ids (read and tokenized once)."""
        if self._pool is None:
            path, t = self.source, self.spec.traffic
            self._pool = tokenize_prompts(load_prompt_file(path, t.chat_template, "traffic.chat_template"),
                                          self.tokenizer, f"traffic.prompts '{path}'", t.chat_template,
                                          max_len=t.input_len)
        return self._pool

    def draw(self, seed: int, n: int, length: int) -> list[list[int]]:
        """Run ``seed``'s ``n`` prompts (the pool's window, each at most ``length`` tokens; a chat cut to a
        shorter ``length``, a quality probe's, keeps its last tokens)."""
        return window_prompts(self.pool(), length, seed, n, keep="tail" if self.spec.traffic.chat_template else "head")

    def state(self, seed: int, n: int) -> dict[str, Any]:
        """What a run's ``cache_state`` records of its draw: the source and where it stands in the pool."""
        if self.source == "random":
            return {"prompts": "random"}
        return {"prompts": self.source, **pool_state(len(self.pool()), seed, n)}

    def validate(self) -> None:
        """Every text source read and tokenized, once (a bad one: :class:`PromptError`)."""
        if self._checked:
            return
        if self.spec.traffic.chat_template and self.spec.serving.prefix == "shared":
            raise PromptError("traffic.chat_template: a chat is sent whole; serving.prefix: shared would put "
                              "random ids before it and cut it: use serving.prefix: fresh with chats")
        if self.source != "random":
            self.pool()
        if self.spec.quality.prompts_file:
            _quality_texts(self.spec.quality.prompts_file, self.tokenizer, self.spec.quality.chat_template)
        self._checked = True


def check_server_texts(spec: WorkloadSpec, model_dir: str | None = None) -> None:
    """Refuse (:class:`PromptError`, exit 2) a spec whose texts can't be used by a server: the model
    (``model_dir``, default ``spec.model``) has no tokenizer, a file tokenizes to nothing, a quality file
    has fewer than 2 texts. Nothing is started or written; a spec without texts costs nothing."""
    if not _uses(spec):
        return
    ServerTexts(spec, lambda: model_dir or spec.model).validate()
