/* The blocking producer's per-record fast path, in C (issue [3.7] item 4).
 *
 * What it is: ``FastProduce(lock, sticky_batches, clock, stamps_type, slow)``, a callable that
 * ``Producer.__init__`` binds as the instance's ``produce``. A call with the common
 * record (``topic`` a str, ``value`` bytes, no key, headers, partition or timestamp, any
 * ``on_delivery``) whose topic has an open sticky batch with room appends it there
 * exactly as ``Accumulator.add``'s Python fast path does: the batch's ``room`` goes down
 * by ``len(value) + 16`` (RECORD_OVERHEAD), the value is appended to its ``values``
 * list and ``clock()`` (``time.time_ns``) to its ``timestamps`` (an ``array.array("q")``,
 * ``stamps_type``, through that type's own ``append``), and the callback to its
 * ``callbacks`` column when that column is aligned. Everything else (another kind of
 * record, no sticky batch, no room, the accumulator's lock held, a misaligned callback
 * column, bad arguments) is handed, arguments untouched, to ``slow``: the Python
 * ``Producer._produce``, which does the same and everything else, and raises the errors.
 *
 * Why C: the Python fast path costs about 400 ns a record, half of it the two Python
 * frames and their argument passing; librdkafka's ``produce`` is one C call.
 *
 * Invariants and thread-safety: the append runs with the GIL held from start to end and
 * calls no Python code (slot reads and writes on ``Batch``, whose class defines no
 * ``__getattr__``; list and array appends; a str-keyed dict lookup with an exact str;
 * the clock and ``lock.locked``, all C), so no other thread runs in between. Python code touches
 * the open batches only with the accumulator's lock held, and this path runs only when
 * the lock is free: a thread that holds it (possibly suspended between two bytecodes)
 * is never overtaken. A thread about to take it has to run bytecode first, which it
 * cannot while this holds the GIL. A free-threaded CPython (no GIL) would break the
 * argument, so there the module exports ``AVAILABLE = False`` and the producer keeps
 * the Python path.
 *
 * Crash behaviour: none of its own; it keeps no state but references to the
 * accumulator's objects (``tp_traverse``/``tp_clear`` let the collector free the cycle
 * through the producer's bound ``slow`` method).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define RECORD_OVERHEAD 16

static PyObject *s_room, *s_values, *s_timestamps, *s_callbacks;
static PyObject *s_on_delivery, *s_key, *s_headers, *s_partition, *s_timestamp_ms;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *locked;  /* the accumulator lock's bound ``locked`` */
    PyObject *sticky;  /* Accumulator._sticky_batches: topic -> open Batch */
    PyObject *clock;   /* time.time_ns */
    PyObject *stamps_type;    /* array.array: Batch.timestamps' type */
    PyObject *stamps_append;  /* array.array.append, the unbound method */
    PyObject *slow;    /* Producer._produce, bound */
} FastProduce;

static int
kw_is(PyObject *name, PyObject *interned)
{
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

/* The record's arguments, if they are the common ones; 0 to take the slow path. */
static int
common_record(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject **on_delivery)
{
    *on_delivery = Py_None;
    if (nargs < 2 || nargs > 7)
        return 0;
    /* Positional: topic, value, key, headers, partition, timestamp_ms, on_delivery. */
    for (Py_ssize_t i = 2; i < nargs && i < 6; i++) {
        if (args[i] != Py_None)
            return 0;
    }
    if (nargs == 7)
        *on_delivery = args[6];
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, j);
            PyObject *value = args[nargs + j];
            Py_ssize_t position;  /* the parameter's place in the signature */
            if (kw_is(name, s_on_delivery))
                position = 6;
            else if (kw_is(name, s_key))
                position = 2;
            else if (kw_is(name, s_headers))
                position = 3;
            else if (kw_is(name, s_partition))
                position = 4;
            else if (kw_is(name, s_timestamp_ms))
                position = 5;
            else
                return PyErr_Occurred() ? -1 : 0;  /* unknown: the Python path raises */
            if (position < nargs)
                return 0;  /* given twice: the Python path raises */
            if (position == 6)
                *on_delivery = value;
            else if (value != Py_None)
                return 0;
        }
        if (PyErr_Occurred())  /* (PyUnicode_Compare of two str cannot fail) */
            return -1;
    }
    if (!PyUnicode_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]))
        return 0;
    if (*on_delivery != Py_None && !PyCallable_Check(*on_delivery))
        return 0;
    return 1;
}

