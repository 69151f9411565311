"""PyTorch's own distributed test suite (DistributedTest._DistTestBase) on one backend.

    BACKEND=tessera WORLD_SIZE=2 /usr/bin/python3 tests/torch/dist_suite/run_suite.py \
        [-k PATTERN]... [--tests-from FILE] [--results FILE.jsonl] [--xml FILE.xml] [TEST]...

The equivalent of PyTorch's test/distributed/test_distributed_spawn.py for the torch that
Debian ships (python3-torch 1.13.1, whose torch/testing/_internal/distributed/distributed_test.py
holds the ~270 tests): each test is run by `world_size` fresh "spawn" processes, one per rank,
initialised with init_process_group(BACKEND, file://...), while this process waits for them
(per-test timeout: DISTRIBUTED_TESTS_DEFAULT_TIMEOUT seconds, --test-timeout sets it).

Environment (the suite's own): BACKEND (gloo or tessera), WORLD_SIZE (default 2), TEMP_DIR
(the suite's barrier/scratch directory; a fresh one is made when unset), INIT_METHOD (default
env://, only read by a few tests).

What this runner adds to the upstream one (nothing in torch's installed files is changed):
  * `expecttest`: a stand-in module next to this file (Debian lacks the package).
  * BACKEND=tessera: `import tessera.torch` at module level, so that the rank processes, which
    re-import this module as __mp_main__ under "spawn", register the backend too; and "tessera"
    is added to DistTestCases.backend_feature (see TESSERA_FEATURES) before the suite is
    imported, as the suite evaluates those sets in its decorators at class-definition time.
  * tearDown kills (SIGKILL) a rank process still alive after the suite's SIGTERM, so that a
    hung rank cannot outlive its test.
  * Results: one JSON line per finished test (--results, flushed as it goes, so a run killed
    from outside keeps what it did) and JUnit XML (--xml, or $XML_OUTPUT_FILE under Bazel),
    one <testcase> per test. Exit status 1 when a test failed or errored or none ran.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # the `expecttest` stand-in

# The features of DistTestCases.backend_feature the tessera backend is declared with. Gloo is
# in gpu, cuda, ddp and subgroup. "gpu" gates CPU tests too (gather_object, DDP error
# reporting, monitored barrier, ...: upstream left ucc out of it for want of sequence
# numbers); "cuda" is left out: it only gates DDP communication hooks on CUDA devices.
# "plugin" marks a backend registered through Backend.register_backend.
TESSERA_FEATURES = ("gpu", "ddp", "subgroup", "plugin")


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Runs torch's distributed test suite (DistributedTest._DistTestBase) on "
                    "$BACKEND with $WORLD_SIZE ranks.")
    parser.add_argument("tests", nargs="*",
                        help="test names (test_foo or Class.test_foo); default: all")
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run only tests whose name contains PATTERN (fnmatch wildcards "
                             "allowed); repeatable")
    parser.add_argument("--tests-from", help="a file of test names, one a line (# comments)")
    parser.add_argument("--results", help="append one JSON line per finished test here")
    parser.add_argument("--xml", help="write JUnit XML here (default: $XML_OUTPUT_FILE)")
    parser.add_argument("--test-timeout", type=int,
                        help="seconds a test's ranks may take before they are killed "
                             "(default: $DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, else 300)")
    parser.add_argument("--list", action="store_true", help="list the selected tests and exit")
    return parser.parse_args(argv)


if __name__ == "__main__":
    ARGS = _parse_args(sys.argv[1:])
    # torch's common_utils parses sys.argv on import; it gets none of ours.
    sys.argv = sys.argv[:1]
    if ARGS.test_timeout:
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.test_timeout)
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("INIT_METHOD", "env://")
    if not os.environ.get("TEMP_DIR"):
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="dist-suite-")
    if "BACKEND" not in os.environ:
        sys.exit("run_suite: set BACKEND (gloo or tessera)")

BACKEND = os.environ["BACKEND"]

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if BACKEND == "tessera":
    import tessera.torch  # noqa: E402,F401  (registers the backend, in every rank process too)

    for _feature in TESSERA_FEATURES:
        DistTestCases.backend_feature.setdefault(_feature, set()).add("tessera")

# DIST_SUITE_AS_GLOO=1 (with BACKEND=tessera): an experiment, not the comparison. The suite is
# imported as if BACKEND were "gloo", so that every skip decided at class definition
# (`BACKEND != "gloo"`, require_backend({"gloo"}), the feature sets) lets through what it lets
# through for gloo; the tests then run on tessera (the module's BACKEND, which the bodies and
# init_process_group read, is set back). It shows which gloo-only tests would pass on tessera.
AS_GLOO = BACKEND == "tessera" and os.environ.get("DIST_SUITE_AS_GLOO") == "1"
if AS_GLOO:
    os.environ["BACKEND"] = "gloo"
import torch.testing._internal.distributed.distributed_test as _suite  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)
if AS_GLOO:
    os.environ["BACKEND"] = BACKEND
    _suite.BACKEND = BACKEND

torch.backends.cuda.matmul.allow_tf32 = False

# The suite's rank processes turn on "DDP with ReplicatedTensor" (TestDistBackend._run calls
# _set_ddp_with_replicated_tensor(True)), which makes every DistributedDataParallel import
# torch.distributed._shard; under Debian's Python 3.11 that import fails in torch 1.13 itself
# (sharded_tensor/metadata.py: "ValueError: mutable default TensorProperties for field
# tensor_properties is not allowed", the stricter dataclass check of 3.11), on every backend.
# So the switch is kept off: DDP runs as it does by default (and as users run it).
# DIST_SUITE_REPLICATED_TENSOR=1 leaves the suite's setting alone.
if os.environ.get("DIST_SUITE_REPLICATED_TENSOR") != "1":
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt_utils

    _set_replicated = _rt_utils._set_ddp_with_replicated_tensor
    _rt_utils._set_ddp_with_replicated_tensor = lambda value: _set_replicated(False)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def tearDown(self):
        # The suite SIGTERMs the ranks of a test that timed out; one that ignores it (stuck in
        # C++) would outlive the test and take a core from the next ones.
        for p in getattr(self, "processes", []):
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        super().tearDown()


# ---------------------------------------------------------------------------------------------
# Results: JSON lines as the run goes, JUnit XML at its end.

class _Result(unittest.TextTestResult):
    def __init__(self, *args, results_path=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # dicts: name, status, seconds, message
        self._started = {}
        self._results_path = results_path

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, message=""):
        seconds = time.monotonic() - self._started.get(test.id(), time.monotonic())
        case = {"name": test.id().split(".")[-1], "status": status,
                "seconds": round(seconds, 3), "message": message}
        self.cases.append(case)
        if self._results_path:
            with open(self._results_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(case) + "\n")

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def _write_junit(cases, path, suite_name):
    failures = sum(c["status"] == "failed" for c in cases)
    errors = sum(c["status"] == "error" for c in cases)
    skipped = sum(c["status"] == "skipped" for c in cases)
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(cases)),
                       failures=str(failures), errors=str(errors), skipped=str(skipped))
    for c in cases:
        case = ET.SubElement(suite, "testcase", classname=suite_name, name=c["name"],
                             time=f"{c['seconds']:.3f}")
        if c["status"] in ("failed", "error"):
            tag = "failure" if c["status"] == "failed" else "error"
            lines = c["message"].strip().splitlines()
            ET.SubElement(case, tag, message=lines[-1] if lines else tag).text = c["message"]
        elif c["status"] == "skipped":
            ET.SubElement(case, "skipped", message=c["message"])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _selected_tests(args):
    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in args.patterns]
    names = list(args.tests)
    if args.tests_from:
        with open(args.tests_from, encoding="utf-8") as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    names.append(line)
    if not names:
        return loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    suite = unittest.TestSuite()
    for name in names:
        name = name.split(".")[-1]
        if not hasattr(TestDistBackendWithSpawn, name):
            sys.exit(f"run_suite: no test named {name}")
        suite.addTest(TestDistBackendWithSpawn(name))
    return suite


def main(args):
    suite = _selected_tests(args)
    if args.list:
        for test in suite:
            print(test.id().split(".")[-1])
        return 0
    suite_name = f"dist_suite.{BACKEND}.ws{os.environ['WORLD_SIZE']}"
    print(f"run_suite: BACKEND={BACKEND} WORLD_SIZE={os.environ['WORLD_SIZE']} "
          f"TEMP_DIR={os.environ['TEMP_DIR']} tests={suite.countTestCases()}", flush=True)
    runner = unittest.TextTestRunner(
        stream=sys.stdout, verbosity=2,
        resultclass=lambda *a, **k: _Result(*a, results_path=args.results, **k))
    result = runner.run(suite)
    xml_path = args.xml or os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        _write_junit(result.cases, xml_path, suite_name)
    ok = result.wasSuccessful() and result.testsRun > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
