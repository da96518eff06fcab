"""GGUF files: the reader (mmap, zero copy, every length checked), the writer, and the ggml type table."""
