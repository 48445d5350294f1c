"""memprof: kernel, native, PyTorch and CUDA memory of a Linux ML job on one timeline."""

__version__ = "0.1.0"
