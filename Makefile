# make grade   -- set up .venv (if needed) and grade the example class in examples/
# make test    -- set up .venv (if needed) and run the test suite
# make bench   -- grading cost against a plain `import torch`
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: venv grade test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-build-isolation -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

grade: $(STAMP)
	@for f in examples/*; do $(BIN)/python -m grader grade "$$f" --results build/examples/$$(basename "$$f").json >/dev/null; done
	@$(BIN)/python -c "import json,glob; [print(f\"{p.split('/')[-1][:-5]:<28} {json.load(open(p))['score']:>5}\") for p in sorted(glob.glob('build/examples/*.json'))]"

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf build
