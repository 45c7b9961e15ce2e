"""What a run holds in each process: its state (`PartialState`, `AcceleratorState`) and the prepared optimizer and scheduler that step with it."""
