"""The job key `import tessera.torch` makes for the ranks a program starts itself.

A process that no launcher started (no RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...) and that
has no key makes one when it imports tessera.torch: a file of mode 0600 in a directory of mode
0700, named by TESSERA_AUTH_KEY_FILE, which the processes it starts inherit, and removed when it
exits, however it ends. A rank that a launcher started makes none (the other ranks could not
know it) and keeps the error that says how to give one. A process outside that parent's tree
cannot join its ranks, whatever address it is given.

Every program here is a real /usr/bin/python3 process started without TESSERA_AUTH_KEY_FILE
(run_python.sh sets one for the tests themselves).
"""

import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch_testing

PYTHON = "/usr/bin/python3"
TIMEOUT_S = 90

# What each of the programs below begins with: the tessera package under test, one thread.
PRELUDE = textwrap.dedent("""\
    import datetime, os, sys, time
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    import tessera.torch
    """)

# A rank of a two-rank job whose store is at 127.0.0.1:PORT: joins, all-reduces, says how it went.
RANK_BODY = textwrap.dedent("""\
    def rank(rank, port, report):
        try:
            store = dist.TCPStore("127.0.0.1", port, 2, rank == 0,
                                  timeout=datetime.timedelta(seconds=30))
            if rank == 0:
                report("PORT %d" % store.port)
            dist.init_process_group("tessera", store=store, rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=8))
            t = torch.ones(2) * (rank + 1)
            dist.all_reduce(t)
            report("JOINED sum=%s" % t.tolist())
            dist.destroy_process_group()
        except Exception as e:
            report("REFUSED %s: %s" % (type(e).__name__, str(e).replace(chr(10), " ")))
    """)


# Rank 0 in a process the parent starts with multiprocessing's spawn, reporting on a queue
# (its first report: "PORT n").
SPAWNED_RANK0 = textwrap.dedent("""\
    import multiprocessing, subprocess

    def rank0(queue):
        rank(0, 0, queue.put)

    def start_rank0():
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        first = context.Process(target=rank0, args=(queue,))
        first.start()
        return first, queue
    """)

def _environment(**extra):
    """This test's environment without a key (and without any launcher's variables), plus
    `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TESSERA_AUTH_KEY_FILE", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                        "PMI_RANK", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "TESSERA_INSECURE")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _start(script, *args, env=None):
    return subprocess.Popen([PYTHON, script] + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.PIPE, text=True,
                            env=env or _environment(), start_new_session=True)


def _finish(process):
    """The rest of `process`'s output once it exits (killed, with its session, after
    TIMEOUT_S)."""
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n[job_key_test: killed after {TIMEOUT_S} s]"
    sys.stdout.write(output)
    return output


def _read_line_starting(process, prefix):
    """Reads `process`'s output up to a line beginning with `prefix` and returns that line
    (fails if the process ends first)."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return line.rstrip("\n")
    raise AssertionError(f"no line starting with {prefix!r} in:\n{''.join(seen)}")


