"""`pagode plan`: capacity answered before hardware is bought.

memory.py sizes the KV cache from the model's config (the engine's own formula);
step_model.py is the fitted step time; calibrate.py measures it on the real engine;
simulator.py replays a workload through the real Scheduler and BlockManager on a
fake clock; predict.py turns that into latency percentiles, an SLO verdict and advice.
"""
