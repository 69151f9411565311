#!/usr/bin/python3
"""The flake hunt's table: how often each test target, and each test case, failed over the
runs of one `bazel test --runs_per_test=N` (tools/test.sh --repeat N); and tools/test.sh's
counts of any one `bazel test` (--runs 1 without --runs_per_test), read the same way.

    flake_hunt.py --log BAZEL_OUTPUT --testlogs DIR --runs N [--title TEXT] [--json]
    flake_hunt.py --log BAZEL_OUTPUT --testlogs DIR --runs 1 --name default --counts-out FILE

BAZEL_OUTPUT is what that `bazel test` printed (its summary names the targets, and its
"FAIL: //label (... run K of N) (see .../test.log)" lines the runs that failed, also those
whose every test case passed: a sanitizer's report at exit, a crash, a timeout); DIR is the
configuration's bazel-testlogs, where each run left its test.xml and test.log (run_K_of_N/,
shard_S_of_T_run_K_of_N/ for sharded targets). A run of a target fails when any of its shards
failed. Prints a table (every target; under it, each test case that failed at least once) or,
with --json, one JSON object with every target and test case.
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
SUMMARY = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?"
    r"(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE|SKIPPED)\b")
FAILED_RUN = re.compile(r"^(?:FAIL|TIMEOUT|INCOMPLETE|FLAKY)[^:]*: (//\S+).*\(see (\S+)\)\s*$")
RUN_DIR = re.compile(r"^(?:shard_(\d+)_of_(\d+))?_?(?:run_(\d+)_of_(\d+))?$")
# What a failing run's log says first, when no test case's failure does: an assertion, a
# sanitizer's report, a Python exception, a timeout.
FIRST_FAILURE = re.compile(
    r"(\S+\.(?:cc|h|py):\d+: Failure"
    r"|(?:ERROR|WARNING): (?:AddressSanitizer|ThreadSanitizer|LeakSanitizer)[^\n]*"
    r"|\S+\.(?:cc|h):\d+:\d+: runtime error[^\n]*"
    r"|^\w*(?:Error|Exception): [^\n]*"
    r"|-- Test timed out[^\n]*)", re.M)


def read_log(path):
    """(status by label, the test.log paths of the runs that failed) from bazel's output."""
    statuses, failed_logs = {}, set()
    with open(path, errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line).rstrip("\n")
            m = SUMMARY.match(line)
            if m:
                statuses[m.group(1)] = m.group(2)
                continue
            m = FAILED_RUN.match(line)
            if m:
                failed_logs.add(os.path.realpath(m.group(2)))
    return statuses, failed_logs


def target_dir(testlogs, label):
    package, _, target = label[2:].partition(":")
    return os.path.join(testlogs, package, target)


def run_dirs(directory, runs):
    """{run number: [directories of its shards]} for one target's `runs` runs."""
    found = {}
    if not os.path.isdir(directory):
        return found
    for entry in sorted(os.listdir(directory)):
        m = RUN_DIR.match(entry)
        if not entry or not m or not os.path.isdir(os.path.join(directory, entry)):
            continue
        if int(m.group(4) or 1) != runs:
            continue  # left by an earlier hunt with another count
        found.setdefault(int(m.group(3) or 1), []).append(os.path.join(directory, entry))
    if not found and runs == 1 and os.path.isfile(os.path.join(directory, "test.xml")):
        found[1] = [directory]
    return found


def first_failure_line(message):
    """The first two non-empty lines of a gtest failure message, as one: file:line and what."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return ": ".join(lines[:2])


def read_cases(xml_path):
    """[(case name, "passed"|"failed"|"skipped", failure text)] from one test.xml."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = ".".join(x for x in (case.get("classname"), case.get("name")) if x)
        failures = [c for c in case if c.tag in ("failure", "error")]
        if failures:
            text = failures[0].get("message") or failures[0].text or ""
            cases.append((name, "failed", first_failure_line(text)))
        elif (case.get("status") == "notrun" or case.get("result") in ("skipped", "suppressed")
              or any(c.tag == "skipped" for c in case)):
            cases.append((name, "skipped", ""))
        else:
            cases.append((name, "passed", ""))
    return cases


def log_failure_line(log_path):
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return "no test.log"
    m = FIRST_FAILURE.search(text)
    if not m:
        return "failed without an assertion (exit status; see " + log_path + ")"
    line = m.group(1)
    if line.endswith(": Failure"):  # gtest: the assertion is on the next lines
        rest = text[m.end():].lstrip("\n").splitlines()[:1]
        line = line[: -len(" Failure")] + (" " + rest[0].strip() if rest else "")
    return line


