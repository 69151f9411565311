"""torch.distributed's operations on the tessera backend, checked against a reference computed in
Python from every rank's inputs: every op x every dtype x lengths {0, 1, odd, large} x world
sizes {1, 2, 3, 5}.

Every rank can make every rank's input (make_input is deterministic), so each rank checks its
own outputs and returns the list of what differed; the test asserts the lists are empty. One
spawn per world size: the cases loop inside the rank function. Inputs are small integers, so
every float sum and product is exact and results compare exactly.
"""

import datetime
import functools
import re
import unittest

import torch
import torch.distributed as dist

import torch_testing

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LENGTHS = (0, 1, 7, 2**16 + 3)
WORLD_SIZES = (1, 2, 3, 5)
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AVG": dist.ReduceOp.AVG,
}


def make_input(rank, n, dtype, salt=0):
    """Rank `rank`'s `n` elements: small integers (exact float sums and products); int8 and
    uint8 span their whole range, so sums and products wrap."""
    v = torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + salt * 5
    if dtype == torch.bool:
        return v % 3 == 0
    if dtype in (torch.int8, torch.uint8):
        return (v * 37 % 256).to(torch.uint8).to(dtype)
    if dtype in (torch.int32, torch.int64):
        return (v % 2001 - 1000).to(dtype)
    return (v % 5 - 2).to(dtype)


def reference(op, tensors):
    """What op combines `tensors` (one per rank, in rank order) to, as Gloo does: integers wrap,
    bool SUM is logical or and PRODUCT logical and, AVG is the sum divided by the world."""
    if op == "SUM":
        if tensors[0].dtype == torch.bool:
            return functools.reduce(torch.logical_or, tensors)
        return functools.reduce(torch.add, tensors)
    if op == "PRODUCT":
        if tensors[0].dtype == torch.bool:
            return functools.reduce(torch.logical_and, tensors)
        return functools.reduce(torch.mul, tensors)
    if op == "MIN":
        return functools.reduce(torch.minimum, tensors)
    if op == "MAX":
        return functools.reduce(torch.maximum, tensors)
    if op == "AVG":
        return reference("SUM", tensors) / len(tensors)
    raise ValueError(op)


def ops_for(dtype):
    return [name for name in OPS if name != "AVG" or dtype in FLOATS]


class Checker:
    """Collects what differed instead of stopping at the first difference."""

    def __init__(self, rank):
        self.rank = rank
        self.failures = []

    def equal(self, what, got, expected):
        if got.dtype != expected.dtype or got.shape != expected.shape:
            self.failures.append(f"rank {self.rank}: {what}: got {got.dtype}{list(got.shape)}, "
                                 f"expected {expected.dtype}{list(expected.shape)}")
        elif not torch.equal(got, expected):
            diff = (got != expected).nonzero()
            first = diff[0].tolist() if len(diff) else []
            self.failures.append(
                f"rank {self.rank}: {what}: {len(diff)} elements differ, first at {first}: "
                f"got {got[tuple(first)].item() if first else got}, "
                f"expected {expected[tuple(first)].item() if first else expected}")


