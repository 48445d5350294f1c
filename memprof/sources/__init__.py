"""Capture sources: the only code that touches the kernel, CUDA or torch (DESIGN.md §4, §5)."""
