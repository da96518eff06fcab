"""The ranges of the C types (int32_t, float) that numbers read from a model file are handed to C in.
Declared here, in the file-format layer that range-checks metadata against them; the C binding
(native/desc.py) takes them from here, never the other way round."""

from __future__ import annotations

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(float32).max, written out: importing this needs no numpy
