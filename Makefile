# Two set-up commands (README): `make demo` and `make test`. Each creates the
# virtualenv .venv on first use and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch lies on these machines' disk: install it first so
	# that pyproject's torch range is already met and nothing is downloaded.
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.4"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

DEMO_ARGS ?= --budget-minutes 8 --max-trials 4

demo: $(STAMP)
	$(VENV)/bin/inferloom optimize examples/llama-tiny.yaml $(DEMO_ARGS) --out runs/demo-session-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(PY) -m pytest -q -ra

clean:
	rm -rf $(VENV) runs .pytest_cache
