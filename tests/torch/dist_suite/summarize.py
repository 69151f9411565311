"""Summarises runs of run_suite.py: counts per (backend, world size) and the tests that pass on
gloo but not on tessera.

    /usr/bin/python3 tests/torch/dist_suite/summarize.py OUT_DIR [--markdown FILE]

OUT_DIR holds BACKEND-wsN.jsonl (run_suite.py --results) and, when a run ended,
BACKEND-wsN.done ("rc=... seconds=..."), as tools/torch_dist_suite.sh writes them. A run that
was killed before its end (no .done, or a non-zero rc with fewer tests than listed) is marked
incomplete; tests it did not reach are counted as "not run".
"""

import argparse
import collections
import json
import os
import re
import sys

STATUSES = ("passed", "failed", "error", "skipped")


def load_runs(out_dir):
    runs = {}
    for name in sorted(os.listdir(out_dir)):
        m = re.fullmatch(r"(\w+)-ws(\d+)\.jsonl", name)
        if not m:
            continue
        backend, ws = m.group(1), int(m.group(2))
        cases = collections.OrderedDict()
        with open(os.path.join(out_dir, name), encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    case = json.loads(line)
                    cases[case["name"]] = case
        done = os.path.join(out_dir, f"{backend}-ws{ws}.done")
        info = {}
        if os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                info = dict(kv.split("=", 1) for kv in f.read().split())
        listed = os.path.join(out_dir, f"{backend}-ws{ws}.list")
        expected = None
        if os.path.exists(listed):
            with open(listed, encoding="utf-8") as f:
                expected = [line.strip() for line in f if line.strip()]
        runs[(backend, ws)] = {"cases": cases, "info": info, "expected": expected}
    return runs


def _first_error_line(message):
    """The most telling line of a failure: the last 'SomethingError: ...' line of the ranks'
    tracebacks (the suite's own message is 'Process N exited with error code 10 ...')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    candidates = [line for line in lines
                  if re.match(r"^[\w.]*(Error|Exception|Timeout)\w*: ", line)
                  and not line.startswith("RuntimeError: Process ")]
    if candidates:
        return candidates[-1][:300]
    return (lines[-1] if lines else "")[:300]


def summarize(runs):
    out = []
    out.append("| backend | world size | tests | passed | failed | errors | skipped | not run "
               "| seconds | complete |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for (backend, ws), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        counts = collections.Counter(c["status"] for c in run["cases"].values())
        expected = run["expected"]
        not_run = (len(set(expected) - set(run["cases"])) if expected is not None else 0)
        total = len(expected) if expected is not None else len(run["cases"])
        complete = bool(run["info"]) and not_run == 0
        out.append(f"| {backend} | {ws} | {total} | {counts['passed']} | {counts['failed']} | "
                   f"{counts['error']} | {counts['skipped']} | {not_run} | "
                   f"{run['info'].get('seconds', '?')} | {'yes' if complete else 'NO'} |")
    world_sizes = sorted({ws for _, ws in runs})
    for ws in world_sizes:
        gloo, tessera = runs.get(("gloo", ws)), runs.get(("tessera", ws))
        if not gloo or not tessera:
            continue
        out.append("")
        out.append(f"## Passing on gloo but not on tessera, world size {ws}")
        out.append("")
        rows = []
        for name, case in gloo["cases"].items():
            if case["status"] != "passed":
                continue
            other = tessera["cases"].get(name)
            if other is None:
                rows.append((name, "not run", ""))
            elif other["status"] != "passed":
                why = (other["message"].strip().splitlines() or [""])[0][:200] \
                    if other["status"] == "skipped" else _first_error_line(other["message"])
                rows.append((name, other["status"], why))
        if not rows:
            out.append("(none)")
        else:
            out.append("| test | on tessera | reason / error |")
            out.append("|---|---|---|")
            for name, status, why in rows:
                out.append(f"| {name} | {status} | {why.replace('|', '/')} |")
        out.append("")
        out.append(f"## Passing on tessera but not on gloo, world size {ws}")
        out.append("")
        rows = [(n, gloo["cases"].get(n, {}).get("status", "not run"))
                for n, c in tessera["cases"].items()
                if c["status"] == "passed" and gloo["cases"].get(n, {}).get("status") != "passed"]
        out.append("\n".join(f"- {n} (gloo: {s})" for n, s in rows) if rows else "(none)")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--markdown", help="also write the summary here")
    args = parser.parse_args()
    text = summarize(load_runs(args.out_dir))
    sys.stdout.write(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
