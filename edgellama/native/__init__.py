"""The C kernel library's Python side: the cffi build, the loaded library, the engine and kernel bindings,
and the model description they take."""
