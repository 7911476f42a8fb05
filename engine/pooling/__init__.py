"""Pooling models: encoders (BERT, XLM-RoBERTa, nomic-bert) and decoders read to one vector
per input (embeddings) or one score per pair (cross-encoders, yes/no rerankers)."""
