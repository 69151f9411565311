#!/usr/bin/env bash
# Runs flake_hunt_test.py with Debian's Python (the one tools/test.sh runs flake_hunt.py with).
set -euo pipefail
root="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-tessera}"
exec /usr/bin/python3 "$root/tools/flake_hunt/flake_hunt_test.py" "$root"
