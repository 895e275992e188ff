"""SampleChunk: the one unit of data that moves from an explorer to the learner.

A chunk is a dict (a ``SampleChunk``) holding T vector steps of N environments. Observations
are stored once, as T+1 frames: frame t+1 is the next observation of step t, so no
next-observation is ever duplicated. Gymnasium's vector envs reset an env on the step
*after* it finished (autoreset NEXT_STEP); that reset step is not a transition and is marked
``valid = False``.

Dict and Tuple observations (nested; gymnasium's vector envs batch them as dicts and tuples of
arrays) keep each leaf as its own array, ``obs.<path>`` (T+1, N, *leaf_shape), in place of
``obs``: the path names the leaf by its keys and tuple indices joined with dots
(``obs.image``, ``obs.pos.x``, ``obs.0``); ``obs_leaves`` flattens an env's observation into that
form and ``observations`` reads it back from a chunk. A flat Box chunk has ``obs`` alone, as before:
nothing per step, no Python dict, and one more array per leaf is all a Dict observation costs.

A recurrent policy's chunk also carries ``state0`` (N, S), the state its first step acted from,
and with burn-in the K steps before that step: ``burn_obs`` (K, N, *obs_shape), ``burn_valid``
(K, N) and ``burn_state`` (N, S) (see ``envs/burn_in.py``); feed-forward chunks have none of them.

This module imports neither Dask nor torch.
"""

from __future__ import annotations

import pickle

import numpy as np

#: arrays every chunk carries (``obs``, or the ``obs.<path>`` leaves of a Dict or Tuple observation)
ARRAY_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "valid")
#: a Dict or Tuple observation's leaves: ``obs.<path>``, each (T+1, N, *leaf_shape)
OBS_PREFIX = "obs."
#: the dtypes an observation leaf may have (floats as float32; uint8 pixels, bools and integers as the env gives them)
LEAF_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.uint8, np.bool_, np.int8, np.int16, np.int32, np.int64))
#: scalar stamps every chunk carries; ``env_seed`` and ``stream_serial`` say which env instance made it
#: and which of that instance's chunks it is (what an exact replay rebuilds it from)
STAMP_FIELDS = ("explorer_id", "policy_version", "env_steps", "t_start", "t_end", "nbytes", "env_seed", "stream_serial")
#: a recurrent policy's arrays whose first axis is the env (N, S), and those of its burn-in steps (K, N, ...)
STATE_FIELDS = ("state0", "burn_state")
BURN_IN_FIELDS = ("burn_obs", "burn_valid")


#: chunks whose arrays total at most this many bytes travel packed into one buffer (see SampleChunk)
PACK_LIMIT = 2**19
_ALIGN = 64  # each array starts on a 64-byte boundary of the packed buffer


class SampleChunk(dict):
    """A chunk: a dict of arrays and stamps that pickles, and so travels through Dask, as one
    contiguous buffer plus a small layout.

    Dask serializes a plain dict field by field (a sub-header, a pickle or numpy header and frame
    bookkeeping each): a fixed cost per field whatever its size, and a frame per field on the wire. Packed, a small chunk is one out-of-band buffer (pickle
    protocol 5, no copy on the receiving side: the arrays are views into the received buffer).
    Above ``PACK_LIMIT`` the copy into one buffer would cost more than it saves, so a large
    chunk pickles as one pickle of its dict, each array its own out-of-band (zero-copy) buffer."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        arrays = [(k, v) for k, v in self.items() if isinstance(v, np.ndarray)]
        total = sum(v.nbytes for _, v in arrays)
        if protocol < 5 or total > PACK_LIMIT or any(v.dtype.hasobject for _, v in arrays):
            return SampleChunk, (dict(self),)
        layout, size = array_layout(arrays)
        buf = np.empty(size, np.uint8)
        for (_, arr), (_, _, _, start) in zip(arrays, layout):
            buf[start:start + arr.nbytes] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        stamps = {k: v for k, v in self.items() if not isinstance(v, np.ndarray)}
        return _unpack, (layout, stamps, pickle.PickleBuffer(buf))


def array_layout(arrays: list[tuple[str, np.ndarray]]) -> tuple[list, int]:
    """Where each array goes in one buffer: ([(name, dtype, shape, offset)], buffer size), every
    array starting on a 64-byte boundary."""
    layout, offset = [], 0
    for name, arr in arrays:
        layout.append((name, arr.dtype.str, arr.shape, offset))
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    return layout, offset


def arrays_from(buffer, layout: list) -> dict[str, np.ndarray]:
    """``array_layout``'s arrays as views into ``buffer`` (writable when it is), one
    ``np.ndarray`` call each: slicing, ``view`` and ``reshape`` cost several times as much."""
    raw = np.frombuffer(buffer, np.uint8)
    return {name: np.ndarray(shape, dtype, buffer=raw, offset=start) for name, dtype, shape, start in layout}


def _unpack(layout: list, stamps: dict, buffer) -> SampleChunk:
    """A packed chunk back: its arrays are views into ``buffer`` (writable when it is)."""
    chunk = SampleChunk(arrays_from(buffer, layout))
    chunk.update(stamps)
    return chunk


def tree_leaves(tree, children=None) -> dict:
    """The leaves of nested dicts and tuples by path, keys and indices joined with dots, in their
    order. ``children(node)``: a node's dict or tuple of children, None for a leaf; by default a
    dict, tuple or list is a node and anything else a leaf."""
    out: dict = {}

    def walk(prefix: str, node) -> None:
        kids = children(node) if children is not None else node if isinstance(node, (dict, tuple, list)) else None
        if kids is None:
            out[prefix[:-1]] = node
            return
        for key, sub in (kids.items() if isinstance(kids, dict) else enumerate(kids)):
            walk(f"{prefix}{key}.", sub)

    walk("", tree)
    return out


def obs_leaves(obs) -> dict[str, np.ndarray]:
    """A Dict or Tuple observation (nested dicts and tuples of arrays, as gymnasium's spaces and
    vector envs give them) as one flat dict ``{path: array}``, paths joined with dots, in the
    order of the observation (a dict already flat comes back as it is)."""
    return tree_leaves(obs)


def leaf_dtype(dtype) -> np.dtype:
    """What a chunk stores an observation leaf of ``dtype`` as: floats as float32, others as they are."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


