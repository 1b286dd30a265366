# Every target does its own set-up: a .venv built from pyproject.toml, nothing installed by hand.
PY      := .venv/bin/python
STAMP   := .venv/.installed
# Tests get 8 simulated CPU devices from tests/conftest.py; demo and benchmarks run on the
# real device count (simulated devices would split 2 cores eight ways).
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: demo lint test test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

# The beam extra (pyproject.toml) pins protobuf<7, pyarrow<26, pillow<13, python-dateutil<3, older
# than the core install resolves to: .venv stays the core install, and apache-beam plus exactly
# the versions it needs (pip's plan against .venv) go to .beam/, put in front by PYTHONPATH.
BEAM    := .beam/.installed
BEAMENV := PYTHONPATH=$(CURDIR)/.beam
$(BEAM): $(STAMP)
	rm -rf .beam && mkdir .beam
	$(PY) -m pip install -q --dry-run --report .beam/plan.json $$($(PY) -c "import tomllib; \
	  print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['beam'])")
	$(PY) -m pip install -q --no-deps --target .beam $$($(PY) -c "import json; \
	  print(*(p['metadata']['name'] + '==' + p['metadata']['version'] \
	          for p in json.load(open('.beam/plan.json'))['install']))")
	touch $(BEAM)

# The TPU compiler (libtpu, the tpu extra at .venv's jax version) for `rossjax plan` and its
# tests: in .tpu/, put in front by PYTHONPATH for those tests only. On a host without a TPU,
# libtpu in .venv would make every process that asks jax for its backends print TPU-metadata
# warnings on stderr, which the CLI tests read. Those tests compile at full optimization
# (tests/conftest.py's -O0 would change the TPU programs whose memory they check).
TPU     := .tpu/.installed
TPUENV  := PYTHONPATH=$(CURDIR)/.tpu JAX_PLATFORMS=cpu JAX_DISABLE_MOST_OPTIMIZATIONS=0
$(TPU): $(STAMP)
	rm -rf .tpu && mkdir .tpu
	$(PY) -m pip install -q --dry-run --report .tpu/plan.json \
	  "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')"
	$(PY) -m pip install -q --no-deps --target .tpu $$($(PY) -c "import json; \
	  print(*(p['metadata']['name'] + '==' + p['metadata']['version'] \
	          for p in json.load(open('.tpu/plan.json'))['install']))")
	touch $(TPU)

demo: $(STAMP)
	$(PY) -m rossjax.cli demo --workdir=runs/demo

# ruff (config in pyproject.toml): pyflakes + import order must be clean; function complexity
# (mccabe > 15) is listed for the reader, never a failure (--exit-zero).
lint: $(STAMP)
	$(PY) -m ruff check .
	@echo "complexity report (not a failure):"
	@$(PY) -m ruff check --select C901 --exit-zero --output-format concise . | grep C901 || true

# The whole suite (what CI runs): lint first, then pytest with two xdist workers (one per core),
# slowest modules first (tests/suite_plugin.py). The beam tests skip there (no apache_beam in
# .venv) and run in a pass of their own with .beam/ in front; the TPU-compiler tests (rossjax
# plan) likewise, with .tpu/ in front (-k tpu). Those two passes run beside the first, their
# output in build/test-beam.log and build/test-tpu.log, printed after it: the first pass leaves
# ~15% of the two cores idle (tests waiting on subprocesses, servers and sandboxes), which they
# fill. All share JAX's compilation cache in build/jax-cache (tests/conftest.py); the last line
# says how long it took and on what CPU.
CPU := $$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), \
  $$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || (grep -qw avx2 /proc/cpuinfo && echo AVX2 \
  || echo no AVX2)), $$(nproc) cores
TPUTESTS := tests/test_plan.py tests/test_memory.py
test: lint $(BEAM) $(TPU)
	@start=$$(date +%s); mkdir -p build; rm -f build/test-beam.rc build/test-tpu.rc; \
	($(BEAMENV) $(PY) -m pytest -q -n 0 tests/test_curate_beam.py >build/test-beam.log 2>&1; \
	  echo $$? >build/test-beam.rc) & \
	($(TPUENV) $(PY) -m pytest -q -n 2 -k tpu $(TPUTESTS) >build/test-tpu.log 2>&1; \
	  echo $$? >build/test-tpu.rc) & \
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=20 tests; rc=$$?; wait; \
	for p in beam tpu; do echo "== the $$p pass (build/test-$$p.log):"; cat build/test-$$p.log; \
	  [ "$$(cat build/test-$$p.rc 2>/dev/null)" = 0 ] || { echo "the $$p pass failed"; rc=1; }; \
	done; \
	echo "make test: $$(( $$(date +%s) - start )) s on $(CPU), exit $$rc"; exit $$rc

# Inner loop: skip tests marked slow.
test-fast: $(STAMP) $(BEAM) $(TPU)
	$(PY) -m pytest -q -n 2 -m "not slow" tests
	$(BEAMENV) $(PY) -m pytest -q -n 0 -m "not slow" tests/test_curate_beam.py
	$(TPUENV) $(PY) -m pytest -q -n 2 -k tpu -m "not slow" $(TPUTESTS)

bench: $(STAMP)
	$(PY) -m rossjax.cli bench model

clean:
	rm -rf .venv .beam .tpu runs build
