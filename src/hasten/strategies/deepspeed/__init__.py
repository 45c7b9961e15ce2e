"""DeepSpeed ZeRO 1-3, one concept a module (DeepSpeed itself is imported only when a run uses it).

- `config.py`: `HfDeepSpeedConfig` (a JSON config by dotted keys, its "auto" values), `require_deepspeed`;
- `plugin.py`: `DeepSpeedPlugin`, the user's settings and the engine config they become;
- `dummies.py`: `DummyOptim` / `DummyScheduler`, stand-ins for what the config defines;
- `strategy.py`: `DeepSpeedStrategy`; `checkpoint.py`: per-rank partition files.
"""
