# Two commands on a fresh machine:
#   make demo   install the package and run the end-to-end demo on the embedded default
#   make test   install everything and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# setuptools warns that folders named like the package may shadow it during imports; here
# that is the layout on purpose (shardstream/ links client/, server/, shard_builder/).
EDITABLE_QUIET := PYTHONWARNINGS='ignore:Editable installation'

install: $(BIN)/python
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[server,builder]'

# torch and torchvision are pinned together: mosaicml-streaming (a test dependency) imports
# torchvision, and a torchvision wheel only imports beside the torch it was built for.
install-dev: $(BIN)/python
	$(BIN)/pip install --quiet 'torch==2.14.1' 'torchvision==0.29.1'
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[dev]'

demo: install
	$(BIN)/shardstream demo

# The web console's tests drive Debian's chromium (installed here where missing; needs root).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

test: install-dev browser
	$(BIN)/python -m pytest

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
