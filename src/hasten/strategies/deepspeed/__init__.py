"""DeepSpeed ZeRO 1-3, one concept a module (DeepSpeed itself is imported only when a run uses it).

- `config.py`: `HfDeepSpeedConfig` (a JSON config by dotted keys, its "auto" values), `require_deepspeed`;
- `plugin.py`: `DeepSpeedPlugin`, the user's settings (`environment.py`: those the launcher's variables give) and
  the config they become (`engine_config.py`: filled for each engine);
- `dummies.py`: `DummyOptim` / `DummyScheduler`, stand-ins for what the config defines;
- `strategy.py`: `DeepSpeedStrategy`; `checkpoint.py`: per-rank partition files.
"""