def _wait_until_gone(path, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not os.path.exists(path)


class JobKeyTest(unittest.TestCase):
    def setUp(self):
        self.scratch = tempfile.TemporaryDirectory()
        self.addCleanup(self.scratch.cleanup)

    def _script(self, name, *parts):
        path = os.path.join(self.scratch.name, name)
        with open(path, "w") as f:
            f.write(PRELUDE + "".join(textwrap.dedent(part) for part in parts))
        return path

    def test_the_key_is_private_and_gone_when_its_process_ends_however_it_ends(self):
        holder = self._script("holder.py", """\
            print("KEY", os.environ["TESSERA_AUTH_KEY_FILE"], flush=True)
            sys.stdin.readline()  # exits when told to, or when a signal ends it
            """)
        for ending in ("exit", "SIGTERM", "SIGKILL", "SIGINT"):
            with self.subTest(ending=ending):
                process = _start(holder)
                path = _read_line_starting(process, "KEY").split(" ", 1)[1]
                directory = os.path.dirname(path)
                info = os.stat(path)
                self.assertEqual(stat.S_IMODE(info.st_mode), 0o600, path)
                self.assertEqual(info.st_uid, os.getuid(), path)
                self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700, directory)
                with open(path) as f:
                    self.assertTrue(f.read().startswith("tessera-job-key-v1 "), path)
                if ending == "exit":
                    process.stdin.write("\n")
                    process.stdin.flush()
                else:
                    process.send_signal(getattr(signal, ending))
                _finish(process)
                self.assertTrue(_wait_until_gone(directory),
                                f"{directory} still exists 5 s after its process ended "
                                f"({ending}, exit status {process.returncode})")

    def test_a_rank_a_launcher_started_makes_no_key(self):
        probe = self._script("probe.py", """\
            print("KEY", os.environ.get("TESSERA_AUTH_KEY_FILE", "none"), flush=True)
            """)
        cases = {"RANK": {"RANK": "0", "WORLD_SIZE": "2"},
                 "OMPI_COMM_WORLD_RANK": {"OMPI_COMM_WORLD_RANK": "1"},
                 "SLURM_PROCID": {"SLURM_PROCID": "0"},
                 "PMI_RANK": {"PMI_RANK": "0"},
                 "TESSERA_INSECURE": {"TESSERA_INSECURE": "1"},
                 "a key given": {"TESSERA_AUTH_KEY_FILE": "/given/job.key"}}
        for name, extra in cases.items():
            with self.subTest(case=name):
                process = _start(probe, env=_environment(**extra))
                output = _finish(process)
                self.assertEqual(process.returncode, 0, output)
                expected = extra.get("TESSERA_AUTH_KEY_FILE", "none")
                self.assertIn(f"KEY {expected}\n", output)

    def test_a_launched_rank_without_a_key_is_told_how_to_give_one(self):
        script = self._script("launched.py", """\
            store = os.path.join(sys.argv[1], "store")
            try:
                dist.init_process_group("tessera", init_method="file://" + store, rank=1,
                                        world_size=2, timeout=datetime.timedelta(seconds=20))
                print("JOINED", flush=True)
            except Exception as e:
                print("REFUSED", str(e).replace(chr(10), " "), flush=True)
            """)
        # The key is looked for before anything waits for the other rank.
        process = _start(script, self.scratch.name, env=_environment(RANK="1", WORLD_SIZE="2"))
        output = _finish(process)
        self.assertIn("REFUSED", output)
        self.assertIn("no job key", output)
        self.assertIn("started by a launcher (RANK is set)", output)
        self.assertIn("--make-key-file", output)

    def test_ranks_started_by_multiprocessing_and_subprocess_share_the_parents_key(self):
        parent = self._script("parent.py", RANK_BODY, SPAWNED_RANK0, """\
            if __name__ == "__main__":
                first, queue = start_rank0()
                port = queue.get(timeout=60)
                print(port, flush=True)
                second = subprocess.Popen([sys.executable, sys.argv[1], port.split()[1]])
                # One string per line: two processes share this output, and print's separate
                # writes of its arguments could interleave with the other's (seen under load).
                print("rank 0: " + queue.get(timeout=60), flush=True)
                first.join(60)
                second.wait(60)
            """)
        child = self._script("child.py", RANK_BODY, """\
            rank(1, int(sys.argv[1]), lambda line: print("rank 1: " + line, flush=True))
            """)
        process = _start(parent, child)
        output = _finish(process)
        self.assertEqual(process.returncode, 0, output)
        self.assertIn("rank 0: JOINED sum=[3.0, 3.0]", output)
        self.assertIn("rank 1: JOINED sum=[3.0, 3.0]", output)

    def test_a_process_outside_the_parents_tree_is_refused(self):
        parent = self._script("parent.py", RANK_BODY, SPAWNED_RANK0, """\
            if __name__ == "__main__":
                first, queue = start_rank0()
                print(queue.get(timeout=60), flush=True)
                print("rank 0: " + queue.get(timeout=90), flush=True)
                first.join(60)
            """)
        # Rank 1 of the same job, at the same store, as rank 0's sibling would be.
        outsider = self._script("outsider.py", RANK_BODY, """\
            rank(1, int(sys.argv[1]), lambda what: print("outsider: " + what, flush=True))
            """)
        # The outsider is another program of the same user, started apart: without a key it
        # cannot even try; with a key of its own (its own import made it one) it is refused.
        for how in ("no key", "a key of its own"):
            with self.subTest(outsider=how):
                process = _start(parent)
                port = _read_line_starting(process, "PORT").split()[1]
                # Without a key: a launched rank (RANK set), so its import makes none.
                env = _environment(RANK="1") if how == "no key" else _environment()
                intruder = _start(outsider, port, env=env)
                intruder_output = _finish(intruder)
                self.assertIn("outsider: REFUSED", intruder_output)
                self.assertNotIn("JOINED", intruder_output)
                if how == "no key":
                    self.assertIn("no job key", intruder_output)
                    os.killpg(process.pid, signal.SIGTERM)  # rank 0 waits for a rank 1 in vain
                    _finish(process)
                else:
                    # Each side's transport refuses the other's token as soon as they connect,
                    # and says so; neither joins, and each ends at its timeout.
                    output = _finish(process)
                    self.assertIn("rank 0: REFUSED", output)
                    self.assertNotIn("JOINED", output)
                    both = output + intruder_output
                    self.assertIn("refused a connection (wrong_key", both)
                    self.assertIn("refused this process's credentials", both)


if __name__ == "__main__":
    torch_testing.main()
