"""Subgroups (dist.new_group), operations from several Python threads at once, and the Work
objects of asynchronous operations, on the tessera backend."""

import os
import threading
import unittest

import torch
import torch.distributed as dist

import torch_testing


def _subgroups(rank, world):
    """Collectives on subsets of the world, interleaved with the world's own."""
    failures = []

    def expect(what, got, expected):
        if isinstance(expected, torch.Tensor):
            ok = isinstance(got, torch.Tensor) and torch.equal(got, expected)
        else:
            ok = got == expected
        if not ok:
            failures.append(f"rank {rank}: {what}: got {got}, expected {expected}")

    # Every rank creates every group, in the same order (torch requires it).
    subsets = [[0, 2], [1, 2, 3], [4, 0], list(range(world))] if world == 5 else [[0, 2], [1]]
    groups = [dist.new_group(ranks) for ranks in subsets]
    for round_ in range(3):
        for ranks, group in zip(subsets, groups):
            members = sorted(ranks)
            what = f"group {ranks} round {round_}"
            t = torch.full((5,), float(rank + 1 + round_))
            work = dist.all_reduce(t, group=group)
            if rank in ranks:
                expect(f"all_reduce on {what}", t,
                       torch.full((5,), float(sum(q + 1 + round_ for q in members))))
                expect(f"get_rank in {what}", dist.get_rank(group), members.index(rank))
                expect(f"get_world_size of {what}", dist.get_world_size(group), len(members))
            else:
                # torch's NON_GROUP_MEMBER behaviour: nothing happens, the tensor stays.
                expect(f"all_reduce on {what} by a non-member", t,
                       torch.full((5,), float(rank + 1 + round_)))
                expect(f"the non-member's work on {what}", work, None)
                expect(f"get_rank in {what} by a non-member", dist.get_rank(group), -1)
            # The world's, between the subgroups'.
            t = torch.tensor([rank, round_], dtype=torch.int64)
            dist.all_reduce(t)
            expect(f"world all_reduce after {what}", t,
                   torch.tensor([sum(range(world)), round_ * world]))
            if rank not in ranks:
                continue
            root = members[-1]  # src and dst are global ranks
            t = torch.tensor([rank * 10 + round_])
            dist.broadcast(t, src=root, group=group)
            expect(f"broadcast from {root} on {what}", t, torch.tensor([root * 10 + round_]))
            outs = [torch.zeros(2, dtype=torch.int32) for _ in members]
            dist.all_gather(outs, torch.tensor([rank, round_], dtype=torch.int32), group=group)
            expect(f"all_gather on {what}", torch.stack(outs),
                   torch.tensor([[q, round_] for q in members], dtype=torch.int32))
            t = torch.tensor([float(rank)])
            dist.reduce(t, dst=members[0], op=dist.ReduceOp.MAX, group=group)
            if rank == members[0]:
                expect(f"reduce to {members[0]} on {what}", t, torch.tensor([float(root)]))
            out = [None] * len(members) if rank == root else None
            dist.gather_object(("r", rank), out, dst=root, group=group)
            if rank == root:
                expect(f"gather_object on {what}", out, [("r", q) for q in members])
            if len(members) > 1:
                i = members.index(rank)
                nxt, prev = members[(i + 1) % len(members)], members[i - 1]
                dist.send(torch.tensor([rank, round_]), dst=nxt, group=group, tag=round_)
                t = torch.zeros(2, dtype=torch.int64)
                dist.recv(t, src=prev, group=group, tag=round_)
                expect(f"recv from {prev} on {what}", t, torch.tensor([prev, round_]))
            dist.barrier(group=group)
    return failures


