"""How the ranks of a pipeline learn which stage failed, while they wait for one another.

A rank of a pipeline waits for one neighbour at a time (a receive). Left alone, a stage that
fails is seen by its neighbours only at their receive's deadline, and ranks further away blame
the neighbour they wait for, which is itself waiting. So the ranks of one schedule share three
things (FailureWatch):

  notices   a rank whose step fails writes why into the job's store (torch's default store,
            under keys of its pipeline group and schedule): "error" (its own exception),
            "exited" (it found the process of the stage it waited for gone) or "timeout" (its
            receive's deadline passed). Numbered by a counter in the store, read without
            blocking.
  liveness  each rank writes who it is (host, pid namespace, pid, process start time). A rank
            waiting for a stage whose process runs on its own host checks that the process is
            still there: a killed stage is seen at once, not at the deadline.
  slices    a receive is waited for in slices of SLICE_S (a receive that completes in time
            costs nothing more); between slices the waiting rank reads the notices and the
            liveness of the rank it waits for. The receive's own deadline, the process group's
            timeout, ends the wait.

Which stage is to blame: a stage's own exception, or a process found gone, at once; after a
"timeout" notice or the rank's own deadline, a grace of GRACE_S lets the ranks waiting further
down the chain write theirs (their deadlines pass at about the same time), then the chain of
"stage a waited for stage b" is followed to a stage that wrote nothing: hung, or dead on
another host.

Keys are per schedule: the n-th schedule this process builds on a group is the n-th of every
rank of the group (ranks build their schedules in the same order, as their messages assume).
Notices are best effort: a store that fails leaves the receive's own deadline and error.
"""

import datetime
import json
import os
import socket
import time

import torch.distributed as dist

__all__ = ["FailureWatch", "PipelineFailure"]

SLICE_S = 0.1
GRACE_S = 2.0
_ABSENT = b"\x00absent"  # compare_set's answer for a key that is not set: a read that never waits
_SCHEDULES = {}  # group's global ranks -> schedules built on it by this process


class PipelineFailure(RuntimeError):
    """Another stage of the pipeline failed, or did not answer within the group's timeout; the
    message names it (stage and rank), what this rank waited for and for how long."""