def _run_cases(rank, world):
    """Every op x dtype x length on this world; the failures."""
    check = Checker(rank)
    others = [q for q in range(world)]
    for dtype in DTYPES:
        for n in LENGTHS:
            large = n > 1000
            case = f"{str(dtype)[6:]} n={n} world={world}"
            inputs = [make_input(q, n, dtype) for q in others]
            mine = inputs[rank]
            # Roots: every rank for small tensors in worlds up to 3, else the first and last
            # (world 5 costs most: five ranks share two cores).
            roots = sorted({0, world - 1}) if large or world > 3 else range(world)

            # all_reduce, every op.
            for name in ops_for(dtype):
                t = mine.clone()
                dist.all_reduce(t, op=OPS[name])
                check.equal(f"all_reduce {name} {case}", t, reference(name, inputs))

            # broadcast from each root.
            for root in roots:
                t = mine.clone()
                dist.broadcast(t, src=root)
                check.equal(f"broadcast root={root} {case}", t, inputs[root])

            # reduce to each root (SUM), and every op to the last root; only the root's checked.
            for root in roots:
                for name in (ops_for(dtype) if root == world - 1 else ["SUM"]):
                    t = mine.clone()
                    dist.reduce(t, dst=root, op=OPS[name])
                    if rank == root:
                        check.equal(f"reduce {name} root={root} {case}", t,
                                    reference(name, inputs))

            # all_gather and all_gather_into_tensor.
            outs = [torch.full((n,), 1, dtype=dtype) for _ in others]
            dist.all_gather(outs, mine)
            for q in others:
                check.equal(f"all_gather [{q}] {case}", outs[q], inputs[q])
            out = torch.zeros(world * n, dtype=dtype)
            dist.all_gather_into_tensor(out, mine)
            check.equal(f"all_gather_into_tensor {case}", out, torch.cat(inputs))
            out = torch.zeros(world, n, dtype=dtype)  # also a [world, n] output, as FSDP uses
            dist._all_gather_base(out, mine)
            check.equal(f"_all_gather_base {case}", out, torch.stack(inputs))

            # reduce_scatter (a list of pieces) and reduce_scatter_tensor: rank q's input for
            # rank p is make_input(q, n, salt=p).
            pieces = [[make_input(q, n, dtype, salt=p) for p in others] for q in others]
            for name in (ops_for(dtype) if not large else ["SUM", "MAX"]):
                out = torch.ones(n, dtype=dtype)
                dist.reduce_scatter(out, [x.clone() for x in pieces[rank]], op=OPS[name])
                check.equal(f"reduce_scatter {name} {case}", out,
                            reference(name, [pieces[q][rank] for q in others]))
                out = torch.ones(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, torch.cat(pieces[rank]), op=OPS[name])
                check.equal(f"reduce_scatter_tensor {name} {case}", out,
                            reference(name, [pieces[q][rank] for q in others]))
            out = torch.ones(n, dtype=dtype)
            dist._reduce_scatter_base(out, torch.cat(pieces[rank]))
            check.equal(f"_reduce_scatter_base {case}", out,
                        reference("SUM", [pieces[q][rank] for q in others]))

            # gather to and scatter from each root.
            for root in roots:
                outs = [torch.ones(n, dtype=dtype) for _ in others] if rank == root else None
                dist.gather(mine.clone(), outs, dst=root)
                if rank == root:
                    for q in others:
                        check.equal(f"gather root={root} [{q}] {case}", outs[q], inputs[q])
                out = torch.ones(n, dtype=dtype)
                dist.scatter(out, [x.clone() for x in pieces[root]] if rank == root else None,
                             src=root)
                check.equal(f"scatter root={root} {case}", out, pieces[root][rank])

            # all_to_all with pieces of uneven sizes: rank q sends rank p size(q, p) elements.
            def size(q, p):
                return 0 if n == 0 else n + (2 * q + p) % 3

            ins = [make_input(rank, size(rank, p), dtype, salt=p) for p in others]
            outs = [torch.ones(size(q, rank), dtype=dtype) for q in others]
            dist.all_to_all(outs, ins)
            for q in others:
                check.equal(f"all_to_all [{q}] {case}", outs[q],
                            make_input(q, size(q, rank), dtype, salt=rank))

            # all_to_all_single, equal splits (a [world * n, 2] tensor) and uneven ones.
            full = [make_input(q, world * n * 2, dtype, salt=7).view(world * n, 2)
                    for q in others]
            out = torch.ones(world * n, 2, dtype=dtype)
            dist.all_to_all_single(out, full[rank])
            check.equal(f"all_to_all_single equal {case}", out,
                        torch.cat([full[q][rank * n:(rank + 1) * n] for q in others]))
            out = torch.ones(sum(size(q, rank) for q in others), dtype=dtype)
            dist.all_to_all_single(out, torch.cat(ins),
                                   output_split_sizes=[size(q, rank) for q in others],
                                   input_split_sizes=[size(rank, p) for p in others])
            check.equal(f"all_to_all_single uneven {case}", out,
                        torch.cat([make_input(q, size(q, rank), dtype, salt=rank)
                                   for q in others]))

            # send / recv around the ring, two tags received in the other order; isend/irecv.
            if world > 1:
                nxt, prev = (rank + 1) % world, (rank - 1) % world
                dist.send(make_input(rank, n, dtype, salt=1), dst=nxt, tag=1)
                dist.send(make_input(rank, n, dtype, salt=2), dst=nxt, tag=2)
                t2, t1 = torch.ones(n, dtype=dtype), torch.ones(n, dtype=dtype)
                dist.recv(t2, src=prev, tag=2)
                dist.recv(t1, src=prev, tag=1)
                check.equal(f"recv tag=1 {case}", t1, make_input(prev, n, dtype, salt=1))
                check.equal(f"recv tag=2 {case}", t2, make_input(prev, n, dtype, salt=2))
                t = torch.ones(n, dtype=dtype)
                works = [dist.irecv(t, src=prev, tag=3),
                         dist.isend(make_input(rank, n, dtype, salt=3), dst=nxt, tag=3)]
                for w in works:
                    w.wait()
                check.equal(f"irecv {case}", t, make_input(prev, n, dtype, salt=3))
    return check.failures


