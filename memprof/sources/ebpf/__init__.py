"""eBPF loading, attaching, polling and decoding: one BPF object, its probe families, its ring buffer."""
