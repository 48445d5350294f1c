/* Prints, as one JSON object, the CPython struct offsets memprof's BPF frame walker needs,
 * taken from the interpreter's own internal headers (compile with -DPy_BUILD_CORE against
 * include/python3.X and include/python3.X/internal). Used by scripts/gen_py_offsets.py to
 * derive memprof/sources/cpython/offsets_table.py; never at run time. -1 means "no such field". */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

int main(void)
{
    printf("{\"version\": [%d, %d],\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    printf(" \"runtime_interp_head\": %zu,\n", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030B0000
    printf(" \"interp_tstate_head\": %zu,\n", offsetof(PyInterpreterState, threads.head));
#else
    printf(" \"interp_tstate_head\": %zu,\n", offsetof(PyInterpreterState, tstate_head));
#endif
    printf(" \"tstate_next\": %zu,\n", offsetof(PyThreadState, next));
    printf(" \"tstate_thread_id\": %zu,\n", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    printf(" \"tstate_frame\": %zu, \"cframe_current_frame\": -1,\n", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
    printf(" \"tstate_frame\": %zu, \"cframe_current_frame\": %zu,\n", offsetof(PyThreadState, cframe),
           offsetof(_PyCFrame, current_frame));
#else
    printf(" \"tstate_frame\": %zu, \"cframe_current_frame\": -1,\n", offsetof(PyThreadState, frame));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    printf(" \"frame_previous\": %zu, \"frame_code\": %zu, \"frame_instr\": %zu, \"frame_owner\": %zu, \"frame_is_entry\": -1,\n",
           offsetof(_PyInterpreterFrame, previous), offsetof(_PyInterpreterFrame, f_executable),
           offsetof(_PyInterpreterFrame, instr_ptr), offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030C0000
    printf(" \"frame_previous\": %zu, \"frame_code\": %zu, \"frame_instr\": %zu, \"frame_owner\": %zu, \"frame_is_entry\": -1,\n",
           offsetof(_PyInterpreterFrame, previous), offsetof(_PyInterpreterFrame, f_code),
           offsetof(_PyInterpreterFrame, prev_instr), offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030B0000
    printf(" \"frame_previous\": %zu, \"frame_code\": %zu, \"frame_instr\": %zu, \"frame_owner\": %zu, \"frame_is_entry\": %zu,\n",
           offsetof(_PyInterpreterFrame, previous), offsetof(_PyInterpreterFrame, f_code),
           offsetof(_PyInterpreterFrame, prev_instr), offsetof(_PyInterpreterFrame, owner),
           offsetof(_PyInterpreterFrame, is_entry));
#else
    printf(" \"frame_previous\": %zu, \"frame_code\": %zu, \"frame_instr\": %zu, \"frame_owner\": -1, \"frame_is_entry\": -1,\n",
           offsetof(PyFrameObject, f_back), offsetof(PyFrameObject, f_code), offsetof(PyFrameObject, f_lasti));
#endif
#if PY_VERSION_HEX >= 0x030B0000
    printf(" \"code_qualname\": %zu, \"code_adaptive\": %zu,\n", offsetof(PyCodeObject, co_qualname),
           offsetof(PyCodeObject, co_code_adaptive));
#else
    printf(" \"code_qualname\": -1, \"code_adaptive\": -1,\n");
#endif
    printf(" \"code_filename\": %zu, \"code_name\": %zu, \"code_firstlineno\": %zu, \"code_linetable\": %zu,\n",
           offsetof(PyCodeObject, co_filename), offsetof(PyCodeObject, co_name),
           offsetof(PyCodeObject, co_firstlineno), offsetof(PyCodeObject, co_linetable));
    printf(" \"object_type\": %zu, \"bytes_size\": %zu, \"bytes_data\": %zu,\n", offsetof(PyObject, ob_type),
           offsetof(PyVarObject, ob_size), offsetof(PyBytesObject, ob_sval));
    printf(" \"sizeof_runtime\": %zu, \"sizeof_code\": %zu, \"sizeof_thread\": %zu,\n", sizeof(_PyRuntimeState),
           sizeof(PyCodeObject), sizeof(PyThreadState));
    printf(" \"unicode_length\": %zu, \"unicode_state\": %zu, \"unicode_ascii_data\": %zu, \"unicode_compact_data\": %zu}\n",
           offsetof(PyASCIIObject, length), offsetof(PyASCIIObject, hash) + sizeof(Py_hash_t),
           sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject));
    return 0;
}
