"""A policy written for use outside the project: TorchScript (``torch.jit.trace``, loaded back with
``torch.jit.load``) or ONNX (opset 17, through torch's TorchScript-based exporter, which needs
onnx and no onnxscript; a dynamic batch dimension). Input ``obs``: float32 (B, *obs shape), as the
env gives them; output ``action``: int64 (B,) for Discrete, float32 (B, A) for Box. A recurrent
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

import torch

from tianji_dask.errors import PipelineError
from tianji_dask.export.load import Policy, load_policy

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
    action = {"discrete": int(space.n)} if hasattr(space, "n") else {
        "shape": list(space.shape), "low": space.low.tolist(), "high": space.high.tolist()}
    meta = {"checkpoint": policy.checkpoint, "version": policy.version, "algorithm": type(policy.algorithm).__name__,
            "observation_shape": list(policy.observation_space.shape), "action": action}
    state = policy.initial_state()
    if state is not None:
        meta["state_shape"] = list(state.shape)
    return meta


def examples(policy: Policy) -> tuple[torch.Tensor, ...]:
    """What the module is traced with: a batch of two zero observations (and initial states)."""
    obs = torch.zeros((2, *policy.observation_space.shape), dtype=torch.float32)
    state = policy.initial_state(2)
    return (obs,) if state is None else (obs, torch.from_numpy(state))


def _torchscript(module: torch.nn.Module, example: tuple[torch.Tensor, ...], tmp: Path, meta: dict) -> None:
    with warnings.catch_warnings():  # deprecated in favour of torch.export, which TorchScript files do not come from
        warnings.filterwarnings("ignore", r"`torch\.jit\.(trace|save)", DeprecationWarning)
        traced = torch.jit.trace(module, example)
        torch.jit.save(traced, str(tmp), _extra_files={METADATA: json.dumps(meta)})


def _onnx_file(module: torch.nn.Module, example: tuple[torch.Tensor, ...], tmp: Path, meta: dict) -> None:
    onnx = _onnx()
    inputs, outputs = (["obs"], ["action"]) if len(example) == 1 else (["obs", "state"], ["action", "new_state"])
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
    write = _torchscript if fmt == "torchscript" else _onnx_file
    made = [d for d in out.parents if not d.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        with torch.no_grad():
            write(module, example, tmp, metadata(policy))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for d in made:  # deepest first: the folders made for it, left empty
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    return out
