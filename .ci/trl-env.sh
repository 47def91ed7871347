#!/usr/bin/env bash
# CI for the TRL bridge: its own virtualenv (.venv-trl: TRL's packages cannot share the core's
# environment), pinned by .ci/constraints.txt and .ci/constraints-trl.txt, then the bridge's tests;
# a skipped test fails the run. `install` or `test` does one half (.ci/run installs while the
# core suite runs); no argument does both.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-install}" = install ]; then
  python3 -m venv .venv-trl
  find_links=()
  if [ -d /opt/wheels ]; then find_links=(--find-links /opt/wheels); fi  # local torch CPU wheel
  # the [trl] extra, and [demo] for the tests (pytest); not editable: the tests run the
  # installed script from outside the clone
  .venv-trl/bin/python -m pip install -q "${find_links[@]}" ".[demo,trl]" -c .ci/constraints.txt \
      -c .ci/constraints-trl.txt
fi
if [ "${1:-test}" = test ]; then
  .venv-trl/bin/python -m pytest -q -rs -p no:cacheprovider tests/bridges/test_trl_tokencredit.py \
    | tee .venv-trl/pytest.log
  if grep -q skipped .venv-trl/pytest.log; then
    echo "trl-env.sh: a TRL bridge test was skipped (above); none may be" >&2
    exit 1
  fi
fi
