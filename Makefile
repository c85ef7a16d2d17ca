# The two commands of the README. Both set everything up first (idempotent, seconds when done).
.PHONY: main test test-fast setup
PY := .venv/bin/python

setup:
	@bash scripts/setup.sh

main: setup
	@$(PY) scripts/run_notebook.py example_notebooks/mnist-tensorflow-keras.ipynb

# The whole suite in three lanes on two cores (pytest-xdist; tests/conftest.py keeps each server
# tier in one): two kept the cores 85% busy, the rest ranks and servers waiting on purpose.
test:
	@bash scripts/setup.sh --test
	@$(PY) -m pytest -p no:cacheprovider -ra --durations=25 -n 3

# The quick tier (no Spark, no ranks, no kernels), in two lanes: 30-32 s on two cores.
test-fast: setup
	@$(PY) -m pytest -p no:cacheprovider -ra -m fast -n 2 tests/unit
