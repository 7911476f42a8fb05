"""Readers of the engine's results: the statistics recorder, the step profiler and the KV
cache events with their publisher. They watch the scheduler, the block manager and the model;
nothing in the step imports them, so the step runs the same with none attached."""
