"""Device mesh, logical-axis rules, and global-batch assembly across hosts.

The model names its parameter axes logically (`vocab`, `embed`, `heads`, `mlp`, ...); this module
maps those names onto a 2-D device mesh:

    mesh axes: ("data", "fsdp")
    - the batch is split over BOTH axes (every device holds different examples);
    - parameters (and optimizer state) are split over "fsdp" along their large axis, FSDP style,
      and gathered by XLA where a computation needs them whole.

With fsdp = 1 this is plain data parallelism; with data = 1 it is pure FSDP. A parameter axis
whose size does not divide the mesh axis stays replicated (logged once), so any vocabulary size
works on any mesh.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

logger = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over every device
# Logical parameter axis -> mesh axis (None = replicated).
DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", "fsdp"),
    ("mlp", "fsdp"),
    ("heads", "fsdp"),
    ("embed", None),
    ("embed_out", None),
    ("position", None),
    ("type_vocab", None),
    ("classes", None),
)


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Starts multi-host JAX. On Cloud TPU all arguments may be None (found automatically).

    Off TPU (CPU/GPU clusters, or two local processes simulating a pod) pass all three. CPU
    processes talk over gloo collectives.
    """
    if num_processes is None or num_processes <= 1:
        if coordinator_address is None:
            return
    # CPU processes need a collectives implementation (gloo); the setting only affects CPU
    # devices, and must be made before the backend starts (so no jax.devices() here).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)


def mesh_shape(data: int, fsdp: int, num_devices: int) -> tuple[int, int]:
    """Resolves -1 (= whatever devices remain) and checks the product is the device count."""
    if data == -1 and fsdp == -1:
        raise ValueError("mesh: at most one of mesh.data and mesh.fsdp may be -1")
    for name, v in (("data", data), ("fsdp", fsdp)):
        if v == 0 or v < -1:
            raise ValueError(f"mesh.{name} must be a positive size or -1, got {v}")
    if data == -1:
        if num_devices % fsdp:
            raise ValueError(f"mesh.fsdp={fsdp} does not divide the {num_devices} devices")
        data = num_devices // fsdp
    if fsdp == -1:
        if num_devices % data:
            raise ValueError(f"mesh.data={data} does not divide the {num_devices} devices")
        fsdp = num_devices // data
    if data * fsdp != num_devices:
        raise ValueError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, but "
                         f"{num_devices} are available")
    return data, fsdp


def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "fsdp") mesh over all devices (or `devices`)."""
    devices = list(devices) if devices is not None else jax.devices()
    shape = mesh_shape(data, fsdp, len(devices))
    return jax.make_mesh(shape, MESH_AXES, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def num_batch_shards(mesh: Mesh) -> int:
    """How many devices split the batch (the P of Hoory et al. Eq. 3)."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Leading (batch) axis split over every device; other axes replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def spread_over_devices(mesh: Mesh):
    """shape -> a sharding splitting the first axis divisible by the device count over every
    device (None if no axis divides)."""
    n = mesh.size

    def layout(shape: tuple[int, ...]) -> NamedSharding | None:
        for axis, size in enumerate(shape):
            if size % n == 0:
                return NamedSharding(mesh, P(*([None] * axis), BATCH_AXES))
        return None

    return layout


def noise_layouts(param_shardings_tree: Any, params: Any) -> Any:
    """Where each parameter's DP noise is added (`dpbert.dp.noise.add_noise`'s `layouts`).

    A replicated parameter on a mesh of several devices gets `spread_over_devices`'s layout
    for its shape: each device adds the noise to its 1/P slice of the reduced gradient sum
    and the slices are all-gathered, instead of every device drawing all of the noise
    (8 CPU devices: DP step 1.19x / 1.21x of the non-private step for tiny / mini, against
    1.30x / 1.37x; BENCHMARKS.md, "Noise added to a slice of the sum").  A sharded
    parameter, or one no axis of which divides the device count, gets None (its noise is
    drawn in its own layout).  Returns a pytree like `param_shardings_tree`.
    """
    def one(sh: NamedSharding, p: Any) -> NamedSharding | None:
        if sh.mesh.size == 1 or not sh.is_fully_replicated:
            return None
        return spread_over_devices(sh.mesh)(tuple(p.shape))

    return jax.tree.map(one, param_shardings_tree, params)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, str | None]) -> P:
    """PartitionSpec for one array; axes that do not divide stay replicated."""
    spec: list[str | None] = []
    used: set[str] = set()
    for name, size in zip(axes, shape):
        target = rules.get(name) if name is not None else None
        if target is not None and (target in used or size % mesh.shape[target]):
            target = None
        if target is not None:
            used.add(target)
        spec.append(target)
    return P(*spec)


def param_shardings(params: nnx.State, mesh: Mesh,
                    rules: Sequence[tuple[str, str | None]] = DEFAULT_RULES) -> Any:
    """A pytree of NamedSharding matching `params` (an nnx.State of Params or their shapes)."""
    rule_map = dict(rules)

    def one(var):
        axes = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        return NamedSharding(mesh, logical_to_spec(axes, var.shape, mesh, rule_map))

    return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def pure_param_shardings(model: nnx.Module, mesh: Mesh) -> Any:
    """NamedShardings shaped like `nnx.to_pure_dict(nnx.state(model))`."""
    return nnx.to_pure_dict(param_shardings(nnx.state(model, nnx.Param), mesh))


def opt_state_shardings(opt_state: Any, params: Any, param_shardings_tree: Any,
                        mesh: Mesh) -> Any:
    """Optimizer-state leaves that mirror a parameter (Adam moments, ...) get its sharding.

    A leaf mirrors the parameter whose path is a suffix of the leaf's path (optax nests the
    parameter tree under its own keys, e.g. (0, 'mu', 'bert', ...)) and has its shape; every
    other leaf (step counts, masked-out placeholders) is replicated. This works through chains,
    masks and multi_transform alike.
    """
    from dpbert.dp import trees  # noqa: PLC0415

    rep = replicated(mesh)
    flat_params = {trees.path_names(p): x.shape
                   for p, x in jax.tree_util.tree_leaves_with_path(params)}
    flat_shardings = {trees.path_names(p): s for p, s in
                      jax.tree_util.tree_leaves_with_path(param_shardings_tree)}

    def one(path, leaf):
        key = trees.path_names(path)
        for start in range(len(key)):
            suffix = key[start:]
            if suffix in flat_params and flat_params[suffix] == leaf.shape:
                return flat_shardings[suffix]
        return rep

    return jax.tree_util.tree_map_with_path(one, opt_state)


def host_rows(global_batch_size: int, sharding: NamedSharding) -> np.ndarray:
    """The rows of a global batch that this process's devices hold (what it must load)."""
    index_map = sharding.addressable_devices_indices_map((global_batch_size,))
    rows = set()
    for idx in index_map.values():
        sl = idx[0]
        rows.update(range(*sl.indices(global_batch_size)))
    return np.array(sorted(rows), dtype=np.int64)


def make_global_batch(local: Mapping[str, np.ndarray], mesh: Mesh, global_batch_size: int
                      ) -> dict[str, jax.Array]:
    """Assembles per-process rows (`host_rows` order) into global arrays split over the mesh."""
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        sharding = batch_sharding(mesh, value.ndim)
        out[key] = jax.make_array_from_process_local_data(
            sharding, value, (global_batch_size, *value.shape[1:]))
    return out
