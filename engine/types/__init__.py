"""What crosses the engine's edge (EngineClient): outputs and deltas, errors, the engine's
description, its statistics and the speculative-decoding counters inside them. Plain types
at the bottom of the engine, so the server and every engine folder can import them without
pulling in the engine itself."""
