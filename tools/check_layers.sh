#!/usr/bin/env bash
# Checks the layering of docs/architecture.md with `bazel query` over the libraries and
# binaries (tests may reach across layers to set up a fleet): a lower layer must not depend on
# a higher one. Prints one line per rule and exits non-zero naming every dependency path that
# breaks one. tools/test.sh runs it before the tests, counted as one test.
#
#   tools/check_layers.sh
#
# Visibility cannot say this inside worker/ by itself: every package there is visible to the
# others, so that tests in each can use the rest. A rule whose query fails is itself a failure,
# and the first rule is a dependency that must exist: a query that finds nothing because it is
# wrong cannot pass as "no violation".
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=0
# What the rules' queries look at: libraries and binaries, not tests.
code='kind("cc_library|cc_binary", %s)'

# deps_between FROM TO: the libraries and binaries under TO that those under FROM depend on.
deps_between() {
  local from to
  from=$(printf "$code" "$1")
  to=$(printf "$code" "$2")
  bazel query --noshow_progress --noshow_loading_progress \
    "deps($from) intersect $to" 2>/tmp/check_layers.$$.err || {
    echo "check_layers: ERROR: bazel query failed for $1 -> $2:" >&2
    cat /tmp/check_layers.$$.err >&2
    rm -f /tmp/check_layers.$$.err
    return 2
  }
  rm -f /tmp/check_layers.$$.err
}

# must_not FROM TO WHY
must_not() {
  local found
  if ! found=$(deps_between "$1" "$2"); then
    failed=1
    return
  fi
  if [[ -n "$found" ]]; then
    echo "FAIL  $1 must not depend on $2 ($3); it does, on:"
    local target
    for target in $found; do
      echo "        $target, through: $(bazel query --noshow_progress --noshow_loading_progress \
        "somepath($(printf "$code" "$1"), $target)" 2>/dev/null | tr '\n' ' ')"
    done
    failed=1
  else
    echo "ok    $1 does not depend on $2"
  fi
}

# The sanity rule: the engines run on the collectives, so the query must see that.
if found=$(deps_between "//worker/engines/..." "//worker/collectives/...") && [[ -n "$found" ]]
then
  echo "ok    //worker/engines/... depends on //worker/collectives/... (the queries see deps)"
else
  echo "FAIL  the query does not see //worker/engines/... depend on //worker/collectives/..."
  failed=1
fi

must_not "//common/..." "//coordinator/... + //server/... + //worker/... + //tools/..." \
  "common is the bottom layer"
must_not "//coordinator/..." "//server/... + //worker/... + //tools/..." \
  "the coordinator shares only common/ with the parameter server"
must_not "//server/..." "//coordinator/... + //worker/... + //tools/..." \
  "the parameter server shares only common/ with the coordinator"
must_not "//worker/..." "//server/... + //tools/..." "workers reach the servers over the wire"
must_not "//worker/collectives/channel/..." "//worker/collectives:all" \
  "the channels are below the ring algorithms and the setup that picks a channel"
must_not "//worker/collectives/..." "//worker/engines/... + //worker:all + //worker/torch/... \
+ //worker/jobs/... + //worker/modes/..." \
  "collectives are below the engines, the modes, the trainer and the PyTorch backend"
must_not "//worker/engines/..." \
  "//worker:all + //worker/torch/... + //worker/jobs/... + //worker/modes/..." \
  "the engines are below the modes, the trainer and the PyTorch backend"
must_not "//worker/jobs/..." "//worker/modes/... + //worker:all" \
  "the jobs are below the mode registry that runs them and main"
must_not "//worker/modes/..." "//worker:all + //worker/torch/..." \
  "the modes are below main and the command line; the PyTorch backend is beside them"
must_not "//worker/nn/... + //worker/data/..." \
  "//worker/engines/... + //worker:all + //worker/torch/... + //worker/modes/..." \
  "models and data are below the engines"
must_not "//worker/pipeline/..." \
  "//worker/collectives/... + //worker/engines/... + //worker:all + //worker/torch/... + \
//worker/jobs/... + //worker/modes/..." \
  "pipeline schedules are plain algorithms below both front ends"

if ((failed)); then
  echo "check_layers: the layering is broken (docs/architecture.md)"
  exit 1
fi
echo "check_layers: every rule holds"
