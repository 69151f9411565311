"""What the Python tests of the tessera torch.distributed backend share.

    import torch_testing

    def _sum(rank, world_size):              # runs in each rank's process, after
        t = torch.ones(3) * rank              # init_process_group
        dist.all_reduce(t)
        return t

    class SumTest(unittest.TestCase):
        def test_sum(self):
            results = torch_testing.run_ranks(_sum, world_size=3)
            ...

    if __name__ == "__main__":
        torch_testing.main()

run_ranks starts one fresh process per rank (the "spawn" start method, as mp.spawn does), so
every rank is a real process with its own ring; the functions it runs must be defined at a
module's top level. Rendezvous is through a file store in a temporary directory: no port is
chosen by the test. A rank that raises reports its exception; a rank that does not finish
within the deadline is killed and named. main() runs the module's tests and writes their
results as JUnit XML where Bazel asks ($XML_OUTPUT_FILE), one test case per test method.
"""

import datetime
import multiprocessing
import os
import pickle
import queue
import shutil
import sys
import tempfile
import time
import traceback
import unittest
import xml.etree.ElementTree as ET


# The sanitizer these processes run under ("asan": .bazelrc's configuration sets
# TESSERA_SANITIZER, and run_python.sh preloads AddressSanitizer's runtime into the interpreter),
# or "".
SANITIZER = os.environ.get("TESSERA_SANITIZER", "")


def not_under_sanitizer(test):
    """Runs a test case in the default configuration only. Under a sanitizer every rank's start
    (the interpreter importing torch with the sanitizer's allocator) costs several times as
    much, and CI runs the suite in every configuration within one budget: there a slice of
    each file's cases runs, chosen to cover its C++ paths."""
    return unittest.skipIf(SANITIZER, f"default configuration only (not under {SANITIZER})")(test)


class RankFailure(Exception):
    """One or more ranks raised or did not finish. `errors` maps each such rank to its
    exception's text ("TypeName: message"); `results` holds the others' return values."""

    def __init__(self, errors, results, tracebacks):
        self.errors = errors
        self.results = results
        lines = [f"rank {rank}: {error}" for rank, error in sorted(errors.items())]
        details = "".join(f"\n--- rank {rank} ---\n{tb}" for rank, tb in sorted(tracebacks.items()))
        super().__init__("\n".join(lines) + details)


def _rank_main(fn, rank, world_size, backend, init_method, timeout_s, args, env, out):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "tessera":
            import tessera.torch  # noqa: F401  (registers the backend)
        if init_method is not None:
            dist.init_process_group(backend, init_method=init_method, rank=rank,
                                    world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        result = fn(rank, world_size, *args)
        if init_method is not None and dist.is_initialized():
            dist.destroy_process_group()
        out.put((rank, "ok", pickle.dumps(result), None))
    except BaseException as e:  # noqa: BLE001  (reported to the parent, whatever it is)
        out.put((rank, "error", f"{type(e).__name__}: {e}", traceback.format_exc()))


def run_ranks(fn, world_size, *, backend="tessera", args=(), timeout_s=60, env=None,
              init=True, return_errors=False):
    """Runs fn(rank, world_size, *args) in `world_size` fresh processes after
    init_process_group(backend, file:// store, timeout=timeout_s), and returns the return
    values by rank. With init=False the function sets the group up itself (it gets
    TESSERA_TEST_DIR, a temporary directory, in its environment).

    Raises RankFailure when a rank raised (or, with return_errors=True, returns it instead)
    and when a rank did not finish within 2 * timeout_s + 30 seconds (it is killed).
    """
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    directory = tempfile.mkdtemp(prefix="tessera-torch-test-")
    env = dict(env or {})
    env.setdefault("TESSERA_TEST_DIR", directory)
    init_method = f"file://{directory}/store" if init else None
    processes = []
    try:
        for rank in range(world_size):
            p = context.Process(target=_rank_main, args=(fn, rank, world_size, backend,
                                                          init_method, timeout_s, args, env, out),
                                name=f"rank {rank}")
            p.start()
            processes.append(p)
        deadline = time.monotonic() + 2 * timeout_s + 30
        results, errors, tracebacks = {}, {}, {}
        while len(results) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            try:
                rank, kind, value, tb = out.get(timeout=max(0.1, min(remaining, 1.0)))
            except queue.Empty:
                for rank, p in enumerate(processes):
                    if (not p.is_alive() and rank not in results and rank not in errors
                            and out.empty()):
                        # Give a last message in flight a moment to arrive.
                        time.sleep(0.5)
                        if out.empty():
                            errors[rank] = f"exited with code {p.exitcode} without a result"
                if remaining <= 0:
                    for rank in range(world_size):
                        if rank not in results and rank not in errors:
                            errors[rank] = f"did not finish within {2 * timeout_s + 30} s"
                continue
            if kind == "ok":
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
                tracebacks[rank] = tb
        if errors:
            failure = RankFailure(errors, results, tracebacks)
            if return_errors:
                return failure
            raise failure
        return [results[rank] for rank in range(world_size)]
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# JUnit XML for Bazel (tools/test.sh counts its test cases)

class _RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (test, status, message, seconds)
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, message=""):
        seconds = time.monotonic() - self._started.get(test.id(), time.monotonic())
        self.cases.append((test, status, message, seconds))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

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
        self._record(test, "failure", "unexpected success")


def _write_junit(cases, path):
    suite = ET.Element("testsuite", name=os.path.basename(sys.argv[0]), tests=str(len(cases)))
    for test, status, message, seconds in cases:
        test_id = test.id()
        classname, _, name = test_id.rpartition(".")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name,
                             time=f"{seconds:.3f}")
        if status in ("failure", "error"):
            ET.SubElement(case, status, message=message.splitlines()[-1] if message else
                          status).text = message
        elif status == "skipped":
            ET.SubElement(case, "skipped", message=message)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def main():
    """Runs the tests of __main__ (unittest's arguments: -k PATTERN, test names) and writes
    the JUnit XML; exits 1 when a test failed."""
    program = unittest.main(module="__main__", exit=False, verbosity=2,
                            testRunner=unittest.TextTestRunner(resultclass=_RecordingResult,
                                                               stream=sys.stdout, verbosity=2))
    result = program.result
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        _write_junit(result.cases, xml_path)
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
