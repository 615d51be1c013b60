"""Weights, KV caches and batches over a JAX device mesh ("data" x "model"), with logical-axis rules.

A dimension names what it is (batch, heads, kv_heads, mlp, vocab, experts, linear_heads); RULES map those names to
mesh axes: the batch over "data", attention heads, MLP, vocabulary, experts and gated DeltaNet value heads (those of
a hybrid target's recurrent state too) over "model" (Megatron-style column/row splits, so XLA's SPMD partitioner
inserts one all-reduce after attention and one after the MLP; routed layers place whole experts per device, expert
parallel, and sum the routed outputs over "model"). A
dimension that does not divide by its mesh axis stays replicated, and attention stays replicated when
either head count does not divide, so every model runs on every mesh; `describe` says what was split.
Arrays are built with `jax.make_array_from_callback`, so the same code places them across processes.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "model")
RULES = {"batch": "data", "heads": "model", "kv_heads": "model", "mlp": "model", "vocab": "model",
         "experts": "model", "linear_heads": "model"}
# leaf name -> logical axes of its dimensions (weights are [in, out]; embed is [V, H]; experts [E, in, out]).
# Experts split over "model" (expert parallel) when their count divides, else their MLP width does.
WEIGHT_AXES = {"wq": (None, "heads"), "wk": (None, "kv_heads"), "wv": (None, "kv_heads"), "wo": ("heads", None),
               "bq": ("heads",), "bk": ("kv_heads",), "bv": ("kv_heads",), "sinks": ("heads",),
               "w_gate": (None, "mlp"), "w_up": (None, "mlp"), "w_down": ("mlp", None),
               "we_gate": ("experts", None, "mlp"), "we_up": ("experts", None, "mlp"),
               "we_down": ("experts", "mlp", None), "be_gate": ("experts", "mlp"), "be_up": ("experts", "mlp"),
               "be_down": ("experts", None), "embed": ("vocab", None), "lm_head": (None, "vocab"),
               # hybrid targets (engine/qwen3_5.py): the output gate splits with the query heads, the shared expert
               # as an MLP; gated DeltaNet weights split along value heads ("linear_heads", only when their count
               # divides). Its q|k|v projection and conv concatenate three head kinds, so they stay replicated.
               "w_attn_gate": (None, "heads"), "shared_w_gate": (None, "mlp"), "shared_w_up": (None, "mlp"),
               "shared_w_down": ("mlp", None), "w_z": (None, "linear_heads"), "w_b": (None, "linear_heads"),
               "w_a": (None, "linear_heads"), "dt_bias": ("linear_heads",), "A_log": ("linear_heads",),
               "w_out": ("linear_heads", None)}
CACHE_AXES = ("batch", "kv_heads", None, None)  # [B, Nkv, S, D]
# a gated DeltaNet layer's state: conv [B, K-1, C] (C concatenates q|k|v: replicated), rec [B, Nv, Dk, Dv]
STATE_AXES = {"conv": ("batch", None, None), "rec": ("batch", "linear_heads", None, None)}


class MeshError(ValueError):
    """A mesh that cannot be built on the devices at hand; the message says why."""


def parse_mesh(spec: str) -> tuple[int, int]:
    """"DxM" -> (data, model)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", str(spec))
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise MeshError(f"mesh must look like DxM (data x model), e.g. 1x8 or 2x4; got {spec!r}")
    return int(m[1]), int(m[2])


def make_mesh(spec: str) -> Mesh:
    """A ("data", "model") mesh over the first D*M devices (all processes' devices, in jax.devices() order)."""
    d, m = parse_mesh(spec)
    devices = jax.devices()
    if d * m > len(devices):
        raise MeshError(f"mesh {d}x{m} needs {d * m} devices but {len(devices)} are visible "
                        f"({jax.default_backend()}); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N "
                        "and NPROC=N+2 (XLA's thread pool needs a thread per simulated device)")
    return jax.make_mesh((d, m), AXES, axis_types=(AxisType.Auto,) * 2, devices=devices[:d * m])


def resolve_mesh(mesh: Mesh | str | None) -> Mesh | None:
    """A Mesh from a Mesh, "DxM" or None; None (one device) for None and "1x1"."""
    if mesh is None or isinstance(mesh, Mesh):
        return mesh
    return None if parse_mesh(mesh) == (1, 1) else make_mesh(mesh)


def mesh_label(mesh: Mesh | None) -> str:
    return "1x1" if mesh is None else "x".join(str(mesh.shape[a]) for a in AXES)


