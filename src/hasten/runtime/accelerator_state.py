"""What the newest Accelerator of this process decided (Accelerate's ``AcceleratorState``).

`AcceleratorState` is a `PartialState` plus the run's decisions: distributed
type, precision, engine plugins. They are process-wide facts, as in
Accelerate, so that `AcceleratorState()` created by a library reports what
the user's Accelerator chose.
"""

from __future__ import annotations

from typing import Any

from .state import PartialState, _partial_facts

__all__ = ["AcceleratorState", "is_initialized"]

# The run's decisions (strategy, precision, plugins): the facts `AcceleratorState()` reports when third-party
# code creates one on its own, as peer libraries do. Two levels, as in the peer: `AcceleratorState._reset_state()`
# forgets `_run_facts` only; an Accelerator also tells `PartialState` its distributed type (`_partial_facts`).
_run_facts: dict[str, Any] = {}

_STALE = ("`AcceleratorState` object has no attribute `{name}`. This happens if `AcceleratorState._reset_state()` "
          "was called and an `Accelerator` or `PartialState` was not reinitialized; create a new `Accelerator`.")


class AcceleratorState(PartialState):
    """`PartialState` plus what the `Accelerator` decided: distributed type, precision, engine plugins.

    `accelerator.state` is one; `AcceleratorState()` created elsewhere (as
    libraries written for the peer do) reports the newest Accelerator's
    decisions, or a plain run's defaults when none exists yet.

    Example:
        >>> from hasten import Accelerator
        >>> accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        >>> AcceleratorState().mixed_precision, accelerator.state.distributed_type.value
        ('bf16', 'NO')
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool | None = None,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        """The process's state (`cpu`, and `backend` / `timeout` in `kwargs`, as `PartialState`) with the run's decisions.

        The settings are the Accelerator's to make: once one exists, asking
        for another `mixed_precision` is refused as Accelerate refuses it;
        before one exists, settings are taken only from an Accelerator
        (`_from_accelerator=True`), and a `megatron_lm_plugin` never (hasten
        has no Megatron-LM engine).
        """
        super().__init__(cpu, **kwargs)
        if megatron_lm_plugin is not None:
            raise NotImplementedError("AcceleratorState(megatron_lm_plugin=...) needs the Megatron-LM engine, which "
                                      "hasten does not have; train with DDP, FSDP or DeepSpeed instead.")
        settings = {name: value for name, value in dict(
            mixed_precision=mixed_precision, dynamo_plugin=dynamo_plugin, deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin, parallelism_config=parallelism_config,
        ).items() if value is not None}
        if _run_facts:
            current = _run_facts.get("mixed_precision", "no")
            if mixed_precision is not None and mixed_precision != current and (
                    _run_facts.get("distributed_type") != "DEEPSPEED"):
                raise ValueError(f"AcceleratorState has already been initialized and cannot be changed: this run uses "
                                 f"mixed_precision={current!r}; restart your runtime completely and pass "
                                 f"`mixed_precision='{mixed_precision}'` to `Accelerator()`.")
        elif settings:
            if not _from_accelerator:
                raise ValueError("AcceleratorState(...) takes its settings from an Accelerator: properly initialize "
                                 "your accelerator via `accelerator = Accelerator(...)` with these settings first.")
            from ..options import DistributedType

            if deepspeed_plugin is not None:  # as the peer: the engine plugin given decides the kind of run
                settings["distributed_type"] = DistributedType.DEEPSPEED
            elif fsdp_plugin is not None and self.topology.is_distributed:
                settings["distributed_type"] = DistributedType.FSDP
            settings.setdefault("mixed_precision", "no")
            self._record(**settings)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget what the newest Accelerator decided: `AcceleratorState()` reports a plain run's defaults again.

        Example:
            >>> AcceleratorState._reset_state(); is_initialized()
            False
        """
        _run_facts.clear()
        if reset_partial_state:
            PartialState._reset_state()

    _owned = False  # True for an Accelerator's own state (which breaks, as the peer's does, after a reset)

    def _check_alive(self, name: str) -> None:
        """An `AcceleratorState` follows its own reset (`_check_current`), not `PartialState`'s."""

    def _record(self, **facts: Any) -> None:
        """Called once by the Accelerator that owns this state, after choosing its strategy."""
        _run_facts.clear()
        _run_facts.update(facts)
        _partial_facts["distributed_type"] = facts.get("distributed_type")
        self._owned = True

    def _check_current(self, name: str) -> None:
        """An Accelerator's state after `AcceleratorState._reset_state()` (and before a new Accelerator) refuses use."""
        if self._owned and not _run_facts:
            raise AttributeError(_STALE.format(name=name))

    def _fact(self, name: str, default: Any = None) -> Any:
        self._check_current(name)
        return _run_facts.get(name, default)

    @property
    def distributed_type(self) -> Any:
        """What the newest Accelerator chose (settable, as in the peer); the environment's kind before one exists.

        Example:
            >>> from hasten import Accelerator, DistributedType
            >>> state = Accelerator(cpu=True).state
            >>> state.distributed_type = DistributedType.FSDP; state.distributed_type.value
            'FSDP'
            >>> AcceleratorState._reset_state(True)
        """
        return self._fact("distributed_type") or PartialState._launched_or_told(self)

    @distributed_type.setter
    def distributed_type(self, value: Any) -> None:
        self._check_current("distributed_type")
        _run_facts["distributed_type"] = value

    @property
    def mixed_precision(self) -> str:
        return self._fact("mixed_precision", "no")

    @property
    def deepspeed_plugin(self) -> Any:
        return self._fact("deepspeed_plugin")

    @property
    def deepspeed_plugins(self) -> Any:
        """The DeepSpeed plugin(s) the Accelerator was given: one plugin, or a dict of named ones (None without)."""
        return self._fact("deepspeed_plugins", self._fact("deepspeed_plugin"))

    @property
    def fsdp_plugin(self) -> Any:
        return self._fact("fsdp_plugin")

    @property
    def parallelism_config(self) -> Any:
        return self._fact("parallelism_config")

    @property
    def is_fsdp2(self) -> bool:
        """True when the run is sharded by FSDP; hasten's FSDP is always FSDP2 (``fully_shard``), even for fsdp_version=1."""
        return self.distributed_type == "FSDP"  # a str enum: equal to its value (its str() is "DistributedType.FSDP")

    @property
    def dynamo_plugin(self) -> Any:
        return self._fact("dynamo_plugin")

    @property
    def megatron_lm_plugin(self) -> Any:
        return None

    @property
    def torch_tp_plugin(self) -> Any:
        """None, as in Accelerate 1.15 (its Accelerator turns the plugin into ``parallelism_config`` instead)."""
        return None

    @property
    def use_ipex(self) -> bool:
        return False

    @property
    def initialized(self) -> bool:
        return bool(_run_facts)

    def __repr__(self) -> str:
        return (f"AcceleratorState(distributed_type={self.distributed_type.value}, num_processes={self.num_processes}, "
                f"process_index={self.process_index}, device={self.device}, mixed_precision={self.mixed_precision!r})")


def _guarded(name: str) -> property:
    """A `PartialState` property that, on an Accelerator's state, first checks the state was not reset."""
    base = getattr(PartialState, name)

    def get(self: AcceleratorState) -> Any:
        self._check_current(name)
        return base.fget(self)

    return property(get, doc=base.__doc__)


# As in the peer, the "who am I" questions (is_main_process, use_distributed, ...) keep working after a reset:
# there they are asked of PartialState; the numbers themselves are the reset state's.
for _name in ("num_processes", "process_index", "local_process_index"):
    setattr(AcceleratorState, _name, _guarded(_name))


def is_initialized() -> bool:
    """True once an `Accelerator` was created in this process (and `AcceleratorState._reset_state` not called since).

    Example:
        >>> isinstance(is_initialized(), bool)
        True
    """
    return bool(_run_facts)