def _process():
    """Who this process is, for a peer on the same host to check that it still runs."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: no liveness checks
        return None
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": boot, "pidns": namespace, "pid": pid,
            "start": _start_time(pid)}


def _start_time(pid):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), and
    whether it is a zombie; None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (the state); field 22 is fields[19].
    return None if fields[0] in ("Z", "X") else fields[19]


class FailureWatch:
    """The notices and liveness checks of one schedule's ranks (see the module's docstring).
    `group` is the pipeline's process group (None: the world); `who(stage)` says "stage s
    (rank r)". From the schedule's thread only."""

    def __init__(self, group, who, stages):
        self._who = who
        self._stages = set(stages)  # this rank's
        self._group = group
        try:
            self._store = dist.distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001  (no store: receives keep their own deadlines)
            self._store = None
        ranks = tuple(range(dist.get_world_size()) if group is None
                      else dist.get_process_group_ranks(group))
        _SCHEDULES[ranks] = _SCHEDULES.get(ranks, 0) + 1
        self._prefix = (f"tessera.pipelining/{','.join(map(str, ranks))}/"
                        f"{_SCHEDULES[ranks]}/")
        self._seen = {}  # ticket -> notice
        self._peers = {}  # global rank -> its process, once read
        self._me = _process()
        self._store_call(lambda s: s.set(f"tessera.pipelining/process/{dist.get_rank()}",
                                          json.dumps(self._me)))

    def _read(self, key):
        """The value of `key` (bytes), or None when it is not set: compare_set with a value no
        key holds answers without waiting and writes nothing (a FileStore appends every add,
        even of 0, to its file: polling must not)."""
        value = self._store_call(lambda s: s.compare_set(key, _ABSENT, _ABSENT))
        return None if value is None or value == _ABSENT else value

    def _store_call(self, call):
        if self._store is None:
            return None
        try:
            return call(self._store)
        except Exception:  # noqa: BLE001  (best effort, see the module's docstring)
            return None

    # ---- notices

    def tell(self, kind, stage, text, blames=None):
        """Writes this rank's notice: `kind` "error", "exited" or "timeout"; `blames` the stage
        it waited for (for the last two)."""
        notice = json.dumps({"kind": kind, "stage": stage, "rank": dist.get_rank(),
                             "blames": blames, "text": text})

        def write(store):
            ticket = store.add(self._prefix + "tickets", 1)
            store.set(self._prefix + f"notice/{ticket}", notice)
        self._store_call(write)

    def notices(self):
        """Every notice written so far (in the order of their tickets)."""
        count = self._read(self._prefix + "tickets")
        for ticket in range(1, int(count) + 1 if count else 1):
            if ticket not in self._seen:
                value = self._read(self._prefix + f"notice/{ticket}")
                if value is not None:  # else its writer is between add and set
                    self._seen[ticket] = json.loads(value.decode())
        return [self._seen[t] for t in sorted(self._seen)]

    @staticmethod
    def _decisive(notices):
        """The notice that names the cause at once: a stage's own error or a process gone."""
        for kind in ("error", "exited"):
            for notice in notices:
                if notice["kind"] == kind:
                    return notice
        return None

    def _blame(self, notices, waited_for):
        """After the grace: the cause, as text. Follows "stage a waited for stage b" from
        `waited_for` (or from the first timeout notice) to a stage that wrote nothing."""
        decisive = self._decisive(notices)
        if decisive is not None:
            return decisive["text"]
        timeouts = {n["stage"]: n for n in notices if n["kind"] == "timeout"}
        if waited_for is None:
            if not timeouts:
                return None
            waited_for = next(iter(timeouts.values()))["blames"]
        chain, stage = [], waited_for
        while stage in timeouts and stage not in chain:
            chain.append(stage)
            stage = timeouts[stage]["blames"]
        if not chain:
            return None
        return timeouts[chain[-1]]["text"]

    # ---- liveness

    def exited(self, global_rank):
        """How the process of `global_rank` is gone, when it ran on this host and is gone;
        else ""."""
        if self._me is None:
            return ""
        peer = self._peers.get(global_rank)
        if peer is None:
            value = self._read(f"tessera.pipelining/process/{global_rank}")
            if value is None:
                return ""
            peer = self._peers[global_rank] = json.loads(value.decode())
        if not peer or any(peer[k] != self._me[k] for k in ("host", "boot", "pidns")):
            return ""
        if _start_time(peer["pid"]) == peer["start"]:
            return ""
        return f"its process (pid {peer['pid']} on this host) has exited"

    # ---- waiting

    def wait(self, work, stage, peer_stage, peer_rank, what):
        """Waits for the receive `work` of `what` (e.g. "the gradient of micro-batch 3") from
        `peer_stage` (global rank `peer_rank`) for stage `stage` of this rank. Raises
        PipelineFailure naming the stage to blame when another rank says one failed, when the
        peer's process is gone, or when the receive's deadline passed."""
        started = time.monotonic()
        grace_until = None
        first_slice = True
        while True:
            try:
                work.wait(datetime.timedelta(seconds=SLICE_S))
                return
            except RuntimeError:
                if work.is_completed():  # done since, or failed: waiting again tells which
                    try:
                        work.wait()
                        return
                    except RuntimeError as e:  # its deadline (the group's timeout), or else
                        self._timed_out(e, started, stage, peer_stage, peer_rank, what)
            waited = time.monotonic() - started
            notices = self.notices()
            decisive = self._decisive(notices)
            if decisive is not None:
                raise PipelineFailure(
                    f"tessera.torch.pipelining: {self._who(stage)}, waiting {waited:.1f} s for "
                    f"{what} from {self._who(peer_stage)}: {decisive['text']}")
            # Given up on before this wait: this rank was the stuck one, and is back too late.
            # (A notice that comes while it waits is another rank's deadline passing first on
            # the way to the stage this one waits for, which the grace below sorts out.)
            given_up = [n for n in notices
                        if n["kind"] == "timeout" and n["blames"] in self._stages]
            if first_slice and given_up:
                raise PipelineFailure(
                    f"tessera.torch.pipelining: {self._who(stage)} is too late: the other ranks "
                    f"gave up waiting for it: {given_up[0]['text']}")
            first_slice = False
            gone = self.exited(peer_rank)
            if gone:
                text = (f"{self._who(peer_stage)} is dead: {gone} (seen by {self._who(stage)} "
                        f"after waiting {waited:.1f} s for {what} from it)")
                self.tell("exited", stage, text, blames=peer_stage)
                raise PipelineFailure(f"tessera.torch.pipelining: {text}")
            if grace_until is None and any(n["kind"] == "timeout" for n in notices):
                grace_until = time.monotonic() + GRACE_S
            cause = None
            if grace_until is not None and time.monotonic() >= grace_until:
                cause = self._blame(notices, None)
            if cause is not None:
                raise PipelineFailure(
                    f"tessera.torch.pipelining: {self._who(stage)}, waiting {waited:.1f} s for "
                    f"{what} from {self._who(peer_stage)}: {cause}")

    def _state(self, peer_rank):
        """What is known of a stage that sent nothing."""
        gone = self.exited(peer_rank)
        if gone:
            return f"it is dead: {gone}"
        peer = self._peers.get(peer_rank)
        if peer and self._me and all(peer[k] == self._me[k] for k in ("host", "boot", "pidns")):
            return f"its process (pid {peer['pid']} on this host) is alive: it is stuck"
        return "it is stuck, or dead on another host"

    def _timed_out(self, error, started, stage, peer_stage, peer_rank, what):
        """The receive ended with `error`: says so in a notice, reads the others' for the
        grace, and raises naming the stage to blame."""
        waited = time.monotonic() - started
        text = str(error)
        deadline = "timed out" in text.lower() or "deadline" in text.lower()
        own = (f"{self._who(stage)} waited {waited:.1f} s (the process group's timeout) for "
               f"{what} from {self._who(peer_stage)}, which sent nothing" if deadline else
               f"{self._who(stage)} failed receiving {what} from {self._who(peer_stage)} "
               f"after {waited:.1f} s")
        if not deadline:  # the backend's own words (sizes that differ, ...): the cause
            own = f"{own}: {text}"
            self.tell("error", stage, own)
            raise PipelineFailure(f"tessera.torch.pipelining: {own}") from error
        # Others quote this notice when its stage sent nothing to anyone: then what this rank
        # knows of it matters.
        state = f": {self._state(peer_rank)}"
        self.tell("timeout", stage, own + state, blames=peer_stage)
        grace_until = time.monotonic() + GRACE_S
        while True:
            notices = self.notices()
            decisive = self._decisive(notices)
            if decisive is not None:
                cause = decisive["text"]
                break
            if time.monotonic() >= grace_until:
                # Waited for a stage that is itself waiting: its notice came within the grace.
                cause = self._blame(notices, peer_stage)
                break
            time.sleep(SLICE_S)
        if cause is None:
            raise PipelineFailure(f"tessera.torch.pipelining: {own}{state} ({text})") from error
        raise PipelineFailure(f"tessera.torch.pipelining: {own}; the cause: {cause}") from error
