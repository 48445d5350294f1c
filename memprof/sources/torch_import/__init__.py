"""PyTorch's own memory records (CUDA snapshots, allocator traces, profiler traces) into timeline rows."""
