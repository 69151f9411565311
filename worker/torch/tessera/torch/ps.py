"""Parameter-server training for any torch.nn.Module, on a running Tessera fleet.

    fleet:   tessera-launch --servers 2 --workers 0 --coordinator 127.0.0.1:29500
    workers: RANK=r WORLD_SIZE=w TESSERA_COORDINATOR=127.0.0.1:29500 /usr/bin/python3 train.py

    import tessera.torch
    model = Net()                                    # may hold ShardedEmbedding tables
    opt = tessera.torch.ParameterServerOptimizer(model, optimizer="sgd", lr=0.1,
                                                 momentum=0.9, mode="ps-sync")
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

The servers hold the parameters and the optimizer state and apply the optimizer (the same code
as tessera-worker's ps-* modes); each step a worker pushes its gradients and pulls the values
after the step, which land in the parameters' storage (param.data), so the model computes on
them at once. Rank 0 initialises the servers from its model; every rank starts from those
values. ShardedEmbedding rows live on the servers only: a batch pulls the rows it touches and
pushes their gradients. See docs/pytorch.md, "Parameter-server training".
"""

import atexit
import os
import weakref

import torch

from tessera.torch import _C

__all__ = ["ParameterServerOptimizer", "ShardedEmbedding", "ShardedEmbeddingBag"]

_MODES = ("ps-sync", "ps-async", "ps-ssp")
# Optimizers not closed yet: at interpreter exit they leave the fleet cleanly (a goodbye), so
# the coordinator does not take the exit for a crash and fail the job's other workers.
_OPEN = weakref.WeakSet()
_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adagrad")


def _env_int(name):
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"tessera: {name}={value!r} is not an integer") from None


def _whoami(rank, world_size):
    """This process's rank and the job's size: the arguments, else torch.distributed's group,
    else RANK and WORLD_SIZE (torchrun's), else a job of one."""
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else _env_int("RANK")
    if world_size is None:
        world_size = dist.get_world_size() if initialized else _env_int("WORLD_SIZE")
    if rank is None and world_size is None:
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError("tessera: give both rank and world_size (or set both RANK and "
                         "WORLD_SIZE), not only one")
    return rank, world_size


class _Embedding(torch.nn.Module):
    """What ShardedEmbedding and ShardedEmbeddingBag share: the table's place on the servers
    and the row gradients of the step being computed."""

    def __init__(self, num_embeddings, embedding_dim, name, seed):
        super().__init__()
        if not isinstance(num_embeddings, int) or num_embeddings <= 0:
            raise ValueError(f"tessera: num_embeddings={num_embeddings!r} must be a positive int")
        if not isinstance(embedding_dim, int) or embedding_dim <= 0:
            raise ValueError(f"tessera: embedding_dim={embedding_dim!r} must be a positive int")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.table_name = name
        self.seed = seed
        self._client = None
        self._index = None
        self._pending = []  # (distinct ids, their gradient rows) of this step's backward passes

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, table={self.table_name!r}"

    def _bind(self, client, index, name):
        if self._client is not None:
            raise RuntimeError(f"tessera: embedding table {self.table_name!r} already belongs to "
                               "a ParameterServerOptimizer")
        self._client, self._index, self.table_name = client, index, name

    def _rows(self, ids):
        """The distinct ids of `ids` (flattened), their rows from the servers (a leaf that
        collects its gradient for the next step) and each id's position among them."""
        if self._client is None:
            raise RuntimeError(f"tessera: embedding table {self.table_name or ''!r} is not "
                               "attached to a ParameterServerOptimizer yet: create the optimizer "
                               "with the model (or embeddings=[...]) before the first forward")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tessera: embedding table {self.table_name!r}: ids must be int64 or "
                            f"int32, not {ids.dtype}")
        if ids.device.type != "cpu":
            raise TypeError(f"tessera: embedding table {self.table_name!r}: ids must be on the "
                            f"CPU, not {ids.device}")
        distinct, positions = torch.unique(ids.reshape(-1).to(torch.int64), sorted=True,
                                           return_inverse=True)
        rows = self._client.lookup_rows(self._index, distinct)
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            rows.register_hook(lambda grad: self._pending.append((distinct, grad)))
        return rows, positions

    def _take_gradients(self):
        """This step's row gradients: distinct ids and the sum of their gradient rows."""
        pending, self._pending = self._pending, []
        if not pending:
            return (torch.empty(0, dtype=torch.int64),
                    torch.empty(0, self.embedding_dim, dtype=torch.float32))
        if len(pending) == 1:
            ids, grads = pending[0]
            return ids, grads.to(torch.float32).contiguous()
        ids = torch.cat([i for i, _ in pending])
        grads = torch.cat([g for _, g in pending]).to(torch.float32)
        distinct, positions = torch.unique(ids, sorted=True, return_inverse=True)
        summed = torch.zeros(len(distinct), self.embedding_dim, dtype=torch.float32)
        summed.index_add_(0, positions, grads)
        return distinct, summed

    def _drop_gradients(self):
        self._pending = []


