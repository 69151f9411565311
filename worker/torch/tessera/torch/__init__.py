"""The "tessera" torch.distributed backend.

    import tessera.torch
    torch.distributed.init_process_group("tessera", init_method="env://")

Importing this module registers the backend (as torch-ccl and torch-ucc do); after that every
torch.distributed call on a tessera group runs on Tessera's ring: shared memory between ranks of
one host, TCP links between hosts. It also holds the parameter-server client for any
nn.Module (ParameterServerOptimizer, ShardedEmbedding: tessera/torch/ps.py). See
docs/pytorch.md.
"""

import sys as _sys

import torch.distributed as _dist

from tessera.torch import _C
from tessera.torch import ps as _ps
from tessera.torch.ps import ParameterServerOptimizer, ShardedEmbedding, ShardedEmbeddingBag

__all__ = ["BACKEND", "make_job_key", "metrics_url", "ParameterServerOptimizer",
           "ShardedEmbedding", "ShardedEmbeddingBag"]

# The name to give torch.distributed.init_process_group.
BACKEND = "tessera"


def make_job_key():
    """A job key for the processes this one starts (torch.multiprocessing.spawn, subprocess):
    unless TESSERA_AUTH_KEY_FILE is already set, writes a new key file (mode 0600) in a private
    temporary directory, removed when this process exits, and sets TESSERA_AUTH_KEY_FILE to it,
    which the children inherit. Returns the key file's path. Processes started by others
    (torchrun, mpirun, Slurm) need one shared file instead: `tessera-launch --make-key-file`."""
    import atexit
    import os
    import shutil
    import tempfile
    given = os.environ.get("TESSERA_AUTH_KEY_FILE")
    if given:
        return given
    directory = tempfile.mkdtemp(prefix="tessera-job-key-")
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, "job.key")
    _C.write_key_file(path)
    os.environ["TESSERA_AUTH_KEY_FILE"] = path
    return path


def metrics_url():
    """http://HOST:PORT/metrics where this process serves its Prometheus metrics (when
    TESSERA_METRICS_PORT or TESSERA_COORDINATOR is set), or "" before the first tessera group
    exists or without them."""
    return _C.metrics_url()


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout)


if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, _create)


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
