"""The one place that decides an Accelerator's gradient accumulation, and so the global batch.

From, in order: the Accelerator's arguments (`gradient_accumulation_steps`
or a `GradientAccumulationPlugin`), the launch (`hasten launch
--gradient_accumulation_steps`), 1. In an elastic run (`--num_machines
MIN:MAX`) that number is the recipe at MAX processes, a DeepSpeed config's own
numbers fill it where none was given, and this process trains its share of
each step (`facade/elastic.py`). Decided once, in `Accelerator()`, before any
engine exists: engines are handed the numbers and write none back.

Example:
    >>> from hasten.process.launch_spec import LaunchSpec
    >>> decide_accumulation(None, 4, LaunchSpec(), world=1, rank=0).plugin.num_steps
    4
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ..options import GradientAccumulationPlugin
from ..process.launch_spec import LaunchSpec

if TYPE_CHECKING:
    from .elastic import ElasticRun

__all__ = ["Accumulation", "decide_accumulation"]


class Accumulation(NamedTuple):
    """What `decide_accumulation` decided: the plugin this process trains with, whether the user chose the number,
    an elastic run (None otherwise) and, under DeepSpeed in one, the engine's `ElasticBatch`."""

    plugin: GradientAccumulationPlugin
    given: bool
    elastic: ElasticRun | None = None
    elastic_batch: Any = None


def decide_accumulation(plugin: GradientAccumulationPlugin | None, steps: int | None, spec: LaunchSpec, *, world: int,
                        rank: int, deepspeed_plugin: Any = None) -> Accumulation:
    """The accumulation (see the module doc); a bad number or both arguments is one sentence.

    Example:
        >>> decide_accumulation(GradientAccumulationPlugin(num_steps=2), 2, LaunchSpec(), world=1, rank=0)
        Traceback (most recent call last):
        ...
        ValueError: pass gradient_accumulation_steps or gradient_accumulation_plugin, not both.
    """
    given = not (plugin is None and steps is None and spec.gradient_accumulation_steps is None)
    if plugin is not None and steps is not None:
        raise ValueError("pass gradient_accumulation_steps or gradient_accumulation_plugin, not both.")
    if plugin is None:
        number = next((v for v in (steps, spec.gradient_accumulation_steps) if v is not None), 1)
        plugin = GradientAccumulationPlugin(num_steps=number)
    if plugin.num_steps is not None and (not isinstance(plugin.num_steps, int) or plugin.num_steps < 1):
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {plugin.num_steps!r}.")
    if spec.elastic is None:
        return Accumulation(plugin, given)
    from .elastic import elastic_run  # (loaded by elastic runs only)

    plugin, run, batch = elastic_run(spec, world, rank, plugin, given, deepspeed_plugin)
    return Accumulation(plugin, given, run, batch)
