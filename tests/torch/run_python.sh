#!/usr/bin/env bash
# Runs a Python test of the tessera torch.distributed backend under Bazel: Debian's
# /usr/bin/python3 (the interpreter python3-torch serves), with the package `tessera` from this
# test's runfiles first on sys.path, so the test imports the extension module just built, not
# an installed one.
#
#   run_python.sh tests/torch/collectives_test.py [args...]
#
# Under the sanitizer configurations (.bazelrc sets TESSERA_SANITIZER) the extension is
# instrumented and the interpreter is not, so AddressSanitizer's runtime is preloaded; under
# ThreadSanitizer, which cannot be preloaded, the test is recorded as skipped.
set -euo pipefail

root="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-tessera}"
export PYTHONPATH="$root/worker/torch:$root/tests/torch${PYTHONPATH:+:$PYTHONPATH}"
# The job key every rank (and any tessera process the test starts) proves membership with: a
# key file as common/security/job_key.h writes one, private to this test.
export TESSERA_AUTH_KEY_FILE="${TEST_TMPDIR:?run under bazel test}/job.key"
if [[ ! -e "$TESSERA_AUTH_KEY_FILE" ]]; then
  (umask 077 && printf 'tessera-job-key-v1 %s\n' \
    "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$TESSERA_AUTH_KEY_FILE")
fi
# One thread per rank for torch's own kernels: the ranks of a test share two cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
case "${TESSERA_SANITIZER:-}" in
  asan)
    LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)"
    export LD_PRELOAD
    # The interpreter's own allocations are not leaks worth reporting.
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    ;;
  tsan)
    # ThreadSanitizer cannot be preloaded into an uninstrumented interpreter (it must own the
    # process from its first instruction): the C++ side's races are judged by
    # //worker/torch:group_member_test instead. The test is recorded as skipped.
    if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
      cat >"$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="$1" tests="1"><testcase classname="$1" name="all"><skipped message="not run under ThreadSanitizer (the Python interpreter is not instrumented)"/></testcase></testsuite></testsuites>
XML
    fi
    echo "skipped under ThreadSanitizer: the Python interpreter is not instrumented"
    exit 0
    ;;
esac
script="$1"
shift
exec /usr/bin/python3 "$root/$script" "$@"
