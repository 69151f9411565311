"""Parameter-server training of PyTorch models with tessera.torch.ParameterServerOptimizer and
ShardedEmbedding, against a real fleet (tessera-launch --servers S --workers 0: a coordinator
and S servers) and real worker processes. Exactness is checked against the same model trained
in one process on the global batch with torch.optim."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import torch

import torch_testing

_RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""),
                         os.environ.get("TEST_WORKSPACE", "tessera"))
_BATCH = 16
_IN, _HIDDEN, _CLASSES = 12, 24, 3


class Fleet:
    """A long-running fleet of `servers` servers on the loopback, for the length of a `with`,
    with `replicas` copies of each key range."""

    def __init__(self, servers, replicas=1):
        self.servers = servers
        self.replicas = replicas

    def __enter__(self):
        binary = os.path.join(_RUNFILES, "tools/tessera-launch")
        self.process = subprocess.Popen(
            [binary, "--servers", str(self.servers), "--workers", "0", "--replicas",
             str(self.replicas)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.server_pids = {}
        self.lines = []
        deadline = time.monotonic() + 30
        self.address = None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "coordinator address tcp://" in line:
                self.address = line.split("tcp://")[1].split()[0]
            if line.startswith("[launch] server ") and " pid=" in line:
                words = line.split()
                self.server_pids[int(words[2])] = int(words[3].split("=")[1])
            if self.address and len(self.server_pids) == self.servers:
                break
        if not self.address or len(self.server_pids) != self.servers:
            self.__exit__(None, None, None)
            raise RuntimeError("the fleet did not start:\n" + "".join(self.lines))
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


def _mlp():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(_IN, _HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(_HIDDEN, _CLASSES))


def _batch(rank, step):
    """Worker `rank`'s batch of update `step`: a teacher-labelled classification set."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(_BATCH, _IN, generator=g)
    teacher = torch.Generator().manual_seed(99)
    w = torch.randn(_IN, _CLASSES, generator=teacher)
    return x, (x @ w).argmax(dim=1)


def _ps(rank, world_size, address, params, *args, **kwargs):
    import tessera.torch

    return tessera.torch.ParameterServerOptimizer(params, *args, coordinator=address, rank=rank,
                                                  world_size=world_size, **kwargs)


def _train_ps(rank, world_size, address, mode, steps, options):
    model = _mlp()
    opt = _ps(rank, world_size, address, model, mode=mode, **options)
    losses = []
    for step in range(1, steps + 1):
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt.close()
    return state, losses


def _ps_sync_run(rank, world_size, address, steps, options, before_step):
    """_train_ps in ps-sync, calling before_step(step) on rank 0 before each step; the final
    parameters."""
    model = _mlp()
    opt = _ps(rank, world_size, address, model, mode="ps-sync", **options)
    for step in range(1, steps + 1):
        if rank == 0:
            before_step(step)
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt.close()
    return state


def _train_ps_sync_killing(rank, world_size, address, steps, options, kill_pid, kill_at):
    """_train_ps in ps-sync, where rank 0 SIGKILLs the process `kill_pid` before step `kill_at`
    (0: nobody)."""
    def before_step(step):
        if kill_pid and step == kill_at:
            os.kill(kill_pid, signal.SIGKILL)
    return _ps_sync_run(rank, world_size, address, steps, options, before_step)


