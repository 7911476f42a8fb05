"""Benchmarks and profiles of the engine, run as `python -m benchmarks.X` (or the Makefile's
bench-* and profile-steps targets). They drive the engine through its public interface
(LLM, LLMEngine, EngineConfig, the step profiler); nothing imports them, and they are not
part of the installed package.
"""
