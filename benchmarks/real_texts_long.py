"""Build examples/real-model-cpu/texts-long.jsonl: 1,440 real texts of 271-272 SmolLM2 tokens each,
for c64 traffic at input_len 256 (examples/smollm2-h200-vllm.yaml; issue 31).

Sources, all real text shipped with Python or with inferloom: the prose paragraphs of Python's reference
documentation (``pydoc_data/topics.py``), inferloom's own ``src/inferloom/data/corpus.txt``, and the
standard library's larger modules (code), each cut at line/paragraph boundaries into chunks of at least
272 tokens and then trimmed to 272 tokens (Python's texts: PSF license). Deterministic (seed 31) for one
Python version (built with CPython 3.11.7) and the tokenizer of the converted SmolLM2 directory:

    .venv/bin/inferloom models fetch smollm2-135m-instruct
    .venv/bin/python benchmarks/real_texts_long.py examples/real-model-cpu/texts-long.jsonl
"""

import json
import random
import re
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

from inferloom.models.real import REAL_MODELS, real_model_dir

TARGET, N_PROSE, N_TOTAL = 272, 720, 1440
tok = Tokenizer.from_file(str(real_model_dir("smollm2-135m-instruct") / "tokenizer.json"))
assert REAL_MODELS["smollm2-135m-instruct"]
lib = Path(sysconfig.get_paths()["stdlib"])
ns: dict = {}
exec(compile((lib / "pydoc_data/topics.py").read_text(), "topics", "exec"), ns)


def ntok(s: str) -> int:
    return len(tok.encode(s).ids)


def chunks(lines, target):
    cur: list[str] = []
    for ln in lines:
        cur.append(ln)
        if ntok("\n".join(cur)) >= target:
            yield "\n".join(cur)
            cur = []


def cut(t: str) -> str:
    enc = tok.encode(t)
    return t[:enc.offsets[TARGET - 1][1]] if len(enc.ids) > TARGET else t


prose = []
for key in sorted(ns["topics"]):
    paras = [p.strip() for p in re.split(r"\n\s*\n", ns["topics"][key]) if p.strip()]
    # prose paragraphs only (no indented code samples, no grammar rules)
    paras = [" ".join(p.split()) for p in paras if not p.startswith((" ", "\t", ">>>")) and len(p) > 60 and "::=" not in p]
    prose += [c.replace("\n", "\n\n") for c in chunks(paras, TARGET)]
code = []
for m in sorted(p for p in lib.glob("*.py") if p.stat().st_size > 20000):
    lines = [ln.rstrip() for ln in m.read_text(errors="replace").splitlines()][20:]  # past the header
    code += [c for c in chunks(lines, TARGET) if c.strip()]
rng = random.Random(31)
prose = [p for p in prose if ntok(p) >= 260]
code = [c for c in code if ntok(c) >= 260]
rng.shuffle(code)
corpus = (Path(__file__).resolve().parents[1] / "src/inferloom/data/corpus.txt").read_text().split("\n\n")
prose += [c.replace("\n", "\n\n") for c in chunks([p.strip() for p in corpus if p.strip()], TARGET)]
prose = [cut(p) for p in prose]
code = [cut(c) for c in code]
sel = prose[:N_PROSE] + code[:max(N_TOTAL - N_PROSE, N_TOTAL - min(len(prose), N_PROSE))]
rng.shuffle(sel)
with open(sys.argv[1], "w") as fh:
    for t in sel:
        fh.write(json.dumps({"text": t}) + "\n")
print(f"{len(sel)} texts ({min(len(prose), N_PROSE)} prose), {min(map(ntok, sel))}-{max(map(ntok, sel))} tokens",
      file=sys.stderr)
