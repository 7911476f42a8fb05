"""Benchmarks, profiles and measuring programs, run as `python -m benchmarks.X` (or the
Makefile's bench-*, profile-steps, experiment, plan-check and crosscheck targets): one file
per program, shared helpers in small modules (pagode_server.py, decode_probe.py,
transformers_reference.py). They drive the engine through its public interface (LLM,
LLMEngine, EngineConfig, the step profiler) or a live `pagode serve` over HTTP with
pagode-loadgen's client; the kernel and quantization-quality programs also read through the
tests' oracle and teacher-forced reading (tests/kernel_reference.py, tests/teacher_forcing.py),
so run them from the repository root. Nothing imports them, tests included (a test runs one as
a program), and they are not part of the installed package.
"""
