# Two commands on a fresh machine:
#   make demo   install the package and run the end-to-end demo on the embedded default
#   make test   install everything and run the whole test suite
#   make vision install for vision training: torchvision for the torch installed, and the
#               fast JPEG decoders (docs/vision.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint browser torch vision

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# setuptools warns that folders named like the package may shadow it during imports; here
# that is the layout on purpose (shardstream/ links client/, server/, shard_builder/).
EDITABLE_QUIET := PYTHONWARNINGS='ignore:Editable installation'

# PyTorch first, the build this machine can use: without an NVIDIA GPU its CPU build, not
# the 5 GB of CUDA libraries (tools/install-torch says which, and why it takes a while).
torch: $(BIN)/python
	@$(BIN)/python -c 'import torch' 2>/dev/null && \
	  echo "torch $$($(BIN)/python -c 'import torch; print(torch.__version__)') is installed" || \
	  tools/install-torch $(BIN)/pip torch

install: torch
	@echo "Installing shardstream with its server and builder extras (a minute or so)..."
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[server,builder]'

# torch and torchvision are pinned together: mosaicml-streaming (a test dependency) imports
# torchvision, and a torchvision wheel only imports beside the torch it was built for.
install-dev: $(BIN)/python
	tools/install-torch $(BIN)/pip --quiet 'torch==2.14.1' 'torchvision==0.29.1'
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[dev]'

demo: install
	$(BIN)/shardstream demo
	@echo "shardstream is installed in $(VENV): run 'source $(VENV)/bin/activate' in your shell to use it (docs/quickstart.md)."

# Vision training. torchvision is installed by itself first, as the build for the torch that
# is here (tools/install-torch pins that torch): `pip install -e '.[vision]'` alone would
# take the newest torchvision, which replaces a CPU torch with gigabytes of CUDA libraries
# or does not import beside it ("operator torchvision::nms does not exist").
vision: torch
	tools/install-torch $(BIN)/pip --quiet torchvision
	@echo "Installing shardstream with its vision extra (torchcodec, simplejpeg)..."
	$(EDITABLE_QUIET) $(BIN)/pip install --quiet -e '.[server,builder,vision]'
	@$(BIN)/python -c 'import torch, torchvision; print("torch", torch.__version__, "+ torchvision", torchvision.__version__, "import")'

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
