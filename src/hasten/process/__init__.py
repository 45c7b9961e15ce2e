"""What one launched process owns, below everything that runs in it.

- `group`: the process group: create it (or adopt the user's), the exit
  barrier, and leaving it cleanly.
- `exit`: how a process reports a failure (its rank, the user's frames, torchelastic's error file) and ends.
- `board`: the shared-memory mismatch check of the processes of one machine (and its small collectives).
- `futex`: sleeping until a word of shared memory changes (the board's waits, on Linux).
- `watchdog`: where each process waits; a certain deadlock ends the run in seconds.
- `lifetime`: the process dies with its launcher (Linux's parent-death signal).

These modules import only `hasten.process.launch_spec`, `hasten.process.topology`,
`hasten.core.errors` and each other: never the launcher (`hasten.launch`), the
Accelerator, checkpointing or the strategies, which all build on them.
"""
