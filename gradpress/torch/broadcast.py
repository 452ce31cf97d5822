"""Broadcasts: parameters, optimizer state and objects from one root worker.

A broadcast is a push_pull in which every worker but the root contributes zeros,
as in BytePS. ``broadcast_object`` takes any picklable object, as BytePS does; the
bytes come only from the job's own push_pulls and are size-limited (objects.py). The
optimizer state's own layout travels as msgpack (plain values, tuples, arrays), so
the library itself never unpickles anything.
"""
from __future__ import annotations

import pickle
from typing import Any

import msgpack
import numpy as np
import torch

from . import handles, ops
from .dtypes import dtype_name
from .key_layouts import KeyLayouts
from .objects import MAX_OBJECT_BYTES, broadcast_bytes, check_root, unpickled

_EXT_TUPLE, _EXT_NDARRAY, _EXT_TENSOR = 1, 2, 3
_layouts = KeyLayouts()  # a broadcast's key -> (shape, dtype) it carried


def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter.") -> None:
    """Overwrite ``params`` on every worker with the root's values.

    Args:
        params: ``model.state_dict()`` (a dict), ``model.named_parameters()`` or a list of
            (name, tensor) pairs, or a list of tensors (named by position, shape and dtype:
            a later call with other tensors gets keys of its own).
        root_rank: the worker whose values win.
    """
    check_root(root_rank, "broadcast_parameters")
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (_unnamed(i, p), p) for i, p in enumerate(params)]
    for name, t in items:
        if not torch.is_tensor(t):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
    with torch.no_grad():
        for wave in _waves(_distinct(items)):
            with handles.all_waited(ops.synchronize) as started:
                for name, t in wave:
                    if ops.rank() != root_rank:
                        t.zero_()
                    started.append(ops.push_pull_async_inplace(t.data, average=False, name=_key(prefix + name, t)))


def _distinct(items: list) -> list:
    """``items`` without the later names of a tensor named twice: tied weights (a language
    model's embedding and output layer) are two keys of one ``state_dict`` over the same
    memory. Pushed once each, a worker's second push would read the root's value landed by
    the first, and the sum would be the root's times the workers."""
    seen, out = set(), []
    for name, t in items:
        try:
            where = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        except RuntimeError:  # (a tensor without storage of its own, e.g. sparse: never an alias here)
            where = id(t)
        if where not in seen:
            seen.add(where)
            out.append((name, t))
    return out


def _waves(items: list) -> list[list]:
    """``items`` in waves, broadcast one after another, such that no two tensors of a wave
    share memory (views of one buffer that overlap without being the same tensor): within a
    wave, one's landing could be read by the other's push, doubling the root's values."""
    spans = [_span(t) for _, t in items]
    ordered = sorted(s for s in spans if s is not None)
    if all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(ordered, ordered[1:])):
        return [items]   # (the usual case, checked in n log n: DDP broadcasts buffers every forward)
    waves: list[tuple[list, list]] = []   # (items, the (device, first byte, end) spans they take)
    for (name, t), span in zip(items, spans):
        for wave, taken in waves:
            if span is None or not any(d == span[0] and a < span[2] and span[1] < b for d, a, b in taken):
                break
        else:
            wave, taken = [], []
            waves.append((wave, taken))
        wave.append((name, t))
        if span is not None:
            taken.append(span)
    return [wave for wave, _ in waves]


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    """(device, first byte's address, end) that ``t``'s elements lie within; None for none."""
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    first = t.data_ptr()
    last = first + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) * t.element_size()
    return str(t.device), first, last + t.element_size()


def _key(name: str, t: torch.Tensor) -> str:
    """``name``, unless a broadcast of this job sent a tensor of another shape or dtype under
    it (a GAN's second model, whose parameter names are the first's; its optimizer's state):
    then the name with this tensor's shape and dtype, a key of its own."""
    layout = (tuple(t.shape), t.dtype)
    if not _layouts.claim(name, layout):
        name = f"{name}.{'x'.join(map(str, layout[0])) or 'scalar'}.{dtype_name(t.dtype)}"
        _layouts.claim(name, layout)
    return name


