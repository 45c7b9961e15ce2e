"""Tensor parallelism: shard a model's linear layers over a 1-D "tp" device mesh.

A *plan* maps module names (``"layers.*.mlp.up_proj"``; ``*`` stands for
one dotted component) to a torch ``ParallelStyle`` or to one of the strings
transformers uses in ``tp_plan`` / ``config.base_model_tp_plan``
(``"colwise"``, ``"rowwise"``, ``"colwise_rep"``, ``"rowwise_rep"``,
``"sequence_parallel"``). :func:`apply_tensor_parallel` expands the patterns
to concrete module names and hands them to ``parallelize_module``.

Example:
    >>> import hasten
    >>> def shard():  # in each of 2 processes
    ...     from torch.distributed.device_mesh import init_device_mesh
    ...     hasten.PartialState(cpu=True)  # creates the process group
    ...     torch.manual_seed(0)
    ...     mlp = torch.nn.ModuleDict({"up": torch.nn.Linear(8, 32), "down": torch.nn.Linear(32, 8)})
    ...     apply_tensor_parallel(mlp, init_device_mesh("cpu", (2,)), {"up": "colwise", "down": "rowwise"})
    ...     assert mlp["up"].weight.to_local().shape == (16, 8)  # half of the 32 rows in each process
    >>> hasten.debug_launcher(shard, num_processes=2)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

PlanValue = Union[str, "ParallelStyle"]

__all__ = ["apply_tensor_parallel", "expand_tp_plan", "model_tp_plan", "tp_style"]


def tp_style(name: str) -> ParallelStyle:
    """The torch ``ParallelStyle`` for a transformers-style plan string.

    Example:
        >>> type(tp_style("colwise")).__name__
        'ColwiseParallel'
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        # "_rep": the layer's output (colwise) or input (rowwise) is replicated, e.g. an lm_head whose logits
        # every rank needs whole
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(),
        # rowwise whose output stays sharded on the sequence dim, for a following sequence_parallel norm
        "rowwise_seq": lambda: RowwiseParallel(output_layouts=Shard(1)),
    }
    factory = styles.get(name)
    if factory is None:
        raise ValueError(f"unknown tensor-parallel style {name!r}; use one of {sorted(styles)} or pass a "
                         "torch.distributed.tensor.parallel.ParallelStyle object.")
    return factory()


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # "*" matches exactly one dotted component, as in transformers' plans ("layers.*.mlp")
    return re.compile("^" + r"[^.]+".join(re.escape(part) for part in pattern.split("*")) + "$")


def expand_tp_plan(model: torch.nn.Module, plan: Mapping[str, PlanValue], strict: bool = True) -> dict[str, PlanValue]:
    """Resolve the wildcard patterns of `plan` to the names of the model's modules, in model order.

    A module matched by several patterns takes the most specific one (fewest
    ``*``; the first listed on a tie). With ``strict=True`` a pattern that
    matches no module is an error (a typo would otherwise silently leave
    layers whole); a model's own plan is expanded with ``strict=False``
    because it lists modules some variants lack.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> expand_tp_plan(net, {"*": "colwise", "2": "rowwise"}, strict=False)
        {'0': 'colwise', '1': 'colwise', '2': 'rowwise'}
    """
    compiled = [(pattern, _pattern_regex(pattern), value) for pattern, value in plan.items()]
    matched_patterns: set[str] = set()
    chosen: dict[str, tuple[int, PlanValue]] = {}
    for name, _ in model.named_modules():
        if not name:  # the root has no name to match
            continue
        for pattern, regex, value in compiled:
            if regex.match(name):
                matched_patterns.add(pattern)
                wildcards = pattern.count("*")
                if name not in chosen or wildcards < chosen[name][0]:
                    chosen[name] = (wildcards, value)
    missing = [pattern for pattern in plan if pattern not in matched_patterns]
    if strict and missing:
        raise ValueError(f"tensor-parallel plan entries {missing} match no module of {type(model).__name__}; "
                         "fix the names (see model.named_modules()) or drop those entries.")
    return {name: value for name, (_, value) in chosen.items()}


