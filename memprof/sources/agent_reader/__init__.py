"""The recorder's side of memprof's in-process agent (memprof/agent/): its folder, attach, and JSON lines."""