def _unnamed(position: int, t) -> str:
    """An unnamed tensor's key: the same in every call that passes a tensor of this shape and
    dtype at this position (keys are reused, not piled up), another for a different one."""
    if not torch.is_tensor(t):
        return f"param.{position}"  # (refused by the caller, by this name)
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    return f"param.{position}.{shape}.{dtype_name(t.dtype)}"


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     max_bytes: int = MAX_OBJECT_BYTES) -> Any:
    """Every worker gets the root's ``obj`` (any picklable object; the others pass anything).

    Raises:
        ObjectError: on every worker, when the root's object does not pickle or pickles
            to more than ``max_bytes`` (the root's reason is in the message); on a
            worker where it does not unpickle, naming the root.
    """
    check_root(root_rank, "broadcast_object")
    payload, error = None, None
    if ops.rank() == root_rank:
        try:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - pickling raises many types; all end the same way
            error = f"{type(obj).__name__} does not pickle: {type(e).__name__}: {e}"
    data = broadcast_bytes(payload, error, root_rank, name or "broadcast_object", max_bytes)
    # the root keeps its own object, as in BytePS (not a copy that costs an unpickle)
    return obj if ops.rank() == root_rank else unpickled(data, f"the root (rank {root_rank})")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              prefix: str = "Parameter.") -> None:
    """Make every worker's optimizer state (and hyper-parameters) equal to the root's.

    The root's state layout travels first, so workers whose optimizer has not stepped
    yet (no state) receive the full state as well.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state (it holds non-tensor history)")
    check_root(root_rank, "broadcast_optimizer_state")
    sd = optimizer.state_dict()
    is_root = ops.rank() == root_rank
    layout = None
    if is_root:
        layout = {"class": type(optimizer).__name__,
                  "param_groups": sd["param_groups"], "group_devices": _devices_of(sd["param_groups"]),
                  "own": _own_scalars(sd),
                  "state": {pid: {k: (["tensor", list(v.shape), dtype_name(v.dtype)]
                                      if torch.is_tensor(v) else ["value", v])
                                  for k, v in st.items()}
                            for pid, st in sd["state"].items()}}
    packed, error = None, None
    if is_root:
        try:
            packed = _pack(layout)
        except TypeError as e:  # every worker fails with it, not only the root
            error = str(e)
    layout = _unpack(broadcast_bytes(packed, error, root_rank, prefix + "optimizer_layout"))
    if layout.get("class", type(optimizer).__name__) != type(optimizer).__name__:  # (loaded, it lost its own keys)
        raise ValueError(f"broadcast_optimizer_state: the root's (rank {root_rank}) optimizer is {layout['class']}, "
                         f"this worker's is {type(optimizer).__name__}: every worker needs the same optimizer class")
    state = {}
    with handles.all_waited(ops.synchronize) as started:
        for pid, entries in sorted(layout["state"].items()):
            state[pid] = {}
            for k, (kind, *spec) in sorted(entries.items()):
                if kind == "value":
                    state[pid][k] = spec[0]
                    continue
                shape, dtype = spec
                t = sd["state"][pid][k] if is_root else torch.zeros(shape, dtype=getattr(torch, dtype))
                state[pid][k] = t
                started.append(ops.push_pull_async_inplace(t, average=False, name=_key(f"{prefix}opt.{pid}.{k}", t)))
    _check_own_state(sd, layout["own"], is_root, root_rank, prefix)
    if not is_root:
        _placed(layout["param_groups"], layout["group_devices"], optimizer)
        optimizer.load_state_dict({"state": state, "param_groups": layout["param_groups"]})


def _own_scalars(sd: dict) -> dict[str, str]:
    """gradpress's own optimizer state beside torch's (``gradpress_lowrank``, ``onebit``,
    ``zero_one``, ``gradpress_compression``: step counts, phases, schedules, plans), its
    scalars by path, as text. Not its floats: a plan's reference time is each worker's own
    measure, and a phase or a step that differs shows in the integers."""
    found: dict[str, str] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}/{i}")
        elif obj is None or isinstance(obj, (bool, int, str)):
            found[path] = repr(obj)
    for key, value in sd.items():
        if key not in ("state", "param_groups"):
            walk(value, key)
    return found


def _check_own_state(sd: dict, root_own: dict, is_root: bool, root_rank: int, prefix: str) -> None:
    """gradpress's own optimizer state does not travel (its residuals and error buffers are
    each worker's): where a worker's phase or step there is not the root's (the root alone
    loaded a checkpoint), the workers would push different tensors and wait out their
    deadlines, or drift apart. Every worker raises, at once, naming what differs."""
    mine = _own_scalars(sd)
    differ = sorted(k for k in set(mine) | set(root_own) if mine.get(k) != root_own.get(k))
    flags = torch.zeros(ops.size(), dtype=torch.float64)
    flags[ops.rank()] = 0.0 if is_root or not differ else 1.0
    ops.push_pull_inplace(flags, average=False, name=prefix + "optimizer_own_state")
    apart = [w for w, f in enumerate(flags.tolist()) if f]
    if apart:
        here = f", here at {differ[:4]}" if differ else ""
        raise ValueError(f"broadcast_optimizer_state: gradpress's own optimizer state (step counts, phases, "
                         f"factors; it does not travel, each worker's residuals being its own) differs from the "
                         f"root's (rank {root_rank}) on worker(s) {apart}{here}: restore the checkpoint on every "
                         f"worker (each its own) rather than on the root alone")


def _devices_of(groups: list[dict]) -> list[dict]:
    """By group, the device type of each tensor among the hyper-parameters (a learning rate
    kept on the GPU for a capturable or fused optimizer): they travel through the host."""
    return [{k: v.device.type for k, v in g.items() if torch.is_tensor(v)} for g in groups]


def _placed(groups: list[dict], devices: list[dict], optimizer: torch.optim.Optimizer) -> None:
    """Put the root's tensor hyper-parameters in ``groups`` back on this worker's device of
    the type they had on the root: the local value's device, else the group's parameters'
    (torch's ``load_state_dict`` moves the state to the parameters, never ``param_groups``)."""
    for group, local, where in zip(groups, optimizer.param_groups, devices):
        for key, kind in where.items():
            if kind == "cpu" or not torch.is_tensor(group.get(key)):
                continue
            mine, params = local.get(key), local["params"]
            if torch.is_tensor(mine) and mine.device.type == kind:
                group[key] = group[key].to(mine.device)
            elif params and params[0].device.type == kind:
                group[key] = group[key].to(params[0].device)
            else:
                group[key] = group[key].to(kind)


def _pack(obj: Any) -> bytes:
    def default(o):
        if isinstance(o, np.generic):  # a numpy scalar (a learning rate computed with numpy)
            return o.item()
        if isinstance(o, tuple):
            return msgpack.ExtType(_EXT_TUPLE, _pack(list(o)))
        if isinstance(o, np.ndarray):
            return msgpack.ExtType(_EXT_NDARRAY, _pack([o.dtype.str, list(o.shape), o.tobytes()]))
        if torch.is_tensor(o):
            t = o.detach().cpu()
            try:
                a = t.numpy()
            except TypeError:  # numpy has no such dtype (a bfloat16 learning rate): its bytes, named by torch
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                return msgpack.ExtType(_EXT_TENSOR, _pack([str(t.dtype), list(t.shape), raw]))
            return msgpack.ExtType(_EXT_TENSOR, _pack([a.dtype.str, list(a.shape), a.tobytes()]))
        raise TypeError(f"the optimizer state holds a {type(o).__name__}; it may hold None, bool, int, "
                        f"float, str, bytes, lists, tuples, dicts, numpy arrays and scalars, and tensors")
    return msgpack.packb(obj, default=default, use_bin_type=True, strict_types=True)


def _unpack(data: bytes) -> Any:
    def ext_hook(code, payload):
        value = _unpack(payload)
        if code == _EXT_TUPLE:
            return tuple(value)
        dtype, shape, raw = value
        if code == _EXT_TENSOR and dtype.startswith("torch."):
            kind = getattr(torch, dtype[len("torch."):], None)
            if not isinstance(kind, torch.dtype):
                raise ValueError(f"the root's optimizer state holds a tensor of {dtype!r}, not a torch dtype")
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape) if raw \
                else torch.empty(shape, dtype=kind)
        a = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        return a if code == _EXT_NDARRAY else torch.from_numpy(a)
    return msgpack.unpackb(data, ext_hook=ext_hook, raw=False, strict_map_key=False)
