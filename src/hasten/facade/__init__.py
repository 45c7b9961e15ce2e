"""The `Accelerator`'s parts: each a small class that owns one concern of the facade.

- `processes.py`: who and where (rank, world, main), collectives and "only on process N" helpers.
- `preparing.py`: `prepare` and its family; how loaders are prepared (`dataloader_config`); compiling.
- `checkpoints.py`: `save_state` / `load_state`, registered objects and hooks, `save_model`; builds the `SaveSet`.
- `trackers.py`: `init_trackers`, `log`, `get_tracker`.
- `runtime.py`: autocast, uneven inputs, triggers, profiling, parallelism views, `native_amp`.

`Accelerator` inherits the parts, so each public method is defined once,
with its docstring, where its concern lives. A part reads only the shared
values it declares at its top (typed; `Accelerator.__init__` sets them
once) and its own state, made by its ``_init_*`` method; it never calls
another part.

Example:
    >>> from hasten import Accelerator
    >>> from hasten.facade.checkpoints import CheckpointPart
    >>> issubclass(Accelerator, CheckpointPart)
    True
"""
