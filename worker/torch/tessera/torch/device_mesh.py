"""torch.distributed.device_mesh for torch 1.13 (issue 46): init_device_mesh and DeviceMesh
with PyTorch 2.6's names and semantics, on the CPU. A program written for torch's changes

    from torch.distributed.device_mesh import init_device_mesh
to
    from tessera.torch import init_device_mesh

Words used below:
  mesh        an n-dimensional tensor of global ranks (each appears once); a rank's
              coordinate is its index in it.
  dim group   for mesh dim d, the ranks whose coordinates differ only in d, in the order of d:
              a process group of its own. Row-major layout: the last dim varies fastest, so a
              "tp" last dim puts each tensor-parallel group on consecutive ranks (one host).
  sub-mesh    mesh[names]: the slice along the named dims through this rank's coordinate. It
              shares the root mesh's dim groups: slicing makes no group.

The dim groups take the default group's timeout (init_process_group's), where torch's take
new_group's default (30 minutes).
"""

import math

import torch
import torch.distributed as dist

__all__ = ["DeviceMesh", "init_device_mesh"]


def _dim_slices(mesh, dim):
    """The lists of ranks of every group of `dim`: the mesh's 1-D slices along it, the other
    coordinates in row-major order (the order every rank creates them in)."""
    moved = mesh.movedim(dim, -1).reshape(-1, mesh.size(dim))
    return [row.tolist() for row in moved]


def _default_timeout():
    """The timeout the default group was made with: init_process_group gives it to the default
    store too, where 1.13 lets it be read."""
    try:
        return dist.distributed_c10d._get_default_store().timeout
    except Exception:  # noqa: BLE001  (no store to read: torch's default)
        return dist.distributed_c10d.default_pg_timeout


def _new_group(ranks, world_size):
    # A dim spanning the whole default group in its order is that group, as in torch (no
    # group to make).
    if ranks == list(range(world_size)):
        return dist.group.WORLD
    # The timeout the user set at init_process_group, not new_group's default of 30 minutes
    # (torch's): a stage or peer that hangs is named at the deadline the program chose.
    return dist.new_group(ranks, timeout=_default_timeout())


