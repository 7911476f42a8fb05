"""What crosses the engine's edge: outputs and deltas, incremental detokenizing, the
per-request limits, errors, statistics and their recording, the engine's description and
its step profile."""
