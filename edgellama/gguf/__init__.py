"""GGUF files: the reader (mmap, zero copy, every length checked), the writer, and the ggml type table.

The file format only: nothing here imports the C binding (edgellama.native) or a layer above it
(tests/test_gguf_layer.py); what needs C (quantizing, the SIGBUS guard) is wired in from above."""