/* Append to the sticky batch: 1 done, 0 slow path, -1 error set. */
static int
append(FastProduce *self, PyObject *topic, PyObject *value, PyObject *on_delivery)
{
    PyObject *locked = PyObject_CallNoArgs(self->locked);
    if (locked == NULL)
        return -1;
    int busy = locked != Py_False;
    Py_DECREF(locked);
    if (busy)
        return 0;
    PyObject *batch = PyDict_GetItemWithError(self->sticky, topic);  /* borrowed */
    if (batch == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(batch);
    int result = 0;
    PyObject *room_obj = NULL, *values = NULL, *timestamps = NULL, *callbacks = NULL;
    PyObject *now = NULL, *new_room = NULL;
    room_obj = PyObject_GetAttr(batch, s_room);
    if (room_obj == NULL)
        goto fail;
    if (!PyLong_CheckExact(room_obj))
        goto done;
    Py_ssize_t room = PyLong_AsSsize_t(room_obj);
    if (room == -1 && PyErr_Occurred())
        goto fail;
    room -= PyBytes_GET_SIZE(value) + RECORD_OVERHEAD;
    if (room < 0)
        goto done;
    values = PyObject_GetAttr(batch, s_values);
    timestamps = values ? PyObject_GetAttr(batch, s_timestamps) : NULL;
    if (timestamps == NULL)
        goto fail;
    if (!PyList_CheckExact(values) || (PyObject *)Py_TYPE(timestamps) != self->stamps_type)
        goto done;
    if (on_delivery != Py_None) {
        callbacks = PyObject_GetAttr(batch, s_callbacks);
        if (callbacks == NULL)
            goto fail;
        if (!PyList_CheckExact(callbacks)
                || PyList_GET_SIZE(callbacks) != PyList_GET_SIZE(values))
            goto done;  /* no column yet, or sparse: Accumulator._watch pads it */
    }
#ifdef CLOCK_REALTIME
    /* time.time_ns's own clock on POSIX, without the call. */
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
        now = PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    else
        now = PyObject_CallNoArgs(self->clock);
#else
    now = PyObject_CallNoArgs(self->clock);
#endif
    new_room = now ? PyLong_FromSsize_t(room) : NULL;
    if (new_room == NULL)
        goto fail;
    if (callbacks != NULL && PyList_Append(callbacks, on_delivery) < 0)
        goto fail;
    PyObject *stamp_args[2] = {timestamps, now};
    PyObject *appended = PyObject_Vectorcall(self->stamps_append, stamp_args, 2, NULL);
    if (appended == NULL)
        goto fail;
    Py_DECREF(appended);
    if (PyList_Append(values, value) < 0 || PyObject_SetAttr(batch, s_room, new_room) < 0)
        goto fail;
    result = 1;
    goto done;
fail:
    result = -1;
done:
    Py_XDECREF(new_room);
    Py_XDECREF(now);
    Py_XDECREF(callbacks);
    Py_XDECREF(timestamps);
    Py_XDECREF(values);
    Py_XDECREF(room_obj);
    Py_DECREF(batch);
    return result;
}

static PyObject *
FastProduce_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                       PyObject *kwnames)
{
    FastProduce *self = (FastProduce *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *on_delivery;
    int common = common_record(args, nargs, kwnames, &on_delivery);
    if (common < 0)
        return NULL;
    if (common) {
        int done = append(self, args[0], args[1], on_delivery);
        if (done < 0)
            return NULL;
        if (done)
            Py_RETURN_NONE;
    }
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static PyObject *
FastProduce_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *lock, *sticky, *clock, *stamps_type, *slow;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "FastProduce takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!OO!O:FastProduce", &lock, &PyDict_Type, &sticky,
                          &clock, &PyType_Type, &stamps_type, &slow))
        return NULL;
    PyObject *locked = PyObject_GetAttrString(lock, "locked");
    if (locked == NULL)
        return NULL;
    PyObject *stamps_append = PyObject_GetAttrString(stamps_type, "append");
    if (stamps_append == NULL) {
        Py_DECREF(locked);
        return NULL;
    }
    FastProduce *self = (FastProduce *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(locked);
        Py_DECREF(stamps_append);
        return NULL;
    }
    Py_INCREF(stamps_type);
    self->stamps_type = stamps_type;
    self->stamps_append = stamps_append;
    self->vectorcall = FastProduce_vectorcall;
    self->locked = locked;
    Py_INCREF(sticky);
    self->sticky = sticky;
    Py_INCREF(clock);
    self->clock = clock;
    Py_INCREF(slow);
    self->slow = slow;
    return (PyObject *)self;
}

