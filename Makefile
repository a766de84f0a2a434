# Two commands on a fresh machine:
#   make demo   install the package and run the end-to-end demo on the embedded default
#   make test   install everything and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[server,builder]'

# torch and torchvision are pinned together: mosaicml-streaming (a test dependency) imports
# torchvision, and a torchvision wheel only imports beside the torch it was built for.
install-dev: $(BIN)/python
	$(BIN)/pip install --quiet 'torch==2.14.1' 'torchvision==0.29.1'
	$(BIN)/pip install --quiet -e '.[dev]'

demo: install
	$(BIN)/shardstream demo

test: install-dev
	$(BIN)/python -m pytest

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
