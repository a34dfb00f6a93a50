# make grade   -- set up .venv (if needed) and grade the example class in examples/
# make test    -- set up .venv (if needed) and run the test suite
# make bench   -- batch grading against the seed-style harness, `grade` against a plain `import torch`,
#                and the switch's data plane against gloo
# make release -- regenerate the student versions in assignments/ from solutions/
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
GRADE_LANG ?= en
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: venv grade test bench release clean

venv: $(STAMP)

# torch comes from the local wheel through pip (pip's configuration on these machines points at it; uv would
# fetch a CUDA build). Everything else is installed by uv, which fetches and unpacks in parallel and
# byte-compiles what it installed; pip does it all on one core. While uv works, compileall byte-compiles
# what pip installed (torch and its dependencies) on both cores. A fresh venv: about 60 s with pip alone,
# about 35 s this way. Where uv cannot be had, pip installs the rest. A file that does not compile (some
# packages ship Python 2 examples) is skipped, as pip skips it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q uv || echo "no uv: pip installs the rest (slower)"
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	$(BIN)/python -m compileall -qq -j 2 "$$site" & compiling=$$!; \
	{ $(BIN)/uv pip install -q --python $(BIN)/python --link-mode copy --compile-bytecode -e ".[test]" \
	  || $(BIN)/pip install -q --no-build-isolation -e ".[test]"; } || { kill $$compiling; exit 1; }; \
	wait $$compiling || true
	rm -f $(VENV)/.installed-* && touch $(STAMP)

grade: $(STAMP)
	$(BIN)/python -m grader batch examples --out build/examples --jobs 2 --lang $(GRADE_LANG)

# Byte-compiled once up front: where PYTHONDONTWRITEBYTECODE is set (as on CI), every grader process would
# otherwise compile the grader's modules again (~0.2 CPU-s each, a few hundred processes per test run).
test: $(STAMP)
	$(BIN)/python -m compileall -q grader
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/bench.py

EXERCISES := $(patsubst solutions/%/exercise.py,%,$(wildcard solutions/*/exercise.py))

# --check first: a solution that would leak (no solution region, a marker the release would not recognise)
# stops the release before nbgrader rewrites anything in assignments/.
release: $(STAMP)
	$(BIN)/python -m grader.integrations.release --check
	for ex in $(EXERCISES); do PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/nbgrader generate_assignment $$ex --force || exit 1; done
	$(BIN)/python -m grader.integrations.release --all

clean:
	rm -rf build
