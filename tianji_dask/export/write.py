"""A policy written for use outside the project: TorchScript (``torch.jit.trace``, loaded back with
``torch.jit.load``) or ONNX (opset 17, through torch's TorchScript-based exporter, which needs
onnx and no onnxscript; a dynamic batch dimension). Input ``obs``: float32 (B, *obs shape), as the
env gives them (a Dict or Tuple observation: one input per leaf, ``obs.<path>``, float32 (B, *leaf
shape), its ``action_mask`` among them); output ``action``: int64 (B,) for Discrete, int64 (B,
*shape) for MultiDiscrete and MultiBinary, float32 (B, A) for Box. A recurrent
policy takes a second input, ``state`` float32 (B, S) (at an episode's first step the initial
state: zeros for PPO), and gives a second output, ``new_state`` (B, S), the state its next step
takes. Each file carries ``tianji.json`` (the checkpoint, its version, the spaces, a recurrent
policy's ``state_shape``) as TorchScript extra file or ONNX metadata. Written to a temporary file
and renamed: nothing half-written on failure."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from tianji_dask.errors import PipelineError
from tianji_dask.export.load import Policy, leaf_shapes, load_policy

FORMATS = ("torchscript", "onnx")
OPSET = 17
METADATA = "tianji.json"


def _onnx():
    try:
        import onnx
    except ImportError:
        raise PipelineError("--format onnx: needs onnx (pip install 'tianji-dask[export]')") from None
    return onnx


def metadata(policy: Policy) -> dict:
    """What an exported file says about itself: where it came from and what goes in and out."""
    space = policy.action_space
    if hasattr(space, "nvec"):
        action = {"nvec": space.nvec.tolist(), "start": space.start.tolist()}
    elif hasattr(space, "low"):
        action = {"shape": list(space.shape), "low": space.low.tolist(), "high": space.high.tolist()}
    elif isinstance(space.n, (int, np.integer)) and space.dtype != np.int8:
        action = {"discrete": int(space.n)}
    else:  # MultiBinary
        action = {"binary": list(space.shape)}
    meta = {"checkpoint": policy.checkpoint, "version": policy.version, "algorithm": type(policy.algorithm).__name__,
            "action": action}
    leaves = leaf_shapes(policy.observation_space)
    if leaves is None:
        meta["observation_shape"] = list(policy.observation_space.shape)
    else:
        meta["observation_leaves"] = {path: list(shape) for path, shape in leaves.items()}
    state = policy.initial_state()
    if state is not None:
        meta["state_shape"] = list(state.shape)
    return meta


def examples(policy: Policy) -> tuple[torch.Tensor, ...]:
    """What the module is traced with: a batch of two zero observations (one per leaf of a Dict or
    Tuple observation; and initial states)."""
    leaves = leaf_shapes(policy.observation_space)
    if leaves is not None:
        return tuple(torch.zeros((2, *shape), dtype=torch.float32) for shape in leaves.values())
    obs = torch.zeros((2, *policy.observation_space.shape), dtype=torch.float32)
    state = policy.initial_state(2)
    return (obs,) if state is None else (obs, torch.from_numpy(state))


def input_names(policy: Policy, example: tuple) -> list[str]:
    """The exported file's inputs: obs (and state), or ``obs.<path>`` per leaf of a Dict or Tuple."""
    leaves = leaf_shapes(policy.observation_space)
    if leaves is not None:
        return [f"obs.{path}" for path in leaves]
    return ["obs"] if len(example) == 1 else ["obs", "state"]


def _torchscript(module: torch.nn.Module, example: tuple[torch.Tensor, ...], tmp: Path, meta: dict, inputs: list[str]) -> None:
    with warnings.catch_warnings():  # deprecated in favour of torch.export, which TorchScript files do not come from
        warnings.filterwarnings("ignore", r"`torch\.jit\.(trace|save)", DeprecationWarning)
        traced = torch.jit.trace(module, example)
        torch.jit.save(traced, str(tmp), _extra_files={METADATA: json.dumps(meta)})


def _onnx_file(module: torch.nn.Module, example: tuple[torch.Tensor, ...], tmp: Path, meta: dict, inputs: list[str]) -> None:
    onnx = _onnx()
    outputs = ["action"] if "state" not in inputs else ["action", "new_state"]
    with warnings.catch_warnings():  # the TorchScript-based exporter: quiet, fast, no onnxscript
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(module, example, str(tmp), dynamo=False, opset_version=OPSET, input_names=inputs,
                          output_names=outputs, dynamic_axes={name: {0: "batch"} for name in inputs + outputs})
    model = onnx.load(str(tmp))
    model.metadata_props.add(key=METADATA, value=json.dumps(meta))
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp))


def check_format(fmt: str) -> None:
    """PipelineError (one line) unless ``fmt`` is an export format this installation can write."""
    if fmt not in FORMATS:
        raise PipelineError(f"--format: {fmt!r} is not an export format; allowed: {', '.join(FORMATS)}")
    if fmt == "onnx":
        _onnx()


def export_policy(source: Policy | str | os.PathLike, fmt: str, out: str | os.PathLike, *,
                  checkpoint_path: str | os.PathLike | None = None) -> Path:
    """Write the deterministic policy of ``source`` (a ``Policy``, or what ``load_policy`` takes)
    to ``out`` in ``fmt`` (torchscript or onnx); returns ``out``. PipelineError (one line), nothing
    written, for an unknown format, onnx missing, a bad path or an algorithm without ``policy_module``."""
    check_format(fmt)
    out = Path(out)
    if out.is_dir():
        raise PipelineError(f"--out: {str(out)!r} is a directory; allowed: a file path")
    policy = source if isinstance(source, Policy) else load_policy(source, checkpoint_path=checkpoint_path)
    try:
        module = policy.module()
    except NotImplementedError as err:
        raise PipelineError(f"export: {err}") from None
    example = examples(policy)
    inputs = input_names(policy, example)
    if leaf_shapes(policy.observation_space) is not None:  # one input per leaf
        from tianji_dask.algos.policy import LeafInputs

        module = LeafInputs(module, [name[len("obs."):] for name in inputs])
    write = _torchscript if fmt == "torchscript" else _onnx_file
    made = [d for d in out.parents if not d.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        with torch.no_grad():
            write(module, example, tmp, metadata(policy), inputs)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for d in made:  # deepest first: the folders made for it, left empty
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    return out
