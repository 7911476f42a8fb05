"""Speculative decoding: cheap drafts that the target model checks in one pass."""
