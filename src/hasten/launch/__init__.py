"""Starting processes: the launch plan (flags -> torchrun argv + env) and the per-process worker."""