def model_tp_plan(model: torch.nn.Module) -> dict[str, PlanValue] | None:
    """The plan a model carries itself: ``tp_plan``, ``_tp_plan``, then ``config.base_model_tp_plan``.

    transformers keeps the base model's plan in its config with names relative
    to the base model (``"layers.*.self_attn.q_proj"``), so those are
    prefixed with ``base_model_prefix`` when the base model is a submodule.

    Example:
        >>> model_tp_plan(torch.nn.Linear(2, 2)) is None
        True
    """
    plan: dict[str, PlanValue] = {}
    for attribute in ("tp_plan", "_tp_plan"):
        value = getattr(model, attribute, None)
        if isinstance(value, Mapping) and value:
            plan.update(value)
            break
    base_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if isinstance(base_plan, Mapping) and base_plan:
        prefix = getattr(model, "base_model_prefix", "")
        has_base = bool(prefix) and isinstance(getattr(model, prefix, None), torch.nn.Module)
        for pattern, value in base_plan.items():
            plan.setdefault(f"{prefix}.{pattern}" if has_base else pattern, value)
    return plan or None


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh,
                          plan: Mapping[str, PlanValue] | None = None) -> torch.nn.Module:
    """Shard `model` in place over `tp_mesh` following `plan` (or the model's own plan); returns the model.

    Args:
        model: the module to shard; every process of `tp_mesh` must build it with the same weights.
        tp_mesh: the 1-D tensor-parallel mesh (``config.submesh("tp")``); a mesh with a ``"tp"`` dim is
            accepted and sliced.
        plan: ``{module name pattern: ParallelStyle | "colwise" | "rowwise" | ...}``; when omitted the
            model's ``tp_plan`` / ``_tp_plan`` / ``config.base_model_tp_plan`` is used.

    After it, sharded parameters are DTensors (``param.full_tensor()`` gathers
    one), every process of `tp_mesh` must feed the same inputs, and the
    default styles return ordinary (local) tensors. Build the optimizer after
    this call.

    Example:
        >>> import hasten
        >>> def shard():  # in each of 2 processes
        ...     from torch.distributed.device_mesh import init_device_mesh
        ...     hasten.PartialState(cpu=True)
        ...     torch.manual_seed(0)
        ...     mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        ...     x = torch.randn(4, 8)
        ...     expected = mlp(x)
        ...     apply_tensor_parallel(mlp, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)),
        ...                           {"0": "colwise", "2": "rowwise"})
        ...     assert torch.allclose(mlp(x), expected, atol=1e-6)  # same output, half the weights each
        >>> hasten.debug_launcher(shard, num_processes=2)
    """
    from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

    if tp_mesh.ndim != 1:
        if "tp" not in (tp_mesh.mesh_dim_names or ()):
            raise ValueError(f"apply_tensor_parallel needs a 1-D mesh or one with a 'tp' dim, got dims "
                             f"{tp_mesh.mesh_dim_names}; pass mesh['tp'].")
        tp_mesh = tp_mesh["tp"]
    strict = plan is not None
    if plan is None:
        plan = model_tp_plan(model)
        if plan is None:
            raise ValueError(f"{type(model).__name__} has no tensor-parallel plan (no tp_plan, _tp_plan or "
                             "config.base_model_tp_plan); pass plan={'module.name': 'colwise' | 'rowwise', ...}.")
    resolved = {}
    for name, value in expand_tp_plan(model, plan, strict=strict).items():
        if isinstance(value, str):
            value = tp_style(value)
        elif not isinstance(value, ParallelStyle):
            raise TypeError(f"tensor-parallel plan entry for {name!r} is {type(value).__name__}; use a "
                            "ParallelStyle or a style name such as 'colwise'.")
        resolved[name] = value
    if not resolved:
        raise ValueError(f"the tensor-parallel plan matched no module of {type(model).__name__}; check its names "
                         "against model.named_modules().")
    parallelize_module(model, tp_mesh, resolved)
    return model