def _non_contiguous(rank, world):
    """Strided and transposed tensors as inputs and outputs."""
    check = Checker(rank)
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        case = f"{str(dtype)[6:]} world={world}"
        inputs = [make_input(q, 6 * 10, dtype).view(6, 10) for q in range(world)]
        # t[:, ::2] and a transposed view, reduced in place.
        base = inputs[rank].clone()
        view = base[:, ::2]
        dist.all_reduce(view)
        expected = inputs[rank].clone()
        expected[:, ::2] = reference("SUM", [x[:, ::2] for x in inputs])
        check.equal(f"all_reduce t[:, ::2] {case}", base, expected)
        t = inputs[rank].clone().t()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        check.equal(f"all_reduce t.t() {case}", t, reference("MAX", inputs).t())
        t = inputs[rank].clone().t()
        dist.broadcast(t, src=world - 1)
        check.equal(f"broadcast t.t() {case}", t, inputs[world - 1].t())
        # all_gather into strided outputs.
        outs = [torch.ones(5, 12, dtype=dtype)[:, ::2].t() for _ in range(world)]  # [6, 5]
        dist.all_gather(outs, inputs[rank][:, ::2])
        for q in range(world):
            check.equal(f"all_gather strided [{q}] {case}", outs[q], inputs[q][:, ::2])
        out = torch.ones(world * 6, 10, dtype=dtype).t()  # [10, world*6] transposed
        dist.all_gather_into_tensor(out.t(), inputs[rank])
        check.equal(f"all_gather_into_tensor transposed {case}", out.t(), torch.cat(inputs))
        # reduce_scatter into a strided output.
        pieces = [[make_input(q, 5, dtype, salt=p) for p in range(world)] for q in range(world)]
        out = torch.ones(10, dtype=dtype)[::2]
        dist.reduce_scatter(out, [p.clone() for p in pieces[rank]])
        check.equal(f"reduce_scatter strided {case}", out,
                    reference("SUM", [pieces[q][rank] for q in range(world)]))
        out = torch.ones(10, dtype=dtype)[::2]
        dist.reduce_scatter_tensor(out, torch.cat(pieces[rank]))
        check.equal(f"reduce_scatter_tensor strided {case}", out,
                    reference("SUM", [pieces[q][rank] for q in range(world)]))
        # gather, scatter, reduce with strided tensors.
        outs = [torch.ones(10, dtype=dtype)[::2] for _ in range(world)] if rank == 0 else None
        dist.gather(inputs[rank][0, ::2], outs, dst=0)
        if rank == 0:
            for q in range(world):
                check.equal(f"gather strided [{q}] {case}", outs[q], inputs[q][0, ::2])
        out = torch.ones(10, dtype=dtype)[::2]
        dist.scatter(out, [p[::1] for p in pieces[0]] if rank == 0 else None, src=0)
        check.equal(f"scatter strided {case}", out, pieces[0][rank])
        t = inputs[rank].clone().t()
        dist.reduce(t, dst=0)
        if rank == 0:
            check.equal(f"reduce t.t() {case}", t, reference("SUM", inputs).t())
        # all_to_all_single on transposed input, all_to_all with strided pieces.
        full = [make_input(q, world * 2 * 3, dtype).view(3, world * 2).t() for q in range(world)]
        out = torch.ones(3, world * 2, dtype=dtype).t()
        dist.all_to_all_single(out, full[rank])
        check.equal(f"all_to_all_single transposed {case}", out,
                    torch.cat([full[q][rank * 2:(rank + 1) * 2] for q in range(world)]))
        ins = [make_input(rank, 8, dtype, salt=p)[::2] for p in range(world)]
        outs = [torch.ones(8, dtype=dtype)[::2] for _ in range(world)]
        dist.all_to_all(outs, ins)
        for q in range(world):
            check.equal(f"all_to_all strided [{q}] {case}", outs[q],
                        make_input(q, 8, dtype, salt=rank)[::2])
        # send / recv of strided tensors.
        if world > 1:
            nxt, prev = (rank + 1) % world, (rank - 1) % world
            dist.send(inputs[rank].t(), dst=nxt)
            t = torch.ones(6, 10, dtype=dtype).t()
            dist.recv(t, src=prev)
            check.equal(f"recv transposed {case}", t, inputs[prev].t())
    return check.failures


