"""Running a step on the device: packing tokens, the forward pass, CUDA graphs, the KV
cache's size, sampling (row by row when the batch fails), logprobs, and the teacher-forced
reading that the quality gates measure with."""
