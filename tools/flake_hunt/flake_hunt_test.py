"""The flake hunt's table over real runs of its fixtures: a target that fails one run in three
shows 1 of 3 (33%), naming the failing assertion; the deterministic one shows 0. And
tools/test.sh's refusal of flags that do not go together.

Each fixture binary runs three times, its results laid out as `bazel test --runs_per_test=3`
lays them out (run_K_of_3/test.xml, test.log) with a "FAIL: ... (see .../test.log)" line in the
console output for each failing run, as Bazel prints it; tools/test.sh --repeat 3 on the two
targets gives the same table (docs/testing.md).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1)
HUNT = os.path.join(ROOT, "tools/flake_hunt/flake_hunt.py")
RUNS = 3


class FlakeHuntTest(unittest.TestCase):
    def setUp(self):
        self.scratch = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.testlogs = os.path.join(self.scratch, "testlogs")
        self.log = os.path.join(self.scratch, "bazel.log")
        self.summary = []
        self.fails = []

    def run_target(self, name):
        """Runs //tools/flake_hunt:NAME three times; returns how many runs failed."""
        binary = os.path.join(ROOT, "tools/flake_hunt", name)
        env = dict(os.environ, FLAKE_FIXTURE_COUNTER=os.path.join(self.scratch, name + ".count"))
        failed = 0
        for run in range(1, RUNS + 1):
            directory = os.path.join(self.testlogs, "tools/flake_hunt", name,
                                     f"run_{run}_of_{RUNS}")
            os.makedirs(directory)
            log = os.path.join(directory, "test.log")
            with open(log, "w") as out:
                code = subprocess.call(
                    [binary, "--gtest_output=xml:" + os.path.join(directory, "test.xml")],
                    stdout=out, stderr=subprocess.STDOUT, env=env, timeout=60)
            if code != 0:
                failed += 1
                self.fails.append(f"FAIL: //tools/flake_hunt:{name} (run {run} of {RUNS}) "
                                  f"(see {log})")
        self.summary.append(f"//tools/flake_hunt:{name}    "
                            f"{'FAILED' if failed else 'PASSED'} in 0.1s")
        return failed

    def hunt(self, *extra):
        with open(self.log, "w") as f:
            f.write("\n".join(self.fails + ["", "INFO: Build completed"] + self.summary) + "\n")
        return subprocess.run(
            ["/usr/bin/python3", HUNT, "--log", self.log, "--testlogs", self.testlogs,
             "--runs", str(RUNS)] + list(extra), capture_output=True, text=True, check=True,
            timeout=60).stdout

    def test_a_one_in_three_flake_shows_its_rate_and_a_steady_target_zero(self):
        self.assertEqual(self.run_target("flaky_fixture_test"), 1)
        self.assertEqual(self.run_target("steady_fixture_test"), 0)
        result = json.loads(self.hunt("--json"))
        by_label = {t["label"]: t for t in result["targets"]}
        flaky = by_label["//tools/flake_hunt:flaky_fixture_test"]
        steady = by_label["//tools/flake_hunt:steady_fixture_test"]
        self.assertEqual((flaky["runs"], flaky["failed"]), (3, 1))
        self.assertIn("fixture_test.cc:", flaky["first_failure"])
        self.assertIn("actual: 0 vs 0", flaky["first_failure"])  # run 3 of 3
        cases = {c["name"]: c for c in flaky["cases"]}
        self.assertEqual((cases["FlakeFixture.FailsEveryNthRun"]["runs"],
                          cases["FlakeFixture.FailsEveryNthRun"]["failed"]), (3, 1))
        self.assertEqual(cases["FlakeFixture.AlwaysPasses"]["failed"], 0)
        self.assertEqual((steady["runs"], steady["failed"]), (3, 0))
        # Over all runs: 12 test case runs, one of them failed.
        self.assertEqual((result["passed"], result["failed"], result["skipped"]), (11, 1, 0))

        table = self.hunt("--title", "flake hunt: 3 runs")
        print(table)
        lines = table.splitlines()
        self.assertEqual(lines[0], "flake hunt: 3 runs")
        flaky_row = next(l for l in lines if l.startswith("//tools/flake_hunt:flaky_fixture_test"))
        self.assertRegex(flaky_row, r"\s3\s+1\s+33%\s+\S*fixture_test\.cc:\d+")
        self.assertTrue(any(l.startswith("  FlakeFixture.FailsEveryNthRun") and "33%" in l
                            for l in lines), table)
        steady_row = next(l for l in lines if l.startswith("//tools/flake_hunt:steady_fixture"))
        self.assertRegex(steady_row, r"\s3\s+0\s+0%\s*$")
        self.assertIn("1 of 2 targets failed at least once in 3 runs each", table)

    def test_a_run_that_fails_with_every_case_passed_counts_with_its_log_line(self):
        # A sanitizer's report at exit: the cases passed, the run did not.
        self.run_target("steady_fixture_test")
        log = os.path.join(self.testlogs, "tools/flake_hunt/steady_fixture_test/run_2_of_3",
                           "test.log")
        with open(log, "a") as f:
            f.write("WARNING: ThreadSanitizer: data race (pid=1)\n")
        self.fails.append(f"FAIL: //tools/flake_hunt:steady_fixture_test (run 2 of 3) "
                          f"(see {log})")
        result = json.loads(self.hunt("--json"))
        steady = result["targets"][0]
        self.assertEqual((steady["runs"], steady["failed"]), (3, 1))
        self.assertEqual(steady["first_failure"], "WARNING: ThreadSanitizer: data race (pid=1)")
        self.assertEqual(result["failed"], 1)


class TestShFlagsTest(unittest.TestCase):
    """tools/test.sh refuses what it cannot do, before it installs or builds anything."""

    def refused(self, *args):
        run = subprocess.run(["bash", os.path.join(ROOT, "tools/test.sh")] + list(args),
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertNotIn("installing", run.stdout)
        return run.stderr

    def test_bad_values_and_combinations_are_refused_with_what_was_wrong(self):
        self.assertIn("--repeat takes a positive number of runs (got '0')",
                      self.refused("--repeat", "0"))
        self.assertIn("(got 'x')", self.refused("--repeat=x"))
        self.assertIn("--repeat needs a value", self.refused("--repeat"))
        self.assertIn("--config is asan or tsan (got 'msan')",
                      self.refused("--repeat", "2", "--config", "msan"))
        self.assertIn("go with --repeat N", self.refused("--load"))
        self.assertIn("go with --repeat N", self.refused("--config=tsan"))
        self.assertIn("give --config asan or tsan instead of --sanitizers",
                      self.refused("--repeat", "2", "--sanitizers"))


if __name__ == "__main__":
    unittest.main()
