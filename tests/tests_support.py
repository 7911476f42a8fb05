"""Prompts of different lengths shared by the engine tests, and the test run's pagode cache."""

from pathlib import Path

# What a cache holds that was measured (step-time fits, batch caps, kernel races) must not
# leak from a developer's earlier runs into the tests; what is only derived from sources
# (compiled kernels, tokenizers built from the GGUF) is shared, so no test rebuilds it.
SHARED_CACHE_PARTS = ("kernels", "tokenizers")


def cache_sharing_builds(root: Path, shared: Path) -> Path:
    """A pagode cache at `root` with `shared`'s builds linked in and nothing measured."""
    root.mkdir(parents=True, exist_ok=True)
    for part in SHARED_CACHE_PARTS:
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
