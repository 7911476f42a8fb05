"""Prompts of different lengths shared by the engine tests, and the test run's pagode cache."""

from pathlib import Path

import torch

from engine.attention.metadata import AttentionMetadata

# What a cache holds that was measured (step-time fits, batch caps, kernel races) must not
# leak from a developer's earlier runs into the tests; what is only derived from sources
# (compiled kernels, tokenizers built from the GGUF) is shared, so no test rebuilds it.
SHARED_CACHE_PARTS = ("peers", "kernels", "tokenizers", "agent-clis")


def cache_sharing_builds(root: Path, shared: Path, races: bool = False) -> Path:
    """A pagode cache at `root` with `shared`'s builds linked in and nothing measured; with
    `races`, also `shared`'s kernel races, for a test of something else (a fit, a driver)
    whose `shared` is the test run's own cache, raced in this run: a server starting on an
    empty cache races every GEMM again, seconds of its start."""
    root.mkdir(parents=True, exist_ok=True)
    for part in SHARED_CACHE_PARTS + (("races",) if races else ()):
        (shared / part).mkdir(parents=True, exist_ok=True)
        (root / part).symlink_to((shared / part).resolve(), target_is_directory=True)
    return root


PROMPTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):",
    "Write a short poem about the sea and the wind.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who",
    "List three facts about the planet Mars, one per line:\n1.",
    "The following is a conversation between a student and a teacher about photosynthesis. "
    "Student: Why are leaves green? Teacher: Leaves are green because they contain chlorophyll, "
    "a pigment that absorbs red and blue light and reflects green light. Student: What does the "
    "chlorophyll do with the light it absorbs? Teacher:",
    "In computer science, a hash table is a data structure that implements an associative array, "
    "also called a dictionary, which is an abstract data type that maps keys to values. A hash "
    "table uses a hash function to compute an index, also called a hash code, into an array of "
    "buckets or slots, from which the desired value can be found. During lookup, the key is hashed "
    "and the resulting hash indicates where the corresponding value is stored. In a well-dimensioned "
    "hash table, the average time complexity for each lookup is independent of the number of "
    "elements stored in the table. Explain why collisions happen:",
]

SHARED_PREFIX = (
    "You are a careful assistant. Read the following passage. The river rises in the mountains, "
    "crosses three valleys and a plain, and reaches the sea after four hundred kilometres. Mills "
    "were built along its banks in the twelfth century, and the town that grew around the largest "
    "of them still bears its name. In spring the melting snow swells the river; in late summer it "
    "can almost dry out. "
)


def paged_attention_case(seed: int, lens: list[int], q_lens: list[int], heads: int, kv_heads: int, head_dim: int,
                         block_size: int, dtype: torch.dtype = torch.float32, num_decodes: int | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Random queries packed by sequence (q_lens of them, ending at each of `lens`) and a K/V
    cache of `dtype` in shuffled blocks, for the attention kernels' equality tests.
    `num_decodes` defaults to the sequences with one query."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * max_blocks + 3
    kv = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[:len(lens) * max_blocks].view(len(lens), max_blocks)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], heads, head_dim, generator=g)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=tables.int(),
        num_decodes=sum(1 for n in q_lens if n == 1) if num_decodes is None else num_decodes,
        max_query_len=max(q_lens), max_seq_len=max(lens), query_start_loc_cpu=starts, seq_lens_cpu=lens)
    return q, kv, meta
