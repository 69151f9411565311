"""The "tessera" torch.distributed backend.

    import tessera.torch
    torch.distributed.init_process_group("tessera", init_method="env://")

Importing this module registers the backend (as torch-ccl and torch-ucc do); after that every
torch.distributed call on a tessera group runs on Tessera's ring: shared memory between ranks of
one host, TCP links between hosts. It also holds the parameter-server client for any
nn.Module (ParameterServerOptimizer, ShardedEmbedding: tessera/torch/ps.py) and
FullyShardedDataParallel for the CPU (tessera/torch/fsdp/). See docs/pytorch.md.
"""

import os as _os
import sys as _sys

import torch.distributed as _dist

from tessera.torch import _C
from tessera.torch import ps as _ps
from tessera.torch.ps import ParameterServerOptimizer, ShardedEmbedding, ShardedEmbeddingBag
from tessera.torch.fsdp import FullyShardedDataParallel, hybrid_groups
from tessera.torch.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["BACKEND", "make_job_key", "metrics_url", "FullyShardedDataParallel",
           "hybrid_groups", "ParameterServerOptimizer", "ShardedEmbedding",
           "ShardedEmbeddingBag", "DeviceMesh", "init_device_mesh"]

# The name to give torch.distributed.init_process_group.
BACKEND = "tessera"


# Variables by which a launcher (torchrun, OpenMPI, MPICH's PMI, Slurm) tells a process that it
# is one rank of a job it started: such a process shares a key with the other ranks, it never
# makes one.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
                   "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def _is_launched_rank(environ):
    return any(name in environ for name in _RANK_VARIABLES)


def _remove_when_process_exits(directory):
    """Removes `directory` when this process exits, however it exits: at interpreter exit
    (atexit), and otherwise (SIGTERM, SIGKILL, os._exit) by a small watcher that waits for the
    end of a pipe only this process holds (PEP 446: not inherited by the processes it starts;
    a fork()ed child keeps it, and the key then stays until that child ends too)."""
    import atexit
    import os
    import shutil
    import subprocess

    atexit.register(shutil.rmtree, directory, True)
    read_end, write_end = os.pipe()
    try:
        # In a session of its own: a Ctrl-C to this process's group must not end the watcher
        # before this process, whose key it removes.
        subprocess.Popen(["/bin/sh", "-c", 'cat >/dev/null; rm -rf -- "$0"', directory],
                         stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True)
    except OSError:
        os.close(write_end)  # no watcher: atexit alone removes it
        write_end = None
    finally:
        os.close(read_end)
    return write_end  # held open until this process ends


def make_job_key():
    """A job key for the processes this one starts (torch.multiprocessing.spawn,
    multiprocessing, subprocess): unless TESSERA_AUTH_KEY_FILE is already set, writes a new key
    file (mode 0600) in a private temporary directory, removed when this process exits (also
    when a signal ends it), and sets TESSERA_AUTH_KEY_FILE to it, which the children inherit.
    Returns the key file's path. `import tessera.torch` calls it in a process that no launcher
    started (see _RANK_VARIABLES), so programs that spawn their ranks need no change. Processes
    started by others (torchrun, mpirun, srun, by hand) need one shared file instead:
    `tessera-launch --make-key-file PATH`."""
    import os
    import tempfile
    global _key_watch
    given = os.environ.get("TESSERA_AUTH_KEY_FILE")
    if given:
        return given
    directory = tempfile.mkdtemp(prefix="tessera-job-key-")  # mode 0700
    _key_watch = _remove_when_process_exits(directory)
    path = os.path.join(directory, "job.key")
    _C.write_key_file(path)
    os.environ["TESSERA_AUTH_KEY_FILE"] = path
    return path


# The write end of the pipe whose closing (this process's end) removes the key made here.
_key_watch = None


def metrics_url():
    """http://HOST:PORT/metrics where this process serves its Prometheus metrics (when
    TESSERA_METRICS_PORT or TESSERA_COORDINATOR is set), or "" before the first tessera group
    exists or without them."""
    return _C.metrics_url()


def _store_host(store):
    """The host of the TCPStore under torch's prefix stores (a tcp:// or env:// init method),
    or "" (a file store): the rendezvous host whose route decides the address a rank binds
    when MASTER_ADDR is unset (backend_config.h)."""
    while isinstance(store, _dist.PrefixStore):
        store = store.underlying_store
    return store.host if isinstance(store, _dist.TCPStore) else ""


def _create(options, pg_options=None):
    # torch's extended creator API: global_ranks_in_group is empty for the default group, and
    # names a new_group's members, which then share the default group's endpoint.
    return _C.create_process_group(options.store, options.group_rank, options.group_size,
                                   options.timeout, list(options.global_ranks_in_group),
                                   _store_host(options.store))


if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create, extended_api=True)

# A program that starts its own ranks (mp.spawn, as PyTorch's tutorials do) runs unchanged: its
# parent, which no launcher started, makes the job's key for its children. A rank that a
# launcher started never makes one: the other ranks could not know it.
if (not _is_launched_rank(_os.environ) and "TESSERA_AUTH_KEY_FILE" not in _os.environ
        and _os.environ.get("TESSERA_INSECURE") != "1"):
    make_job_key()


def _excepthook(kind, value, traceback, _previous=_sys.excepthook):
    """An uncaught exception ends the script: before Python prints it, the coordinator hears
    it (from every open ParameterServerOptimizer and the process groups' presence) and tells
    the job's other processes at once, as tessera-worker does with its errors. A Ctrl-C is a
    stop, not a failure: it leaves with a plain goodbye at exit."""
    if not issubclass(kind, KeyboardInterrupt):
        error = f"{kind.__name__}: {value}"
        try:
            _ps._fail_all(error)
            _C.leave_fleet_with_error(error)
        except Exception:  # the original error matters more than a failed goodbye
            pass
    _previous(kind, value, traceback)


if getattr(_sys.excepthook, "__module__", None) != __name__:
    _sys.excepthook = _excepthook
