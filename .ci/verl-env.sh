#!/usr/bin/env bash
# CI for the verl plugin: its own virtualenv, .venv-verl (verl 0.9.1 asks for transformers < 5.11,
# the core pins 5.24), then tests/bridges/test_verl_plugin.py, failing if any test is skipped.
# Lean: verl without its dependencies, plus those that `import verl`, its loss and advantage
# registries, its config classes and agg_loss import (ray, tensordict, transformers, omegaconf,
# codetiming, numpy), and hydra-core (docs/verl.md's overrides are composed). Left out, because
# only verl's trainer needs them: ray[default]'s extras, accelerate, datasets, peft, pandas,
# pyarrow, torchdata, wandb, tensorboard, ... (the full install, `pip install ".[verl]"`, is about
# 120 packages; docs/verl.md). `install` or `test` does one half (.ci/run installs while the
# core suite runs); no argument does both.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-install}" = install ]; then
  python3 -m venv .venv-verl
  install=(.venv-verl/bin/python -m pip install -q -c .ci/constraints-verl.txt)
  if [ -d /opt/wheels ]; then  # the local torch CPU wheel, if the machine has it
    "${install[@]}" --find-links /opt/wheels torch
  else  # never PyPI's Linux torch, the CUDA build: 2.13.0+cpu sorts above it (untested here)
    "${install[@]}" --extra-index-url https://download.pytorch.org/whl/cpu torch
  fi
  "${install[@]}" --no-deps verl
  "${install[@]}" --no-warn-conflicts ray tensordict transformers omegaconf codetiming numpy \
    hydra-core pytest
  "${install[@]}" --no-deps --no-build-isolation -e .  # the entry point verl.plugins
fi
if [ "${1:-test}" = test ]; then
  .venv-verl/bin/python -c "import verl; print('verl', verl.__version__)"
  .venv-verl/bin/python -m pytest -q -rs -p no:cacheprovider tests/bridges/test_verl_plugin.py \
    | tee .venv-verl/pytest.log
  if grep -q skipped .venv-verl/pytest.log; then
    echo "verl-env: a verl plugin test was skipped" >&2
    exit 1
  fi
fi