def analyse(log, testlogs, runs):
    statuses, failed_logs = read_log(log)
    targets = []
    for label, status in sorted(statuses.items()):
        target = {"label": label, "status": status, "runs": 0, "failed": 0,
                  "failed_without_a_case": 0, "first_failure": "", "cases": {}}
        if status in ("FAILED TO BUILD", "NO STATUS", "SKIPPED"):
            target["first_failure"] = status.lower() if status != "SKIPPED" else ""
            target["failed"] = target["failed_without_a_case"] = int(status != "SKIPPED")
            targets.append(target)
            continue
        for run, shards in sorted(run_dirs(target_dir(testlogs, label), runs).items()):
            target["runs"] += 1
            run_failure = ""
            case_failed = False
            for shard in shards:
                xml_path = os.path.join(shard, "test.xml")
                log_path = os.path.join(shard, "test.log")
                cases = []
                try:
                    cases = read_cases(xml_path)
                except (ET.ParseError, OSError) as e:
                    run_failure = run_failure or f"no readable test.xml ({e})"
                for name, result, text in cases:
                    case = target["cases"].setdefault(
                        name, {"name": name, "runs": 0, "failed": 0, "skipped": 0,
                               "first_failure": ""})
                    if result == "skipped":
                        case["skipped"] += 1
                        continue
                    case["runs"] += 1
                    if result == "failed":
                        case["failed"] += 1
                        case["first_failure"] = case["first_failure"] or text
                        run_failure = run_failure or text
                        case_failed = True
                if os.path.realpath(log_path) in failed_logs and not run_failure:
                    run_failure = log_failure_line(log_path)
            if run_failure:
                target["failed"] += 1
                target["first_failure"] = target["first_failure"] or run_failure
                # Counted once in the totals, as tools/test.sh counts such a run.
                target["failed_without_a_case"] += 0 if case_failed else 1
        if status in ("FAILED", "TIMEOUT", "INCOMPLETE", "REMOTE FAILURE") and not target["failed"]:
            # Bazel says a run failed, and neither a test.xml nor a log line it named shows
            # which (a timeout's log path printed apart): one failure, so the counts show it.
            target["failed"] = target["failed_without_a_case"] = 1
            target["first_failure"] = (f"{status.lower()} (see "
                                       f"{os.path.join(target_dir(testlogs, label), 'test.log')})")
        target["cases"] = sorted(target["cases"].values(), key=lambda c: c["name"])
        targets.append(target)
    passed = sum(c["runs"] - c["failed"] for t in targets for c in t["cases"])
    failed = sum(t["failed_without_a_case"] + sum(c["failed"] for c in t["cases"])
                 for t in targets)
    skipped = sum(c["skipped"] for t in targets for c in t["cases"])
    return {"runs_per_test": runs, "targets": targets, "passed": passed, "failed": failed,
            "skipped": skipped}


def rate(failed, runs):
    return f"{100.0 * failed / runs:.0f}%" if runs else "-"


def print_table(result, title, out=sys.stdout):
    rows = []
    for t in result["targets"]:
        rows.append((t["label"], t["runs"], t["failed"], t["first_failure"]))
        for c in t["cases"]:
            if c["failed"]:
                rows.append(("  " + c["name"], c["runs"], c["failed"], c["first_failure"]))
    width = max([len("target / test case")] + [len(r[0]) for r in rows])
    if title:
        print(title, file=out)
    print(f"{'target / test case':<{width}}  {'runs':>5}  {'failed':>6}  {'rate':>5}  "
          "first failure", file=out)
    for name, runs, failed, first in rows:
        first = first if len(first) <= 160 else first[:157] + "..."
        print(f"{name:<{width}}  {runs:>5}  {failed:>6}  {rate(failed, runs):>5}  {first}".rstrip(),
              file=out)
    flaky = [t for t in result["targets"] if t["failed"]]
    print(f"{len(flaky)} of {len(result['targets'])} targets failed at least once in "
          f"{result['runs_per_test']} runs each", file=out)


def print_summary(result, name, out=sys.stdout):
    """tools/test.sh's lines for one bazel run: each failure, then the counts."""
    for t in result["targets"]:
        for c in t["cases"]:
            if c["failed"]:
                print(f"test.sh: [{name}] FAILED {t['label']} {c['name']}", file=out)
        if t["failed_without_a_case"]:
            print(f"test.sh: [{name}] FAILED {t['label']}: {t['first_failure']}", file=out)
    print(f"test.sh: [{name}] {result['passed']} passed, {result['failed']} failed, "
          f"{result['skipped']} skipped in {len(result['targets'])} test targets", file=out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, help="what `bazel test` printed")
    parser.add_argument("--testlogs", required=True, help="the configuration's bazel-testlogs")
    parser.add_argument("--runs", type=int, required=True,
                        help="--runs_per_test's N (1 for a plain bazel test)")
    parser.add_argument("--title", default="", help="a line above the table")
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    parser.add_argument("--table", action="store_true",
                        help="the table also with --name (it is the default output otherwise)")
    parser.add_argument("--name", default="",
                        help="print tools/test.sh's lines for this run (each failure, then "
                             "'P passed, F failed, S skipped'), prefixed [NAME]; on stderr "
                             "with --json")
    parser.add_argument("--counts-out", default="",
                        help="write 'PASSED FAILED SKIPPED TARGETS' to this file")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1 (got {args.runs})")
    result = analyse(args.log, args.testlogs, args.runs)
    if args.name:
        print_summary(result, args.name, sys.stderr if args.json else sys.stdout)
    if args.counts_out:
        with open(args.counts_out, "w") as f:
            f.write(f"{result['passed']} {result['failed']} {result['skipped']} "
                    f"{len(result['targets'])}\n")
    if args.json:
        json.dump(result, sys.stdout)
        print()
    elif args.table or not args.name:
        print_table(result, args.title)


if __name__ == "__main__":
    main()
