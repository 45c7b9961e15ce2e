"""The prepared optimizer: steps only on synchronising steps, through the fp16 scaler when there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from .gradient_state import GradientState

if TYPE_CHECKING:
    from .precision import PrecisionPolicy

__all__ = ["AcceleratedOptimizer", "OptimizerSteps", "move_to_device", "patch_optimizer_step"]


class OptimizerSteps(Protocol):
    """How a step and a zero_grad are done (the strategy, with its precision): what `AcceleratedOptimizer` needs.

    Example:
        >>> from hasten.strategies.base import Strategy
        >>> steps: OptimizerSteps = Strategy(torch.device("cpu"))
        >>> steps.precision.scaler is None
        True
    """

    @property
    def precision(self) -> PrecisionPolicy: ...

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any] | None = None) -> tuple[Any, bool]: ...

    def zero_grad(self, optimizer: Any, set_to_none: bool = True) -> None: ...


class _PlainSteps:
    """Without a strategy: torch's own step and zero_grad, through `scaler` when one is given (fp16 loss scaling)."""

    def __init__(self, scaler: Any = None) -> None:
        from .precision import PrecisionPolicy, make_precision_policy

        self.precision = make_precision_policy("no", torch.device("cpu"))
        if scaler is not None:
            self.precision = PrecisionPolicy(name="fp16", device_type=self.precision.device_type, dtype=torch.float16,
                                             scaler=scaler)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any] | None = None) -> tuple[Any, bool]:
        return self.precision.step(optimizer, closure)

    def zero_grad(self, optimizer: Any, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer so the same loop works with accumulation and fp16.

    - On an accumulation step that does not synchronise, `step()` and
      `zero_grad()` do nothing, so gradients keep accumulating.
    - `step()` and `zero_grad()` go through the strategy: under fp16 through
      the GradScaler (`step_was_skipped` tells whether inf/NaN gradients
      skipped it), under a sharded engine through the engine.

    Everything else (param_groups, state, state_dict, ...) is the wrapped
    optimizer's own.

    Example:
        >>> param = torch.nn.Parameter(torch.ones(1))
        >>> opt = AcceleratedOptimizer(torch.optim.SGD([param], lr=0.1))
        >>> param.grad = torch.ones(1); opt.step(); param.data
        tensor([0.9000])
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device_placement: bool = True, scaler: Any = None, *,
                 gradient_state: GradientState | None = None, strategy: OptimizerSteps | None = None) -> None:
        # Deliberately not calling Optimizer.__init__: all state lives in the wrapped optimizer.
        if strategy is None:  # built by hand, as Accelerate's: the state follows the run's device, `scaler` steps it
            strategy = _PlainSteps(scaler)
            if device_placement:
                from .accelerator_state import AcceleratorState

                optimizer.load_state_dict(move_to_device(optimizer.state_dict(), AcceleratorState().device))
        elif scaler is not None:
            raise ValueError("pass scaler= or strategy=, not both: a strategy steps through its own precision's scaler.")
        self.optimizer = optimizer
        self.device_placement = device_placement
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self.strategy = strategy
        self.scaler = strategy.precision.scaler
        # Bound once: the strategy (and its precision) decide how a step and a zero_grad are done.
        self._step = strategy.optimizer_step
        self._zero_grad = strategy.zero_grad
        self._is_overflow = False  # Accelerate's name for it: libraries and its tests set and read it
        self._accelerate_step_called = False  # set by `patch_optimizer_step`'s wrapper, as Accelerate's
        # a live run's gate (`hasten.facade.live.LiveStep.commit`): False skips the step, which is dealt again
        self.commit_gate: Callable[[], bool] | None = None

    def _switch_parameters(self, parameters_map: dict[Any, Any]) -> None:
        """Point every param group at the replacements `parameters_map` names (old parameter -> new one)."""
        for group in self.optimizer.param_groups:
            group["params"] = [parameters_map.get(p, p) for p in group["params"]]

    @property
    def step_was_skipped(self) -> bool:
        """True when the last `step` was skipped because fp16 loss scaling found inf/NaN gradients."""
        return self._is_overflow

    # -- delegation -----------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        """For optimizers with train/eval modes (schedule-free); a no-op otherwise."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    # -- the hot path -----------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self._zero_grad(self.optimizer, set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            self._is_overflow = False
            return None
        if self.commit_gate is not None and not self.commit_gate():
            self._zero_grad(self.optimizer, True)  # this attempt's gradients are dropped; the loader deals it again
            self.gradient_state.sync_gradients = False  # no step: the scheduler and `if sync_gradients:` skip it
            self._is_overflow = True
            return None
        result, self._is_overflow = self._step(self.optimizer, closure)
        self.gradient_state.optimizer_steps += 1
        return result


def move_to_device(state: Any, device: torch.device | str) -> Any:
    """`state` (nested lists, tuples, dicts) with every tensor moved to `device`; other values as they are.

    Example:
        >>> move_to_device({"step": 3, "exp_avg": [torch.zeros(1)]}, "cpu")
        {'step': 3, 'exp_avg': [tensor([0.])]}
    """
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    if isinstance(state, (list, tuple)):
        moved = [move_to_device(item, device) for item in state]
        return type(state)(*moved) if hasattr(state, "_fields") else type(state)(moved)
    return state


def patch_optimizer_step(accelerated_optimizer: AcceleratedOptimizer, method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (an optimizer's `step`) wrapped to note, on `accelerated_optimizer`, that it was called.

    Accelerate wraps the inner optimizer's step with it to see whether the
    fp16 scaler skipped the step (`_accelerate_step_called` stays False then).

    Example:
        >>> param = torch.nn.Parameter(torch.ones(1))
        >>> opt = AcceleratedOptimizer(torch.optim.SGD([param], lr=0.1))
        >>> step = patch_optimizer_step(opt, lambda: "stepped")
        >>> step(), opt._accelerate_step_called
        ('stepped', True)
    """

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step
