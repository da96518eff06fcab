"""Tokenizers from GGUF metadata: SentencePiece-style and GPT-2 BPE, pre-tokenizers, chat formats."""
