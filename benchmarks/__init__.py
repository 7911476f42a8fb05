"""Benchmarks, profiles and measuring programs, run as `python -m benchmarks.X` (or the
Makefile's bench-*, profile-steps, experiment, plan-check and crosscheck targets): one file
per program, shared helpers in small modules (pagode_server.py, decode_probe.py,
transformers_reference.py, kernel_reference.py, teacher_forcing.py). They drive the engine
through its public interface (LLM, LLMEngine, EngineConfig, the step profiler) or a live
`pagode serve` over HTTP with pagode-loadgen's client, and import nothing from tests/. Two
helpers are the tests' measures too: the kernels' torch oracle (kernel_reference.py) and the
quality gates' teacher-forced reading (teacher_forcing.py), which the tests import from here;
nothing else imports the benchmarks (a test runs a program as a program). They are not part of
the installed package, so run them from the repository root.
"""
