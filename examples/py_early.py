"""A pipe made by the script's first statements, three Python calls deep
(early_inner ← early_middle ← early_outer), kept until exit — the known answer for Python frames
of a program that allocates as soon as it starts (tests/integration/test_python_frames.py).

    python examples/py_early.py

Nothing is imported but `os`, so the pipe comes a few milliseconds after the interpreter maps
its runtime: with a shared libpython, before memprof has read the process's maps. Runs on
CPython 3.10 – 3.13.
"""
import os

held = []


def early_inner():
    held.append(os.pipe())  # line: early_inner


def early_middle():
    early_inner()  # line: early_middle


def early_outer():
    early_middle()  # line: early_outer


early_outer()
