"""The PyTorch DDP tutorial's programs in examples/torch/ run on the tessera backend as a user
runs them: ddp_tutorial.py on its own (torch.multiprocessing.spawn) and ddp_torchrun.py under
torchrun, each a subprocess that must exit 0 and print its result.

Neither uses a fixed port: ddp_tutorial.py picks a free one for MASTER_PORT, and torchrun is
given `--rdzv_backend c10d --rdzv_endpoint localhost:0` (in torch 1.13 `--standalone` means
localhost:29400, which two runs at once would share). The environment passes through: under
Bazel it puts the `tessera` package just built on PYTHONPATH (run_python.sh).
"""

import os
import signal
import subprocess
import sys
import tempfile
import unittest

import torch

import torch_testing

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "torch")
TIMEOUT_S = 90


def _run(args, without_key=False):
    """Runs /usr/bin/python3 with `args` in a session of its own (so a hang kills every rank it
    started); returns (exit code, output). `without_key`: no TESSERA_AUTH_KEY_FILE in its
    environment, as a user's shell has none."""
    env = dict(os.environ)
    if without_key:
        env.pop("TESSERA_AUTH_KEY_FILE", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"  # what was printed survives a kill
    env.pop("MASTER_PORT", None)
    env.pop("MASTER_ADDR", None)
    process = subprocess.Popen(["/usr/bin/python3"] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n[tutorial_test: killed after {TIMEOUT_S} s]"
    sys.stdout.write(output)  # into the test's log
    return process.returncode, output


class TutorialTest(unittest.TestCase):
    def test_ddp_tutorial_with_mp_spawn(self):
        """Unmodified but for the backend's name, with no key given: `import tessera.torch` in
        the parent makes the one its spawned ranks share. The parameters it trains are Gloo's,
        bit for bit."""
        with tempfile.TemporaryDirectory() as scratch:
            tessera_params = os.path.join(scratch, "tessera.pt")
            gloo_params = os.path.join(scratch, "gloo.pt")
            code, output = _run([os.path.join(EXAMPLES, "ddp_tutorial.py"), "--world-size", "2",
                                 "--save-params", tessera_params], without_key=True)
            self.assertEqual(code, 0, output)
            gloo_code, gloo_output = _run([os.path.join(EXAMPLES, "ddp_tutorial.py"),
                                           "--world-size", "2", "--backend", "gloo",
                                           "--save-params", gloo_params], without_key=True)
            self.assertEqual(gloo_code, 0, gloo_output)
            tessera_state = torch.load(tessera_params)
            gloo_state = torch.load(gloo_params)
        self.assertEqual(sorted(tessera_state), sorted(gloo_state))
        for name, value in gloo_state.items():
            self.assertTrue(torch.equal(tessera_state[name], value),
                            f"{name} differs from Gloo's: {tessera_state[name]} vs {value}")
        for rank in (0, 1):
            self.assertIn(f"Running basic DDP example on rank {rank}.", output)
            self.assertIn(f"Running DDP checkpoint example on rank {rank}.", output)
        self.assertRegex(output, r"demo_basic: 2 ranks trained ToyModel on 64 samples \(32 per "
                                 r"rank per epoch\); mean loss by epoch: [0-9.]+ -> [0-9.]+ -> ")
        self.assertIn("demo_basic: parameters identical on every rank: True", output)
        self.assertIn("demo_checkpoint: rank 0 saved the model, 2 ranks loaded it after a "
                      "barrier; identical after loading: True, after a step: True", output)
        self.assertIn("ddp_tutorial: both demos passed on the tessera backend with 2 ranks",
                      output)

    def test_ddp_torchrun(self):
        code, output = _run(["-m", "torch.distributed.run", "--rdzv_backend", "c10d",
                             "--rdzv_endpoint", "localhost:0", "--nnodes", "1",
                             "--nproc_per_node", "2", "--redirects", "2", "--tee", "1",
                             os.path.join(EXAMPLES, "ddp_torchrun.py")])
        self.assertEqual(code, 0, output)
        for rank in (0, 1):
            self.assertIn(f"Start running basic DDP example on rank {rank} (local rank {rank} "
                          "of 2, world size 2).", output)
            self.assertIn(f"Finished running basic DDP example on rank {rank}.", output)
        self.assertRegex(output, r"ddp_torchrun: 2 ranks trained ToyModel on 64 samples")
        self.assertIn("ddp_torchrun: parameters identical on every rank: True", output)


if __name__ == "__main__":
    torch_testing.main()
