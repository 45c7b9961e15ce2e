"""DDP: data parallel with torch's `DistributedDataParallel` (`strategy.py`); its settings are `DistributedDataParallelKwargs`."""