static int
FastProduce_traverse(FastProduce *self, visitproc visit, void *arg)
{
    Py_VISIT(self->locked);
    Py_VISIT(self->sticky);
    Py_VISIT(self->clock);
    Py_VISIT(self->stamps_type);
    Py_VISIT(self->stamps_append);
    Py_VISIT(self->slow);
    return 0;
}

static int
FastProduce_clear(FastProduce *self)
{
    Py_CLEAR(self->locked);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->stamps_type);
    Py_CLEAR(self->stamps_append);
    Py_CLEAR(self->slow);
    return 0;
}

static void
FastProduce_dealloc(FastProduce *self)
{
    PyObject_GC_UnTrack(self);
    FastProduce_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
FastProduce_call(PyObject *callable, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(callable, args, kwargs);
}

static PyObject *
FastProduce_get_slow(FastProduce *self, void *closure)
{
    (void)closure;
    if (self->slow == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->slow);
    return self->slow;
}

/* binary_column(items): a list of bytes and None as the buffers of an Arrow binary
 * column, ``(offsets, data, validity)`` (int32 little-endian offsets, the values end to
 * end, the validity bitmap or None when no item is None), or None when an item is of
 * another type or the data would pass int32 offsets (the caller then uses pa.array).
 * Why: pa.array on a Python list costs about 21 ns a value and makes pyarrow import
 * pandas (0.4-0.7 s) the first time; this is one pass and two memcpy-like loops. */
static PyObject *
binary_column(PyObject *module, PyObject *items)
{
    (void)module;
    if (!PyList_CheckExact(items))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(items);
    Py_ssize_t total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item == Py_None) {
            nulls++;
        } else if (PyBytes_CheckExact(item)) {
            total += PyBytes_GET_SIZE(item);
            if (total > INT32_MAX)
                Py_RETURN_NONE;
        } else {
            Py_RETURN_NONE;
        }
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    PyObject *data = offsets ? PyBytes_FromStringAndSize(NULL, total) : NULL;
    PyObject *validity = NULL;
    if (data != NULL && nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (validity != NULL)
            memset(PyBytes_AS_STRING(validity), 0, (n + 7) / 8);
    }
    if (data == NULL || (nulls && validity == NULL)) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        return NULL;
    }
    unsigned char *off = (unsigned char *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(data);
    unsigned char *bits = validity ? (unsigned char *)PyBytes_AS_STRING(validity) : NULL;
    uint32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        off[4 * i] = (unsigned char)at;
        off[4 * i + 1] = (unsigned char)(at >> 8);
        off[4 * i + 2] = (unsigned char)(at >> 16);
        off[4 * i + 3] = (unsigned char)(at >> 24);
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item == Py_None)
            continue;
        if (bits != NULL)
            bits[i >> 3] |= (unsigned char)(1u << (i & 7));
        Py_ssize_t size = PyBytes_GET_SIZE(item);
        memcpy(out + at, PyBytes_AS_STRING(item), (size_t)size);
        at += (uint32_t)size;
    }
    off[4 * n] = (unsigned char)at;
    off[4 * n + 1] = (unsigned char)(at >> 8);
    off[4 * n + 2] = (unsigned char)(at >> 16);
    off[4 * n + 3] = (unsigned char)(at >> 24);
    return Py_BuildValue("(NNN)", offsets, data, validity ? validity : Py_NewRef(Py_None));
}