class DeviceMesh:
    """torch.distributed.device_mesh.DeviceMesh on plain process groups: `mesh` (the tensor of
    ranks), `device_type`, `ndim`, `shape`, `mesh_dim_names`, `size()`, `get_group()`,
    `get_all_groups()`, `get_local_rank()`, `get_rank()`, `get_coordinate()` and slicing by
    dim names (`mesh["tp"]`, `mesh["dp", "tp"]`).

    Constructing one is a collective of the default group: every rank of it calls it with the
    same mesh, since each dim's groups come from dist.new_group, which every rank must call
    for every group in the same order. Only "cpu" is supported (this build has no GPU path).
    """

    def __init__(self, device_type, mesh, *, mesh_dim_names=None, _groups=None,
                 _root_mesh=None):
        if device_type != "cpu":
            raise ValueError(f"tessera DeviceMesh: device_type {device_type!r} is not supported: "
                             f"only 'cpu' (tessera's torch backend runs on CPU tensors)")
        if not dist.is_initialized():
            raise RuntimeError("tessera DeviceMesh: torch.distributed is not initialized: call "
                               "init_process_group first, or use init_device_mesh, which does")
        mesh = torch.as_tensor(mesh, dtype=torch.int64, device="cpu").detach().clone()
        if mesh.ndim == 0:
            raise ValueError("tessera DeviceMesh: the mesh must have at least one dimension")
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        if names is not None:
            if len(names) != mesh.ndim:
                raise ValueError(f"tessera DeviceMesh: mesh_dim_names {names} has {len(names)} "
                                 f"names for a mesh of {mesh.ndim} dims {tuple(mesh.shape)}")
            if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"tessera DeviceMesh: mesh_dim_names {names} must be distinct "
                                 f"strings")
        self.device_type = device_type
        self.mesh = mesh
        self.mesh_dim_names = names
        self._root_mesh = _root_mesh
        rank = dist.get_rank()
        where = (mesh == rank).nonzero()
        self._coordinate = where[0].tolist() if len(where) else None
        if _groups is not None:
            self._groups = list(_groups)
            return
        world_size = dist.get_world_size()
        flat = sorted(mesh.flatten().tolist())
        if flat != list(range(world_size)):
            raise ValueError(f"tessera DeviceMesh: the mesh {tuple(mesh.shape)} holds ranks "
                             f"{flat if len(flat) <= 16 else f'{len(flat)} ranks'} but the "
                             f"default group has world size {world_size}: the mesh must hold "
                             f"each rank 0..{world_size - 1} once")
        self._groups = []
        for dim in range(mesh.ndim):
            mine = None
            for ranks in _dim_slices(mesh, dim):
                group = _new_group(ranks, world_size)
                if rank in ranks:
                    mine = group
            self._groups.append(mine)

    # -- shape ----------------------------------------------------------------------------------

    @property
    def ndim(self):
        return self.mesh.ndim

    @property
    def shape(self):
        return tuple(self.mesh.shape)

    def size(self, mesh_dim=None):
        """The number of ranks in the mesh, or along mesh_dim (an index or a dim name)."""
        if mesh_dim is None:
            return self.mesh.numel()
        return self.mesh.size(self._dim_index(mesh_dim))

    def _dim_index(self, mesh_dim):
        if isinstance(mesh_dim, str):
            if self.mesh_dim_names is None:
                raise KeyError(f"tessera DeviceMesh: mesh dim {mesh_dim!r} given by name, but "
                               f"this mesh has no mesh_dim_names")
            if mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"tessera DeviceMesh: mesh dim {mesh_dim!r} does not exist; "
                               f"mesh_dim_names={self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"tessera DeviceMesh: mesh dim {mesh_dim!r} is out of range for a "
                             f"mesh of {self.ndim} dims {self.shape}")
        return mesh_dim % self.ndim

    def _one_dim(self, mesh_dim, what):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"tessera DeviceMesh: {what}: the mesh has {self.ndim} dims "
                                   f"{self.shape}; name the dim with mesh_dim=")
            return 0
        return self._dim_index(mesh_dim)

    # -- groups and ranks -----------------------------------------------------------------------

    def get_group(self, mesh_dim=None):
        """The process group of this rank along mesh_dim (index or name; may be omitted for a
        1-D mesh)."""
        return self._groups[self._one_dim(mesh_dim, "get_group()")]

    def get_all_groups(self):
        """This rank's group of every dim, in dim order."""
        return list(self._groups)

    def get_rank(self):
        """This process's global rank."""
        return dist.get_rank()

    def get_local_rank(self, mesh_dim=None):
        """This rank's rank in its group along mesh_dim, as torch's: its index along the dim
        in a mesh from init_device_mesh; in a DeviceMesh whose dim does not list ranks in
        increasing order, its place among the group's ranks sorted (dist.new_group's order,
        in which collectives of the group place the ranks' tensors)."""
        return dist.get_rank(self._groups[self._one_dim(mesh_dim, "get_local_rank()")])

    def get_coordinate(self):
        """This rank's coordinate in the mesh (a list, one index per dim), or None when the
        rank is not in it."""
        return list(self._coordinate) if self._coordinate is not None else None

    # -- slicing --------------------------------------------------------------------------------

    def __getitem__(self, mesh_dim_names):
        """The sub-mesh along the named dims (a name or a tuple of names, in the mesh's order)
        through this rank's coordinate; it uses this mesh's groups."""
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if self.mesh_dim_names is None:
            raise RuntimeError("tessera DeviceMesh: cannot slice a mesh without mesh_dim_names")
        if not names:
            raise KeyError("tessera DeviceMesh: slicing needs at least one mesh dim name")
        dims = [self._dim_index(name) if isinstance(name, str) else self._bad_key(name)
                for name in names]
        if dims != sorted(set(dims)):
            raise KeyError(f"tessera DeviceMesh: mesh dims {names} must be distinct and in the "
                           f"mesh's order mesh_dim_names={self.mesh_dim_names}")
        if names == self.mesh_dim_names:
            return self
        index = [slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim)]
        return DeviceMesh(self.device_type, self.mesh[tuple(index)], mesh_dim_names=names,
                          _groups=[self._groups[d] for d in dims],
                          _root_mesh=self._root_mesh or self)

    def _bad_key(self, name):
        raise KeyError(f"tessera DeviceMesh: a mesh is sliced by dim names (str), not "
                       f"{name!r}; mesh_dim_names={self.mesh_dim_names}")

    # -- identity -------------------------------------------------------------------------------

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"

    def __eq__(self, other):
        return (isinstance(other, DeviceMesh) and self.device_type == other.device_type
                and self.shape == other.shape and torch.equal(self.mesh, other.mesh)
                and self.mesh_dim_names == other.mesh_dim_names)

    def __hash__(self):
        return hash((self.device_type, tuple(self.mesh.flatten().tolist()), self.shape,
                     self.mesh_dim_names))


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """torch.distributed.device_mesh.init_device_mesh: a DeviceMesh of shape mesh_shape over
    the default group's ranks in row-major order (torch.arange(world_size).view(mesh_shape)),
    with a process group per dim (see DeviceMesh). Initializes torch.distributed with the
    tessera backend (env://) when it is not yet initialized. A collective: every rank calls
    it with the same arguments. Raises ValueError when the shape's product is not the world
    size, when mesh_dim_names does not name each dim once, or for a device other than "cpu".
    """
    if device_type != "cpu":
        raise ValueError(f"tessera init_device_mesh: device_type {device_type!r} is not "
                         f"supported: only 'cpu' (tessera's torch backend runs on CPU tensors)")
    shape = tuple(mesh_shape)
    if not shape or not all(isinstance(n, int) and n >= 1 for n in shape):
        raise ValueError(f"tessera init_device_mesh: mesh_shape {mesh_shape!r} must be a "
                         f"non-empty tuple of positive ints")
    if mesh_dim_names is not None:
        names = tuple(mesh_dim_names)
        if len(names) != len(shape):
            raise ValueError(f"tessera init_device_mesh: mesh_dim_names {names} has "
                             f"{len(names)} names for mesh_shape {shape} of {len(shape)} dims")
        if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"tessera init_device_mesh: mesh_dim_names {names} must be "
                             f"distinct strings")
    if not dist.is_initialized():
        import tessera.torch  # noqa: F401  (registers the backend)
        dist.init_process_group("tessera")
    world_size = dist.get_world_size()
    if math.prod(shape) != world_size:
        raise ValueError(f"tessera init_device_mesh: mesh_shape {shape} holds "
                         f"{math.prod(shape)} ranks but the world size is {world_size}: the "
                         f"product of mesh_shape must be the world size")
    mesh = torch.arange(world_size, dtype=torch.int64).view(shape)
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names)