class ReplicationTest(unittest.TestCase):
    _OPTIONS = dict(optimizer="sgd", lr=0.1, momentum=0.9, chunk_elements=100)

    def _undisturbed(self, workers, steps):
        with Fleet(3) as fleet:
            return torch_testing.run_ranks(_train_ps_sync_killing, workers, init=False,
                                           args=(fleet.address, steps, self._OPTIONS, 0, 0))

    def _expect_same(self, results, undisturbed):
        for rank, state in enumerate(results):
            for name in undisturbed[rank]:
                with self.subTest(rank=rank, tensor=name):
                    self.assertTrue(torch.equal(state[name], undisturbed[rank][name]))

    def test_a_killed_server_changes_nothing_with_two_copies_of_each_range(self):
        workers, steps = 3, 12
        undisturbed = self._undisturbed(workers, steps)
        with Fleet(3, replicas=2) as fleet:
            killed = torch_testing.run_ranks(
                _train_ps_sync_killing, workers, init=False,
                args=(fleet.address, steps, self._OPTIONS, fleet.server_pids[1], 6))
            fleet.process.send_signal(signal.SIGINT)
            output, _ = fleet.process.communicate(timeout=30)
        self.assertIn("server 1", output)
        self.assertIn("its key ranges go on with their other replicas", output)
        self._expect_same(killed, undisturbed)

    @torch_testing.not_under_sanitizer
    def test_a_server_joining_in_a_killed_ones_place_restores_the_copies(self):
        # Server 1 killed, a server added in its place (the workers copy ranges 0 and 1 to it),
        # then server 2 killed: range 1's copies are servers 1 (the new one) and 2, so nothing
        # is lost, and every rank ends bitwise as the undisturbed run.
        workers, steps = 3, 14
        undisturbed = self._undisturbed(workers, steps)
        log = os.path.join(tempfile.mkdtemp(), "added.log")
        with Fleet(3, replicas=2) as fleet:
            results = torch_testing.run_ranks(
                _train_ps_sync_rejoining, workers, init=False,
                args=(fleet.address, steps, self._OPTIONS, fleet.server_pids, log))
            fleet.process.send_signal(signal.SIGINT)
            output, _ = fleet.process.communicate(timeout=30)
        self.assertIn("server 1 joined the fleet", output)
        self.assertNotIn("was lost with its replicas", output)
        self._expect_same(results, undisturbed)
        # The added server left with the fleet, and its launcher with it, cleanly.
        deadline = time.monotonic() + 30
        while "have left; done" not in open(log).read() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn("have left; done", open(log).read())


def _train_ps_sync_rejoining(rank, world_size, address, steps, options, pids, log):
    """_train_ps in ps-sync, where rank 0 SIGKILLs server 1 before step 3, starts a server in
    its place (tessera-launch --attach ADDRESS --add-servers 1, its output in `log`) before
    step 5, and SIGKILLs server 2 (range 1's other copy) before step 10, by when the workers
    have copied the joined server its ranges."""
    def before_step(step):
        if step == 3:
            os.kill(pids[1], signal.SIGKILL)
        if step == 5:
            with open(log, "w") as out:  # the launcher outlives this process: a file, no pipe
                subprocess.Popen([os.path.join(_RUNFILES, "tools/tessera-launch"), "--attach",
                                  address, "--add-servers", "1"],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 60
            while "[launch] server 1 pid=" not in open(log).read():
                if time.monotonic() > deadline:
                    raise RuntimeError("the added server did not start:\n" + open(log).read())
                time.sleep(0.05)
            time.sleep(1)  # it heartbeats once it serves; then every worker hears of it
        if step == 10:
            os.kill(pids[2], signal.SIGKILL)
    return _ps_sync_run(rank, world_size, address, steps, options, before_step)


def _accuracy(state):
    model = _mlp()
    model.load_state_dict(state)
    correct = 0
    for step in range(500, 520):
        x, y = _batch(0, step)
        correct += (model(x).argmax(dim=1) == y).sum().item()
    return correct / (20 * _BATCH)


def _relative(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class DenseTest(unittest.TestCase):
    def test_ps_sync_equals_one_process_on_the_global_batch(self):
        workers, steps = 3, 8
        options = dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3,
                       chunk_elements=100)  # the model's 387 floats in 4 chunks on 2 servers
        with Fleet(2) as fleet:
            # Pushed during backward (the default), then all at step().
            results = torch_testing.run_ranks(_train_ps, workers, init=False,
                                              args=(fleet.address, "ps-sync", steps, options))
            at_step = torch_testing.run_ranks(
                _train_ps, workers, init=False,
                args=(fleet.address, "ps-sync", steps, dict(options, overlap=False)))
        for rank in range(workers):
            for name in results[rank][0]:
                self.assertTrue(torch.equal(results[rank][0][name], at_step[rank][0][name]))
        model = _mlp()
        reference = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        for step in range(1, steps + 1):
            batches = [_batch(rank, step) for rank in range(workers)]
            x = torch.cat([b[0] for b in batches])
            y = torch.cat([b[1] for b in batches])
            reference.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            reference.step()
        for rank, (state, _) in enumerate(results):
            for name, value in model.named_parameters():
                with self.subTest(rank=rank, tensor=name):
                    self.assertLessEqual(_relative(state[name], value.detach()), 1e-6)
                    # Every worker holds the servers' values: the same bits.
                    self.assertTrue(torch.equal(state[name], results[0][0][name]))

    @torch_testing.not_under_sanitizer
    def test_ps_async_and_ps_ssp_learn(self):
        options = dict(optimizer="adam", lr=0.01)
        with Fleet(2) as fleet:
            for mode, extra in (("ps-async", {}), ("ps-ssp", {"staleness": 2})):
                results = torch_testing.run_ranks(
                    _train_ps, 2, init=False,
                    args=(fleet.address, mode, 150, dict(options, **extra)))
                for rank, (state, losses) in enumerate(results):
                    with self.subTest(mode=mode, rank=rank):
                        # A linear teacher over 3 classes: chance is 1/3.
                        self.assertGreaterEqual(_accuracy(state), 0.85)
                        self.assertLess(sum(losses[-10:]) / 10, sum(losses[:10]) / 10 / 2)


def _ssp_timeline(rank, world_size, address, staleness, hold_s):
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.05, mode="ps-ssp", staleness=staleness)
    done = {}
    resumed = None
    for step in range(1, staleness + 4):
        if rank == 1 and step == 2:
            time.sleep(hold_s)  # held back after its first step
            resumed = time.time()
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        done[step] = time.time()
    opt.close()
    return done, resumed