/* millis(stamps): an array('q') of ns since the epoch as the buffer of an int64
 * column of ms (truncating, as a unit cast does), with its smallest and largest value:
 * ``(data, min, max)``; ``(b"", 0, 0)`` for none. One pass, where pyarrow's cast and
 * min_max cost two dispatches of 10-20 us each per batch. */
static PyObject *
millis(PyObject *module, PyObject *stamps)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(stamps, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.itemsize != 8 || view.format == NULL
            || !(strcmp(view.format, "q") == 0 || strcmp(view.format, "l") == 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "millis() wants an array('q')");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
    if (data == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const int64_t *in = (const int64_t *)view.buf;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(data);
    int64_t lo = 0, hi = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ms = in[i] / 1000000;  /* C truncates toward zero, like the cast */
        out[i] = ms;
        if (i == 0 || ms < lo)
            lo = ms;
        if (i == 0 || ms > hi)
            hi = ms;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NLL)", data, (long long)lo, (long long)hi);
}

static PyMethodDef module_methods[] = {
    {"millis", millis, METH_O, "millis(stamps) -> (int64 ms buffer, min, max)"},
    {"binary_column", binary_column, METH_O,
     "binary_column(items) -> (offsets, data, validity | None) | None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FastProduce_getset[] = {
    {"slow", (getter)FastProduce_get_slow, NULL,
     "the Python path every other call takes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastProduceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "strata.client._fastproduce.FastProduce",
    .tp_doc = "Producer.produce's C fast path (see the module's source for invariants).",
    .tp_basicsize = sizeof(FastProduce),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FastProduce, vectorcall),
    .tp_call = FastProduce_call,
    .tp_new = FastProduce_new,
    .tp_traverse = (traverseproc)FastProduce_traverse,
    .tp_clear = (inquiry)FastProduce_clear,
    .tp_dealloc = (destructor)FastProduce_dealloc,
    .tp_getset = FastProduce_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "strata.client._fastproduce",
    .m_doc = "The blocking producer's per-record fast path (strata/client/_fastproduce.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__fastproduce(void)
{
    if (!(s_room = PyUnicode_InternFromString("room"))
            || !(s_values = PyUnicode_InternFromString("values"))
            || !(s_timestamps = PyUnicode_InternFromString("timestamps"))
            || !(s_callbacks = PyUnicode_InternFromString("callbacks"))
            || !(s_on_delivery = PyUnicode_InternFromString("on_delivery"))
            || !(s_key = PyUnicode_InternFromString("key"))
            || !(s_headers = PyUnicode_InternFromString("headers"))
            || !(s_partition = PyUnicode_InternFromString("partition"))
            || !(s_timestamp_ms = PyUnicode_InternFromString("timestamp_ms")))
        return NULL;
    if (PyType_Ready(&FastProduceType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef Py_GIL_DISABLED
    int available = 0;  /* the append's atomicity rests on the GIL: see the top */
#else
    int available = 1;
#endif
    if (PyModule_AddObjectRef(m, "AVAILABLE", available ? Py_True : Py_False) < 0
            || PyModule_AddObjectRef(m, "FastProduce", (PyObject *)&FastProduceType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