def partition(shape: tuple[int, ...], logical: tuple[str | None, ...], mesh: Mesh, shard_heads: bool = True,
              shard_linear: bool = True) -> P:
    """The PartitionSpec of an array whose dimensions are `logical`; indivisible dimensions are replicated, and a
    mesh axis splits at most one dimension (the first that divides). shard_heads / shard_linear False replicate
    the attention / gated DeltaNet head dimensions (whose flattened [N*D] sizes may divide where N does not)."""
    spec = []
    for size, name in zip(shape, logical, strict=True):
        axis = RULES.get(name) if name else None
        if (name in ("heads", "kv_heads") and not shard_heads) or (name == "linear_heads" and not shard_linear):
            axis = None
        spec.append(axis if axis and axis not in spec and size % mesh.shape[axis] == 0 else None)
    return P(*spec)


def put(x, sharding: NamedSharding) -> jax.Array:
    """One global array from a host value every process holds (each device takes its own slice)."""
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def heads_divide(mesh: Mesh, num_heads: int, num_kv_heads: int) -> bool:
    m = mesh.shape["model"]
    return num_heads % m == 0 and num_kv_heads % m == 0


def _leaf_name(path) -> str | None:
    """The last dict key on a pytree path ("wq" for params["layers"][3]["wq"])."""
    return next((k.key for k in reversed(path) if isinstance(k, jax.tree_util.DictKey)), None)


def place_params(params: dict, mesh: Mesh, num_heads: int, num_kv_heads: int, num_linear_heads: int = 0) -> dict:
    """Every weight of a params pytree placed on the mesh by its leaf name (unknown names: replicated).
    num_linear_heads: a hybrid target's gated DeltaNet value heads (their weights split when the count divides)."""
    shard_heads = heads_divide(mesh, num_heads, num_kv_heads)
    shard_linear = num_linear_heads > 0 and num_linear_heads % mesh.shape["model"] == 0

    def one(path, x):
        logical = WEIGHT_AXES.get(_leaf_name(path))
        if logical is None or len(logical) != np.ndim(x):
            logical = (None,) * np.ndim(x)
        return put(x, NamedSharding(mesh, partition(np.shape(x), logical, mesh, shard_heads, shard_linear)))

    return jax.tree_util.tree_map_with_path(one, params)


def cache_sharding(mesh: Mesh, shape: tuple[int, ...], shard_heads: bool,
                   logical: tuple[str | None, ...] = CACHE_AXES) -> NamedSharding:
    return NamedSharding(mesh, partition(shape, logical, mesh, shard_heads))


@functools.cache
def _zeros_on(shape: tuple[int, ...], dtype, sharding: NamedSharding):
    """A compiled zeros builder per (shape, dtype, sharding): each device fills only its own slice."""
    return jax.jit(lambda: jax.numpy.zeros(shape, dtype), out_shardings=sharding)


def zeros(shape: tuple[int, ...], dtype, mesh: Mesh | None, shard_heads: bool = True,
          logical: tuple[str | None, ...] = CACHE_AXES) -> jax.Array:
    """A zeroed cache buffer whose dimensions are `logical` (a [B, Nkv, S, D] K/V buffer unless told), on the mesh
    when there is one."""
    if mesh is None:
        return jax.numpy.zeros(shape, dtype)
    return _zeros_on(tuple(shape), dtype, cache_sharding(mesh, shape, shard_heads, logical))()


def describe(mesh: Mesh | None, params: dict, num_heads: int, num_kv_heads: int) -> str:
    """One line on how a params pytree is split, e.g. for logs and run settings."""
    if mesh is None:
        return "one device"
    split = sorted({_leaf_name(path) for path, x in jax.tree_util.tree_leaves_with_path(params)
                    if not x.sharding.is_fully_replicated})
    heads = "split" if heads_divide(mesh, num_heads, num_kv_heads) else "replicated (heads do not divide)"
    return f"mesh {mesh_label(mesh)}: split {', '.join(split) or 'nothing'}; attention {heads}"


def start_distributed(spec: str | None) -> None:
    """Join a multi-process JAX run: "HOST:PORT,NUM_PROCESSES,PROCESS_ID", or "auto" (TPU pods, SLURM, ... where
    JAX finds its peers itself); None: a single process. Every process then runs the same program."""
    if spec is None:
        return
    if spec == "auto":
        jax.distributed.initialize()
        return
    parts = spec.split(",")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise MeshError(f"--distributed wants HOST:PORT,NUM_PROCESSES,PROCESS_ID or auto, got {spec!r}")
    jax.distributed.initialize(coordinator_address=parts[0], num_processes=int(parts[1]), process_id=int(parts[2]))


def fetch(tree):
    """Device values to host numpy, also when they span processes (then every process gets all of them)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: np.asarray(x) if getattr(x, "is_fully_replicated", True)
                        else multihost_utils.process_allgather(x, tiled=True), tree)