class ShardedEmbedding(_Embedding):
    """torch.nn.Embedding whose rows live on the parameter servers, hashed across them and
    created on first touch (uniform in +-1/sqrt(dim), from `seed` (default: the table's index)
    and the row id), so a table
    may be far larger than a worker's memory. forward(ids) pulls only the distinct rows of the
    batch; backward keeps their gradients, which the ParameterServerOptimizer's step pushes as
    sparse rows for the servers' row-wise optimizer. `name` defaults to the module's path in
    the model given to the optimizer."""

    def __init__(self, num_embeddings, embedding_dim, *, name=None, seed=None):
        super().__init__(num_embeddings, embedding_dim, name, seed)

    def forward(self, ids):
        rows, positions = self._rows(ids)
        return rows[positions].view(*ids.shape, self.embedding_dim)


class ShardedEmbeddingBag(_Embedding):
    """torch.nn.EmbeddingBag (mode "sum" or "mean") over a server-held table: forward(ids) with
    2-d ids (one bag per row), or forward(ids, offsets) with 1-d ids, as EmbeddingBag takes
    them. Only the distinct rows of the batch travel, as in ShardedEmbedding."""

    def __init__(self, num_embeddings, embedding_dim, mode="mean", *, name=None, seed=None):
        super().__init__(num_embeddings, embedding_dim, name, seed)
        if mode not in ("sum", "mean"):
            raise ValueError(f"tessera: ShardedEmbeddingBag mode={mode!r}: expected 'sum' or "
                             "'mean'")
        self.mode = mode

    def forward(self, ids, offsets=None):
        rows, positions = self._rows(ids)
        positions = positions.view(ids.shape)
        return torch.nn.functional.embedding_bag(positions, rows, offsets, mode=self.mode)