class SspTest(unittest.TestCase):
    @torch_testing.not_under_sanitizer
    def test_a_held_back_worker_stops_the_others_at_the_bound(self):
        staleness = 2
        with Fleet(1) as fleet:
            (fast, _), (_, resumed) = torch_testing.run_ranks(
                _ssp_timeline, 2, init=False, args=(fleet.address, staleness, 3.0))
        # The reply to a push of step t waits until the slowest worker pushed t - K: with the
        # other worker at step 1, steps 1..K+1 go through and step K+2 waits for it.
        for step in range(1, staleness + 2):
            self.assertLess(fast[step], resumed, f"step {step} should not wait")
        self.assertGreaterEqual(fast[staleness + 2], resumed, "step K+2 should wait")


class _Ctr(torch.nn.Module):
    """A DLRM-like model: two server-held tables (one a bag), dense features, an MLP."""

    def __init__(self, rows):
        super().__init__()
        import tessera.torch

        torch.manual_seed(3)
        self.users = tessera.torch.ShardedEmbedding(rows, 8)
        self.items = tessera.torch.ShardedEmbeddingBag(rows, 8, mode="sum")
        self.top = torch.nn.Sequential(torch.nn.Linear(16 + 4, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def forward(self, users, items, dense):
        return self.top(torch.cat([self.users(users), self.items(items), dense], 1)).squeeze(1)


def _ctr_batch(rank, step, rows):
    """Zipf-like ids (most traffic on a few rows) and a label that depends on them."""
    g = torch.Generator().manual_seed(5000 * step + rank)
    zipf = lambda n: (torch.rand(n, generator=g) ** 3 * 40).long() * (rows // 40)  # noqa: E731
    users = zipf(_BATCH)
    items = zipf(_BATCH * 3).view(_BATCH, 3)
    dense = torch.randn(_BATCH, 4, generator=g)
    label = (((users // (rows // 40)) % 2 == 0) ^ (dense[:, 0] > 0)).float()
    return users, items, dense, label


def _train_ctr(rank, world_size, address, rows, steps):
    model = _Ctr(rows)
    opt = _ps(rank, world_size, address, model, "adagrad", lr=0.1)
    losses, touched = [], 0
    for step in range(1, steps + 1):
        users, items, dense, label = _ctr_batch(rank, step, rows)
        touched += len(torch.unique(users)) + len(torch.unique(items))
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(users, items, dense), label)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    metrics = opt.metrics_text()
    opt.close()
    return losses, touched, metrics


def _sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


class EmbeddingTest(unittest.TestCase):
    @torch_testing.not_under_sanitizer
    def test_a_huge_table_learns_and_only_touched_rows_travel(self):
        rows = 10 ** 8  # rows exist once touched: the servers hold a few hundred
        steps = 60
        with Fleet(2) as fleet:
            results = torch_testing.run_ranks(_train_ctr, 2, init=False,
                                              args=(fleet.address, rows, steps))
        for rank, (losses, touched, metrics) in enumerate(results):
            with self.subTest(rank=rank):
                self.assertLess(sum(losses[-10:]) / 10, 0.6 * sum(losses[:10]) / 10, losses)
                # Each step pushes the distinct rows it touched (8-byte id + 8 floats each).
                pushed = _sample(metrics, 'tessera_ps_client_bytes_sent_total{op="sparse_push"}')
                self.assertEqual(pushed, touched * (8 + 8 * 4))
                pulled = _sample(metrics,
                                 'tessera_ps_client_bytes_received_total{op="sparse_pull"}')
                self.assertEqual(pulled, touched * 8 * 4)

    def test_sharded_embedding_equals_torch_embedding(self):
        steps, rows = 5, 50
        with Fleet(2) as fleet:
            results = torch_testing.run_ranks(_train_embedding, 2, init=False,
                                              args=(fleet.address, rows, steps))
        initial, final_rows, final_dense = results[0]
        emb = torch.nn.Embedding(rows, 4)
        torch.manual_seed(11)
        head = torch.nn.Linear(4, 1)
        with torch.no_grad():
            emb.weight.copy_(initial)
        opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.5)
        for step in range(1, steps + 1):
            ids = torch.cat([_embedding_ids(rank, step, rows) for rank in range(2)])
            opt.zero_grad()
            torch.nn.functional.mse_loss(head(emb(ids)).squeeze(1), torch.ones(len(ids))).backward()
            opt.step()
        self.assertLessEqual(_relative(final_rows, emb.weight.detach()), 1e-6)
        for name, value in head.named_parameters():
            self.assertLessEqual(_relative(final_dense[name], value.detach()), 1e-6)
        self.assertTrue(torch.equal(results[1][1], final_rows))


def _embedding_ids(rank, step, rows):
    g = torch.Generator().manual_seed(77 * step + rank)
    return torch.randint(0, rows, (_BATCH,), generator=g)


def _train_embedding(rank, world_size, address, rows, steps):
    import tessera.torch

    emb = tessera.torch.ShardedEmbedding(rows, 4)
    torch.manual_seed(11)
    head = torch.nn.Linear(4, 1)
    opt = _ps(rank, world_size, address, head.named_parameters(), "sgd", lr=0.5, embeddings=[emb])
    with torch.no_grad():
        initial = emb(torch.arange(rows))
    for step in range(1, steps + 1):
        ids = _embedding_ids(rank, step, rows)
        opt.zero_grad()
        # The mean over the global batch is the mean of the workers' means (equal batches).
        torch.nn.functional.mse_loss(head(emb(ids)).squeeze(1), torch.ones(len(ids))).backward()
        opt.step()
    with torch.no_grad():
        final = emb(torch.arange(rows))
    dense = {name: p.detach().clone() for name, p in head.named_parameters()}
    opt.close()
    return initial, final, dense


def _train_steps(rank, world_size, address, first, last, directory, save_at, resume):
    """Steps first..last of ps-sync momentum SGD; saves after `save_at`, or resumes first."""
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1, momentum=0.9, chunk_elements=100)
    if resume:
        assert opt.load_checkpoint(directory) == first - 1
    for step in range(first, last + 1):
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == save_at:
            opt.save_checkpoint(directory)
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    opt.close()
    return state


def _two_jobs(rank, world_size, address):
    """Two jobs one after the other from the same processes (as a notebook would). A fleet
    takes the next job's workers once every worker of the running one has left (a worker that
    comes earlier is refused), so each rank waits for the others' close() first."""
    values = []
    for job in range(2):
        model = _mlp()
        opt = _ps(rank, world_size, address, model, "sgd", lr=0.1)
        x, y = _batch(rank, 1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        values.append(model[0].weight.detach().clone())
        opt.close()
        directory = os.environ["TESSERA_TEST_DIR"]
        with open(os.path.join(directory, f"closed.{job}.{rank}"), "w"):
            pass
        deadline = time.monotonic() + 20
        while not all(os.path.exists(os.path.join(directory, f"closed.{job}.{r}"))
                      for r in range(world_size)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: the other ranks did not close job {job}")
            time.sleep(0.01)
    return values


_KEPT = []


def _leave_without_close(rank, world_size, address):
    """Rank 0 exits after one step without close(); rank 1 steps on after it is gone."""
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1, mode="ps-async")
    for step in (1, 2) if rank == 1 else (1,):
        if step == 2:
            time.sleep(2.0)  # rank 0's process has exited meanwhile
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if rank == 1:
        opt.close()
    else:
        _KEPT.append(opt)  # alive until the interpreter exits, as a script's global would be
    return step


class SuccessiveJobsTest(unittest.TestCase):
    @torch_testing.not_under_sanitizer
    def test_a_worker_that_exits_without_close_says_goodbye(self):
        # Otherwise the coordinator takes its exit for a crash and fails the other worker.
        with Fleet(1) as fleet:
            steps = torch_testing.run_ranks(_leave_without_close, 2, init=False,
                                            args=(fleet.address,), timeout_s=30)
        self.assertEqual(steps, [1, 2])

    def test_the_same_processes_run_a_second_job(self):
        with Fleet(1) as fleet, tempfile.TemporaryDirectory() as directory:
            results = torch_testing.run_ranks(_two_jobs, 2, init=False, args=(fleet.address,),
                                              env={"TESSERA_TEST_DIR": directory},
                                              timeout_s=30)
        for rank, (first, second) in enumerate(results):
            with self.subTest(rank=rank):
                # The second job starts afresh from its rank 0's model: the same step, the
                # same values.
                self.assertTrue(torch.equal(first, second))


class CheckpointTest(unittest.TestCase):
    def test_a_resumed_job_continues_bitwise(self):
        with tempfile.TemporaryDirectory() as directory, Fleet(2) as fleet:
            straight = torch_testing.run_ranks(
                _train_steps, 2, init=False,
                args=(fleet.address, 1, 6, directory, 3, False))
            # A new job on the same fleet: rank 0 initialises the servers afresh, then every
            # rank restores step 3 and trains 4..6.
            resumed = torch_testing.run_ranks(
                _train_steps, 2, init=False,
                args=(fleet.address, 4, 6, directory, 0, True))
        for rank in range(2):
            for name in straight[rank]:
                with self.subTest(rank=rank, tensor=name):
                    self.assertTrue(torch.equal(straight[rank][name], resumed[rank][name]))


def _bad_gradient(rank, world_size, address):
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1)
    model[0].weight.data = torch.zeros(3, 3)  # torch itself refuses a .grad of another shape
    try:
        opt.step()
    finally:
        opt.close()


def _two_backward_passes(rank, world_size, address):
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1)
    x, y = _batch(rank, 1)
    try:
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    finally:
        opt.close()


def _bad_row(rank, world_size, address):
    import tessera.torch

    emb = tessera.torch.ShardedEmbedding(1000, 4, name="users")
    head = torch.nn.Linear(4, 1)
    opt = _ps(rank, world_size, address, head.named_parameters(), "sgd", lr=0.1, embeddings=[emb])
    try:
        emb(torch.tensor([5, 1000]))
    finally:
        opt.close()


def _other_model(rank, world_size, address):
    model = _mlp() if rank == 0 else torch.nn.Linear(_IN, _CLASSES)
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1, timeout=20)
    opt.close()


def _slow_training(rank, world_size, address):
    model = _mlp()
    opt = _ps(rank, world_size, address, model, "sgd", lr=0.1, timeout=60)
    with open(os.path.join(os.environ["TESSERA_TEST_DIR"], f"ready.{rank}"), "w"):
        pass
    step = 0
    while True:  # until the fleet fails
        step += 1
        x, y = _batch(rank, step)
        opt.zero_grad()
        try:  # backward pushes chunks as they are ready: the error can come from either
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        except RuntimeError as e:
            return str(e), time.time()
        time.sleep(0.01)


class BadInputTest(unittest.TestCase):
    @torch_testing.not_under_sanitizer
    def test_a_replaced_parameter_names_the_parameter(self):
        with Fleet(1) as fleet:
            failure = torch_testing.run_ranks(_bad_gradient, 1, init=False,
                                              args=(fleet.address,), return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure)
        self.assertIn("ValueError", failure.errors[0])
        self.assertIn("'0.weight'", failure.errors[0])
        self.assertIn("[3, 3]", failure.errors[0])

    @torch_testing.not_under_sanitizer
    def test_two_backward_passes_in_a_step_with_overlap_name_the_way_out(self):
        with Fleet(1) as fleet:
            failure = torch_testing.run_ranks(_two_backward_passes, 1, init=False,
                                              args=(fleet.address,), return_errors=True)
        self.assertIsInstance(failure, torch_testing.RankFailure)
        self.assertIn("got gradients from more than one backward pass in step 1",
                      failure.errors[0])
        self.assertIn("overlap=False", failure.errors[0])

    @torch_testing.not_under_sanitizer
    def test_a_row_outside_the_table_names_the_table_and_the_row(self):
        with Fleet(1) as fleet:
            failure = torch_testing.run_ranks(_bad_row, 1, init=False, args=(fleet.address,),
                                              return_errors=True)
        self.assertIn('embedding table "users": row id 1000 is outside [0, 1000)',
                      failure.errors[0])

    @torch_testing.not_under_sanitizer
    def test_a_worker_with_another_model_is_refused(self):
        with Fleet(1) as fleet:
            failure = torch_testing.run_ranks(_other_model, 2, init=False,
                                              args=(fleet.address,), return_errors=True,
                                              timeout_s=30)
        self.assertIsInstance(failure, torch_testing.RankFailure)
        self.assertIn("worker 1's model differs from rank 0's: parameter 0 is "
                      "\"weight\" [3, 12] on worker 1, \"0.weight\" [24, 12] on rank 0",
                      failure.errors[1])

    def test_a_killed_server_is_named_to_every_worker(self):
        with Fleet(2) as fleet, tempfile.TemporaryDirectory() as directory:
            outcome = {}

            def run():
                outcome["results"] = torch_testing.run_ranks(
                    _slow_training, 2, init=False, args=(fleet.address,),
                    env={"TESSERA_TEST_DIR": directory}, return_errors=True)

            thread = threading.Thread(target=run)
            thread.start()
            deadline = time.monotonic() + 60
            while (time.monotonic() < deadline and not all(
                    os.path.exists(os.path.join(directory, f"ready.{r}")) for r in range(2))):
                time.sleep(0.05)
            time.sleep(0.5)  # a few steps
            killed = time.time()
            os.kill(fleet.server_pids[1], signal.SIGKILL)
            thread.join(timeout=150)
            results = outcome.get("results")
        self.assertIsNotNone(results, "the workers did not finish")
        self.assertNotIsInstance(results, torch_testing.RankFailure)
        for rank, (error, when) in enumerate(results):
            with self.subTest(rank=rank):
                self.assertIn("server 1", error)
                # At once (the coordinator sees the process gone), well within the 10 s
                # heartbeat timeout that is the backstop.
                self.assertLess(when - killed, 5.0)


# A script whose rank 1 fails with an uncaught exception at step 3; rank 0 trains on (ps-sync:
# its step 3 waits for rank 1's push). Prints when it fails and when the error reached it (the
# exception then ends the script as uncaught).
_FAILING_SCRIPT = """
import sys, time, torch
import tessera.torch
rank, address = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(7)
model = torch.nn.Linear(4, 2)
opt = tessera.torch.ParameterServerOptimizer(model, coordinator=address, rank=rank,
                                             world_size=2, mode="ps-sync", lr=0.1)
try:
    for step in range(1, 1000):
        if rank == 1 and step == 3:
            print("failing at", time.time(), flush=True)
            raise RuntimeError("injected failure at step 3")
        opt.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
except Exception:
    print("raised at", time.time(), flush=True)
    raise
print("finished", flush=True)
"""


class FailureTest(unittest.TestCase):
    def test_an_uncaught_exception_reaches_the_other_workers_at_once(self):
        with Fleet(1) as fleet, tempfile.TemporaryDirectory() as directory:
            script = os.path.join(directory, "train.py")
            with open(script, "w") as f:
                f.write(_FAILING_SCRIPT)
            ranks = [subprocess.Popen([sys.executable, script, str(rank), fleet.address],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for rank in range(2)]
            outputs = []
            for process in ranks:
                try:
                    outputs.append(process.communicate(timeout=60)[0])
                except subprocess.TimeoutExpired:
                    process.kill()
                    outputs.append(process.communicate()[0])
        failing, other = outputs[1], outputs[0]
        self.assertIn("RuntimeError: injected failure at step 3", failing)
        self.assertNotEqual(ranks[0].returncode, 0, other)
        self.assertNotIn("finished", other)
        # Rank 0's error names worker 1 and quotes its exception...
        self.assertIn("worker 1", other)
        self.assertIn("it stopped with UNKNOWN: RuntimeError: injected failure at step 3", other)
        # ...within 1 s of the failure (not after a request timeout or the heartbeat timeout; the
        # interpreter's own exit after that is Python's business).
        failed_at = float(failing.split("failing at ")[1].split()[0])
        self.assertIn("raised at ", other)
        raised_at = float(other.split("raised at ")[1].split()[0])
        self.assertLess(raised_at - failed_at, 1.0, other)


if __name__ == "__main__":
    torch_testing.main()
