"""What the newest Accelerator of this process decided (Accelerate's ``AcceleratorState``).

`AcceleratorState` is a `PartialState` plus the run's decisions: distributed
type, precision, engine plugins. They are process-wide facts, as in
Accelerate, so that `AcceleratorState()` created by a library reports what
the user's Accelerator chose.
"""

from __future__ import annotations

from typing import Any

from .state import PartialState, _partial_facts

__all__ = ["AcceleratorState", "is_initialized", "shared_deepspeed_plugins", "activate_deepspeed_plugins"]

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
        """The active `DeepSpeedPlugin`: of named ones the selected one (the first until another is selected); None
        when the run is not DeepSpeed."""
        plugins = self.deepspeed_plugins
        if plugins is None or self.distributed_type != "DEEPSPEED":
            return None
        if not isinstance(plugins, dict):
            return plugins
        return next((plugin for plugin in plugins.values() if plugin.selected), None)

    @property
    def deepspeed_plugins(self) -> Any:
        """The DeepSpeed plugin(s) the Accelerator was given: one plugin, or a dict of named ones (None without)."""
        return self._fact("deepspeed_plugins", self._fact("deepspeed_plugin"))

    def _named_plugins(self, call: str) -> dict[str, Any]:
        if self.distributed_type != "DEEPSPEED":
            raise ValueError(f"{call} needs DeepSpeed, which is not enabled: configure the Accelerator for deepspeed "
                             "(deepspeed_plugins={...} or --use_deepspeed) before calling it.")
        plugins = self.deepspeed_plugins
        return plugins if isinstance(plugins, dict) else {}

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The `DeepSpeedPlugin` the Accelerator was given under `name` (``deepspeed_plugins={name: plugin, ...}``).

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).state.get_deepspeed_plugin("student")
            Traceback (most recent call last):
            ...
            ValueError: get_deepspeed_plugin needs DeepSpeed, which is not enabled: configure the Accelerator for deepspeed (deepspeed_plugins={...} or --use_deepspeed) before calling it.
        """
        return _named(self._named_plugins("get_deepspeed_plugin"), name)

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin named `name` the active one: models prepared from now on are set up under it.

        Example:
            >>> from hasten import Accelerator
            >>> Accelerator(cpu=True).state.select_deepspeed_plugin("teacher")
            Traceback (most recent call last):
            ...
            ValueError: select_deepspeed_plugin needs DeepSpeed, which is not enabled: configure the Accelerator for deepspeed (deepspeed_plugins={...} or --use_deepspeed) before calling it.
        """
        plugins = self._named_plugins("select_deepspeed_plugin")
        chosen = _named(plugins, name)
        for plugin in plugins.values():
            if plugin is not chosen:
                plugin._unselect()
        chosen.select(_from_accelerator_state=True)

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
        """None, as in Accelerate 1.16 (its Accelerator turns the plugin into ``parallelism_config`` instead)."""
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


def _named(plugins: dict[str, Any], name: str | None) -> Any:
    if name not in plugins:
        raise KeyError(f"no DeepSpeedPlugin is named {name!r}; the Accelerator's named plugins are {sorted(plugins)} "
                       "(pass deepspeed_plugins={name: DeepSpeedPlugin(...), ...} to name them).")
    return plugins[name]


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


def shared_deepspeed_plugins() -> Any:
    """The DeepSpeed plugin(s) of the process's newest Accelerator, if it runs DeepSpeed: an `Accelerator()` given none
    shares them, as in Accelerate (a second Accelerator trains a second model under them); None otherwise.

    Example:
        >>> AcceleratorState._reset_state(); shared_deepspeed_plugins() is None
        True
    """
    return _run_facts.get("deepspeed_plugins") if _run_facts.get("distributed_type") == "DEEPSPEED" else None


def activate_deepspeed_plugins(plugins: Any) -> None:
    """A new Accelerator's start, as Accelerate's: its one plugin, or the first of its named ones, is selected.

    Example:
        >>> from types import SimpleNamespace
        >>> class Plugin(SimpleNamespace):
        ...     def select(self, _from_accelerator_state=False): self.selected = True
        ...     def _unselect(self): self.selected = False
        >>> student, teacher = Plugin(selected=False), Plugin(selected=True)
        >>> activate_deepspeed_plugins({"student": student, "teacher": teacher}); student.selected, teacher.selected
        (True, False)
    """
    given = list(plugins.values()) if isinstance(plugins, dict) else [plugins]
    if not given or not all(callable(getattr(plugin, "select", None)) for plugin in given):
        return  # not plugins: the strategy refuses them, saying what it got
    for plugin in given[1:]:
        plugin._unselect()
    given[0].select(_from_accelerator_state=True)


def is_initialized() -> bool:
    """True once an `Accelerator` was created in this process (and `AcceleratorState._reset_state` not called since).

    Example:
        >>> isinstance(is_initialized(), bool)
        True
    """
    return bool(_run_facts)