class ParameterServerOptimizer:
    """Trains `params` on a Tessera parameter-server fleet.

    params: an nn.Module (its parameters that require gradients and its ShardedEmbedding
        tables, by their paths), or an iterable of (name, parameter) pairs such as
        model.named_parameters() (tables then go in `embeddings`). Parameters must be float32
        CPU tensors; their storage becomes one flat buffer that the servers' values land in.
    optimizer: "sgd" (with momentum > 0: momentum SGD), "momentum", "adam", "adamw" or
        "adagrad", with torch's hyper-parameter names (lr, momentum, nesterov, betas, eps,
        weight_decay, initial_accumulator_value) and torch's defaults where not given.
    mode: "ps-sync" (every step averages all workers' gradients: the same as one process on
        the global batch), "ps-async" (each push is applied as it comes) or "ps-ssp" (async,
        but no worker more than `staleness` steps ahead of the slowest).
    lr_schedule: "constant", "step" (lr_step_size, lr_gamma) or "cosine" (total_steps,
        min_lr), with warmup_steps of linear warmup: computed on the servers per step.
    coordinator: HOST:PORT of the fleet's coordinator (default: TESSERA_COORDINATOR).
    rank, world_size: this worker and the job's size (default: torch.distributed's group if
        initialised, else RANK and WORLD_SIZE, else 0 and 1).
    timeout: seconds to wait for the fleet and the job's workers, and for each step's replies.
    overlap: push each chunk of gradients as soon as backward has produced it (hooks on the
        parameters' gradient accumulation), so the servers apply it while backward goes on;
        step() sends the rest and waits. A step then has one backward pass: to accumulate
        gradients over several passes before a step, pass overlap=False.
    shared_memory: a server on this host exchanges gradients and values with this worker
        through shared memory (a sealed memfd both map) instead of its sockets, which saves the
        kernel's copies; servers elsewhere use the sockets. False: always the sockets.
    """

    def __init__(self, params, optimizer="sgd", lr=None, *, mode="ps-sync", staleness=0,
                 momentum=None, nesterov=None, betas=None, eps=None, weight_decay=None,
                 initial_accumulator_value=None, lr_schedule="constant", warmup_steps=0,
                 lr_step_size=0, lr_gamma=0.1, total_steps=0, min_lr=0.0, embeddings=None,
                 coordinator=None, rank=None, world_size=None, chunk_elements=1 << 16,
                 timeout=60.0, bind_host=None, overlap=True, shared_memory=True):
        if mode not in _MODES:
            raise ValueError(f"tessera: mode={mode!r}: expected one of {', '.join(_MODES)}")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"tessera: optimizer={optimizer!r}: expected one of "
                             f"{', '.join(_OPTIMIZERS)}")
        named, tables = self._collect(params, embeddings)
        kind, fields = self._optimizer_fields(optimizer, lr, momentum, nesterov, betas, eps,
                                              weight_decay, initial_accumulator_value)
        coordinator = coordinator or os.environ.get("TESSERA_COORDINATOR", "")
        if not coordinator:
            raise ValueError("tessera: ParameterServerOptimizer needs a fleet: pass "
                             "coordinator='HOST:PORT' or set TESSERA_COORDINATOR (start one with "
                             "tessera-launch --servers S --workers 0)")
        rank, world_size = _whoami(rank, world_size)
        bind_host = (bind_host or os.environ.get("TESSERA_BIND_HOST")
                     or os.environ.get("TESSERA_SOCKET_IFNAME") or "auto")

        self._named = named
        self._tables = tables
        self._step = 0
        self._flat = torch.empty(sum(p.numel() for _, p in named), dtype=torch.float32)
        self._grads = torch.zeros_like(self._flat)
        self._views = []  # per parameter: its storage, a view of self._flat
        self._slots = []  # per parameter: its gradient's view of self._grads
        self._offsets = []  # per parameter: its first element in the flat buffers
        offset = 0
        with torch.no_grad():
            for _, p in named:
                n = p.numel()
                view = self._flat[offset:offset + n].view(p.shape)
                view.copy_(p.data)
                p.data = view
                slot = self._grads[offset:offset + n].view(p.shape)
                p.grad = slot
                self._views.append(view)
                self._slots.append(slot)
                self._offsets.append(offset)
                offset += n
        self._client = _C.PsClient(
            coordinator=coordinator, rank=rank, world_size=world_size, mode=mode,
            staleness=staleness, optimizer=kind, optimizer_params=fields,
            lr_schedule=lr_schedule, warmup_steps=warmup_steps, lr_step_size=lr_step_size,
            lr_gamma=lr_gamma, total_steps=total_steps, min_lr=min_lr,
            chunk_elements=chunk_elements, timeout_s=float(timeout), bind_host=bind_host,
            shared_memory=bool(shared_memory))
        specs = []
        for index, (name, table) in enumerate(tables):
            table._bind(self._client, index, name)
            specs.append((name, table.num_embeddings, table.embedding_dim,
                          table.seed if table.seed is not None else index))
        self._client.initialize([name for name, _ in named], [list(p.shape) for _, p in named],
                                specs, self._flat)
        _OPEN.add(self)
        # Overlap: a hook on each parameter's gradient accumulator (the node autograd runs once
        # its gradient is complete, as DDP and Horovod hook it) reports the gradient ready.
        self._reported = [False] * len(named)
        self._twice = None  # a parameter whose gradient came twice in one step
        self._accumulators = []
        if overlap:
            with torch.enable_grad():
                for index, (_, p) in enumerate(named):
                    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                    accumulator.register_hook(self._ready_hook(index))
                    self._accumulators.append(accumulator)

    # -- construction ----------------------------------------------------------------------

    @staticmethod
    def _collect(params, embeddings):
        tables = []
        if isinstance(params, torch.nn.Module):
            for path, module in params.named_modules():
                if isinstance(module, _Embedding):
                    tables.append((module.table_name or path or "embedding", module))
            params = params.named_parameters()
        for i, table in enumerate(embeddings or ()):
            if not isinstance(table, _Embedding):
                raise TypeError(f"tessera: embeddings[{i}] is a {type(table).__name__}, not a "
                                "ShardedEmbedding or ShardedEmbeddingBag")
            tables.append((table.table_name or f"table{len(tables)}", table))
        names = [name for name, _ in tables]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"tessera: two embedding tables are named {name!r}: give them "
                                 "distinct name=")
        named = []
        for item in params:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError("tessera: params must be a module or (name, parameter) pairs, "
                                "e.g. model.named_parameters()")
            name, p = item
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"tessera: parameter {name!r} is {p.dtype} on {p.device}; the "
                                "parameter-server client takes float32 CPU parameters")
            if p.is_sparse:
                raise TypeError(f"tessera: parameter {name!r} is sparse; use ShardedEmbedding "
                                "for sparse tables")
            if p.numel() == 0:
                raise ValueError(f"tessera: parameter {name!r} has no elements")
            named.append((name, p))
        if not named:
            raise ValueError("tessera: no parameters that require gradients")
        return named, tables

    @staticmethod
    def _optimizer_fields(optimizer, lr, momentum, nesterov, betas, eps, weight_decay,
                          initial_accumulator_value):
        """The native optimizer's kind and its fields ("lr=0.1,momentum=0.9"), with torch's
        defaults for what is not given."""
        kind = optimizer
        if optimizer == "sgd":
            if lr is None:
                raise ValueError("tessera: optimizer 'sgd' needs lr (torch.optim.SGD has no "
                                 "default either)")
            if momentum:
                kind = "momentum"
            elif nesterov:
                raise ValueError("tessera: nesterov=True needs momentum > 0 (as in torch)")
        fields = {}
        defaults = {"momentum": 0.0, "adam": 1e-3, "adamw": 1e-3, "adagrad": 1e-2}
        fields["lr"] = lr if lr is not None else defaults.get(kind)
        if fields["lr"] is None:
            raise ValueError(f"tessera: optimizer {optimizer!r} needs lr")
        if kind == "momentum":
            fields["momentum"] = momentum if momentum is not None else 0.9
            fields["nesterov"] = "true" if nesterov else "false"
        if kind in ("adam", "adamw"):
            beta1, beta2 = betas if betas is not None else (0.9, 0.999)
            fields["beta1"], fields["beta2"] = beta1, beta2
            fields["eps"] = eps if eps is not None else 1e-8
        if kind == "adagrad":
            fields["eps"] = eps if eps is not None else 1e-10
            if initial_accumulator_value is not None:
                fields["initial_accumulator_value"] = initial_accumulator_value
        if weight_decay is not None:
            fields["weight_decay"] = weight_decay
        elif kind == "adamw":
            fields["weight_decay"] = 1e-2  # torch.optim.AdamW's default
        text = ",".join(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in fields.items())
        return kind, text

    def _ready_hook(self, index):
        owner = weakref.ref(self)  # the hook must not keep the optimizer alive

        def hook(*_):
            opt = owner()
            if opt is None:
                return
            name, p = opt._named[index]
            if opt._reported[index]:
                opt._twice = name
                return
            opt._reported[index] = True
            slot = opt._slots[index]
            grad = p.grad
            if grad is None or grad.data_ptr() != slot.data_ptr() or grad.shape != slot.shape:
                return  # step() copies it into place and pushes it with the rest
            opt._client.gradients_ready(opt._step + 1, opt._grads, opt._offsets[index],
                                         slot.numel())
        return hook

    # -- training --------------------------------------------------------------------------

    @property
    def rank(self):
        return self._client.rank

    @property
    def world_size(self):
        return self._client.world_size

    @property
    def num_servers(self):
        return self._client.num_servers

    @property
    def steps(self):
        """Steps taken (or restored) so far."""
        return self._step

    def __repr__(self):
        return (f"ParameterServerOptimizer(worker {self.rank} of {self.world_size}, "
                f"{self._client.description}, {len(self._named)} parameters, "
                f"{len(self._tables)} embedding tables)")

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients (they stay views of the buffer that step pushes; set_to_none
        is accepted for torch.optim's signature and zeroes as well)."""
        self._grads.zero_()
        for (_, p), slot in zip(self._named, self._slots):
            p.grad = slot
        for _, table in self._tables:
            table._drop_gradients()

    def step(self, closure=None):
        """Pushes this step's gradients (dense and embedding rows), waits for the servers'
        values after the step and writes them into the parameters. A parameter that got no
        gradient is pushed as zeros. Returns the closure's loss when given one."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        twice, self._twice = self._twice, None
        self._reported = [False] * len(self._named)
        if twice is not None:
            raise RuntimeError(f"tessera: parameter {twice!r} got gradients from more than one "
                               f"backward pass in step {self._step + 1}; with overlap=True (the "
                               "default) each backward pass's gradients go to the servers as "
                               "they are ready, so a step has one: pass overlap=False to "
                               "accumulate several")
        for (name, p), view, slot in zip(self._named, self._views, self._slots):
            if p.data_ptr() != view.data_ptr() or p.shape != view.shape:
                raise ValueError(f"tessera: parameter {name!r} no longer uses the optimizer's "
                                 f"storage: its data was replaced after the optimizer was made "
                                 f"(shape {list(p.shape)} now, {list(view.shape)} then), so the "
                                 "servers' values could not reach it; change parameters in "
                                 "place (p.data.copy_, load_state_dict) instead")
            grad = p.grad
            if grad is None:
                slot.zero_()
            elif grad.data_ptr() != slot.data_ptr():
                if grad.shape != slot.shape:
                    raise ValueError(f"tessera: the gradient of {name!r} has shape "
                                     f"{list(grad.shape)}, the parameter {list(slot.shape)}")
                if grad.is_sparse:
                    grad = grad.to_dense()
                slot.copy_(grad)
            p.grad = slot
        sparse = [table._take_gradients() for _, table in self._tables]
        self._client.step(self._step + 1, self._flat, self._grads, sparse)
        self._step += 1
        return loss

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, directory):
        """Has every server write its shard of the state after the last step (parameters,
        optimizer state, embedding rows) under `directory` (a path every server can write:
        one filesystem, or a shared one) and, on rank 0, commits it (step-N/, MANIFEST.json,
        LATEST). Call it on every rank after the same step; ranks other than 0 return at
        once."""
        self._client.save_checkpoint(os.fspath(directory), self._step)

    def load_checkpoint(self, directory, step=None):
        """Restores the servers from the checkpoint of `step` (default: the newest committed
        one, LATEST) under `directory` and pulls the restored parameters; the next step() is
        step + 1. Call it on every rank right after construction. Returns the step."""
        self._step = self._client.restore_checkpoint(os.fspath(directory),
                                                     -1 if step is None else int(step),
                                                     self._flat)
        return self._step

    def state_dict(self):
        raise NotImplementedError("tessera: the optimizer state lives on the parameter servers; "
                                  "use save_checkpoint(directory) and load_checkpoint(directory)")

    def load_state_dict(self, state_dict):
        raise NotImplementedError("tessera: the optimizer state lives on the parameter servers; "
                                  "use save_checkpoint(directory) and load_checkpoint(directory)")

    def metrics_text(self):
        """This worker's Prometheus metrics (the PS client's latencies and bytes, the
        transport's messages and bytes by type), as text."""
        return self._client.metrics_text()

    def close(self, reason="finished"):
        """Leaves the fleet (a clean goodbye: the coordinator frees the job's ranks once every
        worker has left). Also done when the process exits."""
        _OPEN.discard(self)
        self._client.leave(reason)


@atexit.register
def _close_all():
    for opt in list(_OPEN):
        opt.close("the process is exiting")


def _fail_all(error):
    """The process is failing with `error` (an uncaught exception): every open optimizer
    leaves with it, so the coordinator tells the job's other workers at once."""
    for opt in list(_OPEN):
        _OPEN.discard(opt)
        opt._client.leave_with_error(error)