def observations(chunk: dict):
    """A chunk's observations: ``obs`` (T+1, N, *obs_shape), or a Dict's leaves as ``{path: array}``."""
    if "obs" in chunk:
        return chunk["obs"]
    return {k[len(OBS_PREFIX):]: v for k, v in chunk.items() if k.startswith(OBS_PREFIX)}


def map_obs(fn, obs):
    """``fn`` of each leaf of ``obs`` (an array, or a dict of leaves), in the same form."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


def cat_obs(parts: list, cat):
    """``cat`` (a concatenation) of a list of observations, leaf by leaf when they are dicts."""
    if parts and isinstance(parts[0], dict):
        return {k: cat([p[k] for p in parts]) for k in parts[0]}
    return cat(parts)


def make_chunk(
    *,
    obs,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    extras: dict[str, np.ndarray],
    explorer_id: int,
    policy_version: int,
    t_start: float,
    t_end: float,
    episodes: list[tuple[float, float, int]],
    env_seed: int = 0,
    stream_serial: int = 0,
    recurrent: dict[str, np.ndarray] | None = None,
) -> SampleChunk:
    """A chunk with every field its schema declares and nothing else: the arrays and stamps
    above; ``recurrent``, a recurrent policy's ``STATE_FIELDS`` and ``BURN_IN_FIELDS`` (see the
    module docstring). ``obs``: an array, or a Dict observation's leaves ``{path: array}``, each
    kept as the field ``obs.<path>``. ``env_steps`` and ``nbytes`` are counted here."""
    chunk = SampleChunk({
        **({f"{OBS_PREFIX}{k}": v for k, v in obs.items()} if isinstance(obs, dict) else {"obs": obs}),
        "actions": actions,
        "rewards": rewards.astype(np.float32, copy=False),
        "terminated": terminated.astype(bool, copy=False),
        "truncated": truncated.astype(bool, copy=False),
        "valid": valid.astype(bool, copy=False),
        **{f"extra_{k}": v for k, v in extras.items()},
        "episodes": np.asarray(episodes, dtype=np.float64).reshape(-1, 3),
        "explorer_id": int(explorer_id),
        "policy_version": int(policy_version),
        "env_steps": int(valid.sum()),
        "t_start": float(t_start),
        "t_end": float(t_end),
        "env_seed": int(env_seed),
        "stream_serial": int(stream_serial),
        **(recurrent or {}),
    })
    chunk["nbytes"] = int(sum(v.nbytes for v in chunk.values() if isinstance(v, np.ndarray)))
    return chunk


def extras(chunk: dict) -> dict[str, np.ndarray]:
    """The per-step arrays the behaviour policy added (e.g. PPO's log-probabilities and values)."""
    return {k[len("extra_"):]: v for k, v in chunk.items() if k.startswith("extra_")}


def select_envs(chunk: dict, envs: np.ndarray) -> dict:
    """The per-step and per-env arrays of some of a chunk's envs (``episodes`` and stamps left out)."""
    out = {}
    for k, v in chunk.items():
        if isinstance(v, np.ndarray) and k != "episodes":
            out[k] = v[envs] if k in STATE_FIELDS else v[:, envs]
    return out


def validate_chunk(chunk: dict) -> None:
    """Raise ValueError naming the first field that breaks the schema."""
    leaves = [k for k in chunk if k.startswith(OBS_PREFIX)]
    for name in ARRAY_FIELDS[1:] + STAMP_FIELDS + ("episodes",) + (() if leaves else ("obs",)):
        if name not in chunk:
            raise ValueError(f"chunk: missing field {name!r}")
    if leaves:
        t1, n = _validate_leaves(chunk, leaves)
    else:
        obs = chunk["obs"]
        if not isinstance(obs, np.ndarray) or obs.ndim < 3:
            raise ValueError("chunk.obs: must be an array of shape (T+1, N, *obs_shape)")
        if obs.dtype not in (np.float32, np.uint8):
            raise ValueError(f"chunk.obs: dtype must be float32 or uint8, got {obs.dtype}")
        t1, n = obs.shape[:2]
    for name in ("actions", "rewards", "terminated", "truncated", "valid"):
        arr = chunk[name]
        if not isinstance(arr, np.ndarray) or arr.shape[:2] != (t1 - 1, n):
            raise ValueError(f"chunk.{name}: must have leading shape (T, N) = {(t1 - 1, n)}")
    for name, arr in extras(chunk).items():
        if arr.shape[:2] != (t1 - 1, n):
            raise ValueError(f"chunk.extra_{name}: must have leading shape (T, N) = {(t1 - 1, n)}")
    for name in ("terminated", "truncated", "valid"):
        if chunk[name].dtype != bool:
            raise ValueError(f"chunk.{name}: dtype must be bool")
    _validate_recurrent(chunk, n)
    if chunk["rewards"].dtype != np.float32:
        raise ValueError("chunk.rewards: dtype must be float32")
    for name, arr in chunk.items():
        if isinstance(arr, np.ndarray) and arr.dtype in (np.float64,) and name != "episodes":
            raise ValueError(f"chunk.{name}: float64 arrays are not allowed (use float32)")
    eps = chunk["episodes"]
    if not isinstance(eps, np.ndarray) or eps.ndim != 2 or eps.shape[1] != 3:
        raise ValueError("chunk.episodes: must be an array of rows (t_end, return, length)")
    if chunk["env_steps"] != int(chunk["valid"].sum()):
        raise ValueError("chunk.env_steps: must equal the number of valid steps")
    if not chunk["t_start"] <= chunk["t_end"]:
        raise ValueError("chunk.t_end: must not be before t_start")
    if chunk["policy_version"] < 0:
        raise ValueError("chunk.policy_version: must be >= 0")


def _validate_leaves(chunk: dict, leaves: list[str]) -> tuple[int, int]:
    """A Dict observation's ``obs.<path>`` leaves: no ``obs`` beside them, each (T+1, N, ...) of one
    (T+1, N) and a ``LEAF_DTYPES`` dtype; returns (T+1, N)."""
    if "obs" in chunk:
        raise ValueError(f"chunk.obs: a chunk has obs or its leaves {leaves[0]!r}..., not both")
    first = chunk[leaves[0]]
    if not isinstance(first, np.ndarray) or first.ndim < 2:
        raise ValueError(f"chunk.{leaves[0]}: must be an array of shape (T+1, N, *leaf_shape)")
    for name in leaves:
        leaf = chunk[name]
        if not isinstance(leaf, np.ndarray) or leaf.shape[:2] != first.shape[:2]:
            raise ValueError(f"chunk.{name}: must have leading shape (T+1, N) = {first.shape[:2]}")
        if leaf.dtype not in LEAF_DTYPES:
            raise ValueError(f"chunk.{name}: dtype must be one of {sorted(d.name for d in LEAF_DTYPES)}, got {leaf.dtype}")
    return first.shape[:2]


def _validate_recurrent(chunk: dict, n: int) -> None:
    """The optional fields of a recurrent policy's chunk, where present (see the module docstring)."""
    for name in STATE_FIELDS:
        if name in chunk:
            arr = chunk[name]
            if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.shape[0] != n or arr.dtype != np.float32:
                raise ValueError(f"chunk.{name}: must be a float32 array of shape (N, S) with N = {n}")
    if any(name in chunk for name in BURN_IN_FIELDS + ("burn_state",)):
        if "obs" not in chunk:
            raise ValueError("chunk.burn_obs: burn-in is for chunks of Box observations (obs), not Dict leaves")
        if not all(name in chunk for name in BURN_IN_FIELDS + ("burn_state",)):
            raise ValueError("chunk.burn_obs: burn_obs, burn_valid and burn_state come together")
        obs, burn_obs, burn_valid = chunk["obs"], chunk["burn_obs"], chunk["burn_valid"]
        if not isinstance(burn_obs, np.ndarray) or burn_obs.shape[1:] != obs.shape[1:] or burn_obs.dtype != obs.dtype:
            raise ValueError(f"chunk.burn_obs: must have shape (K, *obs.shape[1:]) = (K, {', '.join(map(str, obs.shape[1:]))}) "
                             f"and obs's dtype {obs.dtype}")
        if not isinstance(burn_valid, np.ndarray) or burn_valid.shape != burn_obs.shape[:2] or burn_valid.dtype != bool:
            raise ValueError(f"chunk.burn_valid: must be a bool array of shape (K, N) = {burn_obs.shape[:2]}")