def _threads(rank, world):
    """Each of four threads runs its own group's collectives, all at once; the groups are
    created in the same order on every rank."""
    failures = []
    groups = [dist.new_group(list(range(world))) for _ in range(4)]
    lock = threading.Lock()

    def run(index, group):
        try:
            for step in range(40):
                n = 1 + (step * 37 + index * 101) % 3000
                t = torch.full((n,), float(rank + index + step))
                if step % 2:
                    dist.all_reduce(t, group=group)
                else:
                    dist.all_reduce(t, group=group, async_op=True).wait()
                expected = float(sum(q + index + step for q in range(world)))
                if not torch.equal(t, torch.full((n,), expected)):
                    with lock:
                        failures.append(f"rank {rank}: thread {index} step {step}: got "
                                        f"{t[:3].tolist()}, expected {expected}")
                outs = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
                dist.all_gather(outs, torch.tensor([rank, index, step]), group=group)
                if [o.tolist() for o in outs] != [[q, index, step] for q in range(world)]:
                    with lock:
                        failures.append(f"rank {rank}: thread {index} step {step}: all_gather "
                                        f"{[o.tolist() for o in outs]}")
        except Exception as e:  # noqa: BLE001  (reported as a failure)
            with lock:
                failures.append(f"rank {rank}: thread {index}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i, g)) for i, g in enumerate(groups)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        if thread.is_alive():
            failures.append(f"rank {rank}: a thread did not finish within 120 s")
    # Async ops issued on the world from one thread each after the other, waited by others.
    works = []
    for step in range(8):
        t = torch.full((100,), float(step))
        works.append((step, t, dist.all_reduce(t, async_op=True)))
    waited = []
    waiters = [threading.Thread(target=lambda w=w: waited.append(w.wait())) for _, _, w in works]
    for thread in waiters:
        thread.start()
    for thread in waiters:
        thread.join(timeout=60)
    for step, t, _ in works:
        if not torch.equal(t, torch.full((100,), float(step * world))):
            failures.append(f"rank {rank}: async all_reduce {step} from threads: {t[:3]}")
    return failures


def _work_objects(rank, world):
    """async_op=True: Work's wait, is_completed, is_success, get_future, then."""
    failures = []

    def expect(what, ok):
        if not ok:
            failures.append(f"rank {rank}: {what}")

    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    expect("wait() returns True", work.wait() is True)
    expect("is_completed() after wait", work.is_completed())
    expect("is_success() after wait", work.is_success())
    total = float(sum(range(1, world + 1)))
    result = work.get_future().wait()
    expect(f"the future's value is [tensor] (got {result})",
           isinstance(result, list) and len(result) == 1 and torch.equal(result[0], t) and
           torch.equal(t, torch.full((4,), total)))
    expect("result() is the tensors", torch.equal(work.result()[0], t))

    # The future before the work is waited: then() chains on it.
    t = torch.full((1000,), float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1)
    expect("then().then()", torch.equal(doubled.wait(),
                                        torch.full((1000,), float(sum(range(world)) * 2 + 1))))

    # Many outstanding at once, waited in reverse order.
    tensors = [torch.full((257,), float(rank * i)) for i in range(10)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    for work in reversed(works):
        work.wait()
    expect("ten outstanding all_reduces",
           all(torch.equal(x, torch.full((257,), float(sum(range(world)) * i)))
               for i, x in enumerate(tensors)))

    # Other ops' futures carry their outputs.
    outs = [torch.zeros(2) for _ in range(world)]
    work = dist.all_gather(outs, torch.tensor([rank, 1.0]), async_op=True)
    value = work.get_future().wait()
    expect(f"all_gather's future ({value})",
           len(value) == world and all(torch.equal(v, torch.tensor([q, 1.0]))
                                       for q, v in enumerate(value)))
    t = torch.tensor([rank * 3])
    value = dist.broadcast(t, src=world - 1, async_op=True).get_future().wait()
    expect(f"broadcast's future ({value})", torch.equal(value[0], torch.tensor([(world - 1) * 3])))
    work = dist.barrier(async_op=True)
    work.wait()
    expect("barrier's work is_completed", work.is_completed())
    if world > 1:
        t = torch.zeros(3)
        recv = dist.irecv(t, src=(rank - 1) % world, tag=7)
        send = dist.isend(torch.full((3,), float(rank)), dst=(rank + 1) % world, tag=7)
        send.wait()
        value = recv.get_future().wait()
        expect(f"irecv's future ({value})",
               torch.equal(value[0], torch.full((3,), float((rank - 1) % world))))
        expect("irecv's source rank", recv._source_rank() == (rank - 1) % world)
    # A failing op's future holds the error.
    fut = dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG,
                          async_op=True).get_future()
    try:
        fut.wait()
        failures.append(f"rank {rank}: AVG of int64 succeeded")
    except RuntimeError as e:
        expect(f"the failed future's error names the op ({e})", "allreduce" in str(e))
    return failures


def _listening_sockets():
    """This process's listening TCP sockets (their inodes)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    listening.add(fields[9])
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            mine.add(target[8:-1])
    return len(mine)


def _threads_now():
    return len(os.listdir("/proc/self/task"))


def _sixteen_groups(rank, world):
    """16 new_group()s of every rank, each used by an all-reduce: no listening socket and at
    most 2 threads more than before them (issue 50; Gloo adds 3 threads per group)."""
    failures = []
    dist.barrier()  # the world's own op first: its threads are there before the groups
    sockets, threads = _listening_sockets(), _threads_now()
    groups = [dist.new_group(list(range(world))) for _ in range(16)]
    for i, group in enumerate(groups):
        t = torch.full((8,), float(rank + i))
        dist.all_reduce(t, group=group)
        if not torch.equal(t, torch.full((8,), float(sum(q + i for q in range(world))))):
            failures.append(f"rank {rank}: group {i}: {t.tolist()}")
    if _listening_sockets() != sockets:
        failures.append(f"rank {rank}: {_listening_sockets()} listening sockets after 16 "
                        f"groups, {sockets} before")
    if _threads_now() > threads + 2:
        failures.append(f"rank {rank}: {_threads_now()} threads after 16 groups, {threads} "
                        "before")
    return failures


def _everything(rank, world):
    return _subgroups(rank, world) + _work_objects(rank, world) + _threads(rank, world)


class SubgroupsTest(unittest.TestCase):
    def _check(self, world):
        results = torch_testing.run_ranks(_everything, world, timeout_s=120)
        failures = [f for per_rank in results for f in per_rank]
        self.assertEqual(failures, [], "\n".join(failures[:40]))

    def test_world_3(self):
        self._check(3)

    def test_sixteen_groups_share_the_worlds_endpoint(self):
        results = torch_testing.run_ranks(_sixteen_groups, 2, timeout_s=60)
        failures = [f for per_rank in results for f in per_rank]
        self.assertEqual(failures, [], "\n".join(failures))

    @torch_testing.not_under_sanitizer
    def test_world_5(self):
        self._check(5)


if __name__ == "__main__":
    torch_testing.main()
