"""Closed sets (layers, actions, frame kinds) and the Arrow schemas of the timeline tables.

Units live in column names: `ts_ns` is CLOCK_MONOTONIC nanoseconds of the recording host,
`size_bytes`/`requested_bytes` are bytes. Sizes are never negative: direction is `action`.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


class Layer(str, enum.Enum):
    """Allocator levels, outermost first. Bytes are never added across layers."""

    CUDA_BLOCK = "cuda_block"
    CUDA_SEGMENT = "cuda_segment"
    CUDA_DRIVER = "cuda_driver"
    TORCH_CPU = "torch_cpu"
    NATIVE_HEAP = "native_heap"
    KERNEL_SLAB = "kernel_slab"
    KERNEL_PAGE = "kernel_page"


class Action(str, enum.Enum):
    """What an event does to an allocation. `mark` rows carry markers (exit, step)."""

    ALLOC = "alloc"
    FREE = "free"
    FREE_REQUESTED = "free_requested"
    OOM = "oom"
    MARK = "mark"


class FrameKind(str, enum.Enum):
    KERNEL = "kernel"
    NATIVE = "native"
    PYTHON = "python"


# CPython's evaluation loop: the native frames that run Python frames. A stored chain keeps
# them, each just after the Python frames it was running; reports drop them where the chain
# has those Python frames (`--native-frames all` keeps them).
EVAL_LOOP_FUNCTIONS = frozenset({"_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx", "_PyEval_EvalFrame"})


class Mark(str, enum.Enum):
    """Labels of `mark` events, stored in the `category` column. A user's mark with one of
    these labels is stored under another (agent_reader.source.user_label)."""

    # The target's root process began to exit (exit_group, a fatal signal, or interpreter
    # finalization): the moment "held at the end" is judged at, before teardown frees.
    EXIT = "exit"
    # A training step began (the agent: optimizer step, torch.profiler step, memprof.mark);
    # the row's `step` is the new step's number. Other labels are the user's own marks.
    STEP = "step"
    # A process of the target exec'd (eBPF: sched_process_exec): its old image's address space
    # is gone, and with it every user-space allocation it still held (lifetimes.py ends them).
    EXEC = "exec"


# The labels memprof's own marks use (a user's mark named so is stored under another).
MARK_LABELS = frozenset(mark.value for mark in Mark)


# `category` of a profiler-window tensor annotation (a `mark` row): "tensor:parameter", …
TENSOR_PREFIX = "tensor:"

# `category` of a model-state note (a `mark` row in `torch_cpu` or `cuda_block`, at the
# tensor's data pointer, size its storage bytes): "state:ROLE:NAME", ROLE a ModelStateRole
# value, NAME the dotted name (`transformer.h.3.mlp.c_fc.weight`; a gradient is named as
# its parameter; optimizer state `NAME.exp_avg`, `NAME.step`, …). `timeline()` copies it onto
# the allocation live at that address, which then reads "state:ROLE:NAME" too.
STATE_PREFIX = "state:"

# `metric` of a quantity's `samples` rows (device QUANTITY_DEVICE): "quantity:tokens", … — the
# numbers memprof.mark(label, **numbers) and each outermost forward's input sizes give.
QUANTITY_PREFIX = "quantity:"
QUANTITY_DEVICE = ""

# `category` of a module boundary (a `mark` row without a layer, on the thread it happened
# on): from this row on, the innermost nn.Module forward running on the thread is the one at
# the instance path after the prefix ("module:transformer.h.3.attn"; the outermost module
# is "module:"), or none (MODULE_NONE). One row where a module's forward begins (MODULE_PREFIX
# and its path: one row per call) and one where it ends (MODULE_RETURN_PREFIX and the path of
# the module around it, which runs again; MODULE_NONE after the outermost). `timeline()`
# gives each allocation the path of its thread's latest boundary, in the derived column `module`.
MODULE_PREFIX = "module:"
MODULE_RETURN_PREFIX = "module-return:"
MODULE_NONE = "module-none"


class ModelStateRole(str, enum.Enum):
    """What a tensor of model state is: the model's own memory, held on purpose until exit."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"

LAYERS = [layer.value for layer in Layer]
ACTIONS = [action.value for action in Action]

# The tables' columns, in their schemas' order (tests/unit/test_startup_imports.py holds that
# they are the schemas' names). Plain lists, so that the recorder's modules name columns
# without importing pyarrow (below).
EVENT_COLUMNS = ["ts_ns", "seq", "layer", "action", "addr", "size_bytes", "requested_bytes", "device", "pid",
                 "tid", "stack_id", "alloc_id", "step", "category", "weight"]
# A frame as reports and JSON carry it: FRAMES_SCHEMA without its id.
FRAME_KEYS = ("kind", "function", "module", "file", "line")

# The Arrow schemas are built at their first use, through the module's __getattr__ (PEP 562):
# `from memprof.model.schema import EVENTS_SCHEMA` works as before, and a module that names
# only the enums or the columns above imports neither pyarrow nor numpy: cli/record.py
# alone decides when `record` imports them (memprof/lazy_import.py).
ARROW_SCHEMAS = ("EVENTS_SCHEMA", "STACKS_SCHEMA", "FRAMES_SCHEMA", "SAMPLES_SCHEMA")


def _arrow_schemas() -> dict[str, "pa.Schema"]:
    import pyarrow as pa

    category = pa.dictionary(pa.int8(), pa.string())
    # `category` holds the user's mark labels (one per training step is common: `batch 17`), so
    # its index is int32; recordings written before held int8 indices, which readers cast up.
    labels = pa.dictionary(pa.int32(), pa.string())
    events = pa.schema([
        ("ts_ns", pa.int64()),
        ("seq", pa.int64()),
        ("layer", category),
        ("action", category),
        ("addr", pa.uint64()),
        ("size_bytes", pa.int64()),
        ("requested_bytes", pa.int64()),
        ("device", category),
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("stack_id", pa.int64()),
        ("alloc_id", pa.int64()),
        ("step", pa.int32()),
        ("category", labels),
        # Sampled events stand for this many (1 / the probability they were taken with); null
        # means 1. Totals weight each allocation by it, so sampled estimates stay unbiased.
        ("weight", pa.float64()),
    ])
    stacks = pa.schema([("stack_id", pa.int64()), ("depth", pa.int32()), ("frame_id", pa.int64())])
    frames = pa.schema([
        ("frame_id", pa.int64()),
        ("kind", pa.string()),
        ("function", pa.string()),
        ("module", pa.string()),
        ("file", pa.string()),
        ("line", pa.int32()),
    ])
    samples = pa.schema([
        ("ts_ns", pa.int64()), ("metric", pa.string()), ("device", pa.string()), ("value", pa.float64()),
    ])
    return dict(zip(ARROW_SCHEMAS, (events, stacks, frames, samples)))


def __getattr__(name: str):
    if name in ARROW_SCHEMAS:
        schemas = _arrow_schemas()
        globals().update(schemas)  # built once: later look-ups find them without this call
        return schemas[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
