"""eBPF loading, attaching, polling and decoding: one BPF object, its probe families, its ring buffer."""
from memprof.sources.ebpf import bcc_import

bcc_import.install()  # bcc's compiler is loaded only when something compiles (bcc_import.py)
