"""The codec's fixed bounds on a tensor's shape (numpy-free, so the command line can show them)."""

#: numpy's most dimensions (NPY_MAXDIMS): a shape with more is refused before any array is made.
MAX_DIMS = 64
#: The most elements one tensor may declare unless the server says otherwise
#: (Limits.max_tensor_elements): 64 Mi, a 64 MiB body of one-byte elements.
MAX_ELEMENTS = 2**26
