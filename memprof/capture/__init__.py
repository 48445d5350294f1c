"""`memprof record`: start or attach to a target, drive the sources, write the recording."""
