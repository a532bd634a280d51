# Two commands matter: `make demo` (the main job) and `make test` (the suite). Both set up first.
VENV := .venv
PY   := $(VENV)/bin/python

.PHONY: setup demo test parity wheel clean
setup:            ## system packages, patched kp (cached wheel), .venv with catchat editable
	@bash tools/setup.sh

demo: setup       ## check the device, then train configs/tiny.toml on Shakespeare and sample from it
	@bash tools/demo.sh

test: setup       ## lint (ruff, pyproject's config), then the whole suite on every core (pytest-xdist; real shaders on the default Vulkan device, lavapipe in CI) and its 10 slowest tests
	$(PY) -m ruff check catchat tests tools
	$(PY) -m pytest -n auto --durations=10

parity: setup     ## every kernel and the whole model against numpy on this machine's device
	$(VENV)/bin/catchat parity

wheel: setup      ## a wheel with the prebuilt SPIR-V in dist/ (needs glslc)
	$(PY) -m pip wheel --no-deps --no-build-isolation -w dist .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