def _objects_barriers_and_errors(rank, world):
    """The object collectives, barriers, recv from any source, and a tensor on "meta"."""
    failures = []

    def expect(what, got, expected):
        if got != expected:
            failures.append(f"rank {rank}: {what}: got {got!r}, expected {expected!r}")

    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "data": list(range(rank))})
    expect("all_gather_object", objs, [{"rank": q, "data": list(range(q))} for q in range(world)])
    for root in range(world):
        objs = [f"from {rank}", rank * 1.5, None] if rank == root else [None, None, None]
        dist.broadcast_object_list(objs, src=root)
        expect(f"broadcast_object_list root={root}", objs, [f"from {root}", root * 1.5, None])
        out = [None] * world if rank == root else None
        dist.gather_object(("g", rank), out, dst=root)
        if rank == root:
            expect(f"gather_object root={root}", out, [("g", q) for q in range(world)])
        out = [None]
        dist.scatter_object_list(out, [{"to": q, "pad": "x" * q * 100} for q in range(world)]
                                 if rank == root else None, src=root)
        expect(f"scatter_object_list root={root}", out, [{"to": rank, "pad": "x" * rank * 100}])

    dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait()
    # monitored_barrier: torch.distributed's function only lets Gloo in, so the group's own.
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=False)

    # recv from any source: every rank sends rank 0 its number, twice (two tags).
    if rank != 0:
        dist.send(torch.tensor([rank, rank * 10]), dst=0, tag=4)
        dist.send(torch.tensor([rank, rank * 20]), dst=0, tag=9)
    else:
        for tag, factor in ((9, 20), (4, 10)):
            seen = []
            for _ in range(world - 1):
                t = torch.zeros(2, dtype=torch.int64)
                src = dist.recv(t, tag=tag)
                expect(f"recv any source tag={tag} from {src}", t.tolist(), [src, src * factor])
                seen.append(src)
            expect(f"recv any source tag={tag}: the sources", sorted(seen),
                   list(range(1, world)))
        if world > 1:
            t = torch.zeros(2, dtype=torch.int64)
            work = dist.irecv(t)  # src=None: recv_anysource
            dist.barrier()  # no one has sent yet: rank 1 sends after the barrier
            work.wait()
            expect("irecv any source", (work._source_rank(), t.tolist()), (1, [1, 99]))
    if rank == 1:
        dist.barrier()
        dist.send(torch.tensor([1, 99]), dst=0)
    elif rank != 0:
        dist.barrier()

    # A tensor on "meta" (no data): a RuntimeError that says so, and the group still works.
    for call in (lambda t: dist.all_reduce(t), lambda t: dist.broadcast(t, 0),
                 lambda t: dist.send(t, dst=(rank + 1) % world) if world > 1 else
                 dist.all_reduce(t)):
        try:
            call(torch.empty(3, device="meta"))
            failures.append(f"rank {rank}: a meta tensor was accepted")
        except RuntimeError as e:
            if "meta" not in str(e).lower():
                failures.append(f"rank {rank}: the meta tensor's error does not say meta: {e}")
    # Unsupported op (AVG of integers): every rank gets a RuntimeError; the group still works.
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)
        failures.append(f"rank {rank}: AVG of int32 was accepted")
    except RuntimeError as e:
        if "int32" not in str(e) or "average" not in str(e).lower():
            failures.append(f"rank {rank}: AVG of int32's error: {e}")
    t = torch.ones(3)
    dist.all_reduce(t)
    expect("all_reduce after the errors", t.tolist(), [float(world)] * 3)
    return failures


