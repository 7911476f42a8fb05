"""Running a step on the device: packing tokens, the forward pass, CUDA graphs, the KV
cache's size, sampling and logprobs."""
