"""Symbols: BPF stack ids and raw addresses into frames and the recording's stacks/frames tables."""