def _coalesced_timeouts_and_teardown(rank, world):
    """all_gather_coalesced; a barrier that times out says "Timed out" as torch's backends do
    (scripts and torch's tests match it); a group destroyed with ops still queued, whose
    tensors only those ops still hold, goes away without a hang."""
    failures = []
    inputs = [make_input(rank, 5, torch.float32), make_input(rank, 6, torch.float32).view(2, 3)]
    outputs = [[torch.empty(5), torch.empty(2, 3)] for _ in range(world)]
    dist.all_gather_coalesced(outputs, inputs)
    for q in range(world):
        expected = [make_input(q, 5, torch.float32), make_input(q, 6, torch.float32).view(2, 3)]
        for got, want in zip(outputs[q], expected):
            if not torch.equal(got, want):
                failures.append(f"rank {rank}: all_gather_coalesced from rank {q}: {got} != {want}")

    if world > 1:
        short = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=1))
        if rank == 0:  # alone in the barrier
            try:
                dist.barrier(group=short)
                failures.append("rank 0: a barrier no other rank joined passed")
            except RuntimeError as e:
                if not re.search(" (Timed out|closed|timeout) ", str(e)):
                    failures.append(f"rank 0: the barrier's timeout error: {e}")
        dist.destroy_process_group(short)
        dist.barrier()

    group = dist.new_group(list(range(world)))
    for _ in range(8):
        dist.all_reduce(torch.ones(1 << 16), group=group, async_op=True)  # nothing kept
    dist.destroy_process_group(group)
    del group
    dist.barrier()
    return failures


def _everything(rank, world):
    return (_run_cases(rank, world) + _non_contiguous(rank, world) +
            _objects_barriers_and_errors(rank, world) +
            _coalesced_timeouts_and_teardown(rank, world))


class CollectivesTest(unittest.TestCase):
    def _check(self, world):
        results = torch_testing.run_ranks(_everything, world, timeout_s=120)
        failures = [f for per_rank in results for f in per_rank]
        self.assertEqual(failures, [], "\n".join(failures[:40]))

    def test_world_1(self):
        self._check(1)

    def test_world_2(self):
        self._check(2)

    def test_world_3(self):
        self._check(3)

    @torch_testing.not_under_sanitizer
    def test_world_5(self):
        self._check(5)


if __name__ == "__main__":
    torch_testing.main()
