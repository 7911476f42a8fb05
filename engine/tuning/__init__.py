"""Load-time tuning: every race and measurement that picks a kernel, a path or a size on this
machine at start-up, the memory that keeps their results across starts, and the one
`Tuning` result that the engine's parts read."""
