/* One reader of CPython's interpreter frames, for every C part of pyrun that walks a thread's
 * Python stack without making frame objects: the sampling engine's signal handler
 * (engine_c/handler.c) and the CUPTI hook's call sites (gpu/cupti/_cuptihook_sites.c).
 *
 * Each CPython keeps its frames in its own layout (3.11: tstate->cframe->current_frame,
 * f_code, prev_instr; 3.12: the C-stack shim frames; 3.13: tstate->current_frame,
 * f_executable, instr_ptr). That knowledge lives here and nowhere else, the way py-spy keeps
 * every version's layout behind one set of traits: teaching pyrun a new CPython is teaching
 * this header. setup.py's one version gate (FRAMES_SUPPORTED) decides where it is compiled;
 * outside it the engine is not built and the hook walks the public frame API.
 *
 * Include it after Python.h, with Py_BUILD_CORE or Py_BUILD_CORE_MODULE defined or not: the
 * internal header it needs is included here. Every function is safe from a signal handler on
 * the thread whose frames it reads (no allocation, no lock, no Python call), and checks every
 * pointer it follows: a frame can be half pushed or half popped at an interrupt.
 */
#ifndef PYHPCTK_PYFRAMES_H
#define PYHPCTK_PYFRAMES_H

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000 || defined(Py_GIL_DISABLED)
#error "pyframes.h reads the frames of CPython 3.11 to 3.13 with the GIL (setup.py's gate)"
#endif

#if !defined(Py_BUILD_CORE) && !defined(Py_BUILD_CORE_MODULE)
#define PYFRAMES_SET_CORE 1
#define Py_BUILD_CORE 1
#endif
#include <internal/pycore_frame.h>
#ifdef PYFRAMES_SET_CORE
#undef Py_BUILD_CORE
#undef PYFRAMES_SET_CORE
#endif

#include <stdint.h>

/* The innermost frame of a thread (NULL: none, or a C frame record not yet set up). */
static inline _PyInterpreterFrame *pyframe_top(PyThreadState *tstate) {
#if PY_VERSION_HEX >= 0x030D0000
    return tstate->current_frame;
#else
    _PyCFrame *cframe = tstate->cframe;
    if (cframe == NULL || ((uintptr_t)cframe & 7)) return NULL;
    return cframe->current_frame;
#endif
}

/* What the frame runs: a code object, or (3.13) None for a shim; not checked. */
static inline PyObject *pyframe_executable(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030D0000
    return frame->f_executable;
#else
    return (PyObject *)frame->f_code;
#endif
}

/* The instruction the frame is at: 3.13's executing (or about to), 3.11-3.12's last started. */
static inline _Py_CODEUNIT *pyframe_instr(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030D0000
    return frame->instr_ptr;
#else
    return frame->prev_instr;
#endif
}

/* 1: the entry shim of a C call into the eval loop (3.12+), which no frame walker shows. */
static inline int pyframe_is_shim(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030C0000
    return frame->owner == FRAME_OWNED_BY_CSTACK;
#else
    (void)frame;
    return 0;
#endif
}

/* 1: the first frame one invocation of the eval loop ran, as 3.11 marks it (is_entry); 3.12+
 * mark it with a shim frame below it instead (pyframe_is_shim), and this is 0. */
static inline int pyframe_is_entry(_PyInterpreterFrame *frame) {
#if PY_VERSION_HEX >= 0x030C0000
    (void)frame;
    return 0;
#else
    return frame->is_entry ? 1 : 0;
#endif
}

/* Reads one frame, every pointer checked. 1: a frame to record, its code object and the
 * offset of its instruction (in code units) set; 0: a frame to skip (a shim, a non-code
 * executable, a frame being pushed); -1: not a frame (a chain to give up on). */
static inline int pyframe_read(_PyInterpreterFrame *frame, PyCodeObject **code_out,
                               uint32_t *offset_out) {
    if ((uintptr_t)frame & 7) return -1;
    if (pyframe_is_shim(frame)) return 0;
    PyObject *object = pyframe_executable(frame);
    if (object == NULL || ((uintptr_t)object & 7)) return -1;
    if (Py_TYPE(object) != &PyCode_Type) {
#if PY_VERSION_HEX >= 0x030D0000
        return 0; /* 3.13: f_executable may be None (shim) */
#else
        return -1;
#endif
    }
    PyCodeObject *code = (PyCodeObject *)object;
    _Py_CODEUNIT *first = _PyCode_CODE(code);
    _Py_CODEUNIT *instr = pyframe_instr(frame);
    if (frame->owner != FRAME_OWNED_BY_GENERATOR && instr < first + code->_co_firsttraceable)
        return 0; /* incomplete: the frame is being pushed */
    if (instr < first || instr >= first + Py_SIZE(code)) return -1;
    *code_out = code;
    *offset_out = (uint32_t)(instr - first);
    return 1;
}

/* The coroutine object a frame belongs to (its address), or 0: the frame runs a coroutine
 * function's code (CO_COROUTINE) and is owned by its coroutine object, in which 3.11-3.13
 * embed it (gi_iframe, as _PyFrame_GetGenerator finds it). `code` is the frame's, as
 * pyframe_read returned it. */
static inline uintptr_t pyframe_coroutine(_PyInterpreterFrame *frame, PyCodeObject *code) {
    if (frame->owner != FRAME_OWNED_BY_GENERATOR || !(code->co_flags & CO_COROUTINE)) return 0;
    return (uintptr_t)frame - offsetof(PyGenObject, gi_iframe);
}

#endif /* PYHPCTK_PYFRAMES_H */
