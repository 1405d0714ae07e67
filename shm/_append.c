/* shm._append: the CommitLog append's per-record loop in C.
 *
 * The native twin of `shm.commitlog.place_records` (CommitLog._place's loop), the reference:
 * tests/unit/test_native_append.py runs both over the same batches and requires the same bytes,
 * offsets and queue table afterwards. For each record k in [i, j) of an encoded batch:
 *   queue offset: table[keys[k]] (0 when absent), and the table then holds one more; a record
 *                 whose key is None (PREPARED/ROLLBACK) gets 0 and advances nothing
 *   patched, big-endian: QUEUEOFFSET i64 at +20, PHYSICALOFFSET i64 at +28 (base + position),
 *                 STORETIMESTAMP i64 at +stamps[k]
 *   physical[k], queue[k]: the record's physical and queue offsets
 * In Python that is ~0.3 us of interpreter calls a record, a fifth of the writer's time under
 * send_batch; here it is one pass.
 *
 * Every position is checked against the buffer before anything is written through it: a bad
 * batch raises ValueError rather than writing out of bounds. Records before the bad one are
 * already patched and counted in the table, as in the Python loop (the caller's assertion on
 * the record header and its write come after the loop; a failed loop writes nothing to disk).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define QUEUE_OFFSET_AT 20 /* QUEUEOFFSET i64, then PHYSICALOFFSET i64 */
#define PATCHED_BYTES 16
#define STAMP_BYTES 8

static inline void put_be64(unsigned char *p, int64_t v) {
    for (int i = 7; i >= 0; i--, v = (int64_t)((uint64_t)v >> 8))
        p[i] = (unsigned char)v;
}

/* Item k of a list of ints as a Py_ssize_t, -1 with an exception set when it is not one. */
static Py_ssize_t index_at(PyObject *list, Py_ssize_t k) {
    Py_ssize_t value = PyLong_AsSsize_t(PyList_GET_ITEM(list, k));
    if (value < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a negative record position");
    return value;
}

/* The run of records with one queue key now being placed: a batch is mostly one queue's (a
 * client batch always is), so the table is read once at a run's start and written once at its
 * end, not twice a record. A key that is another object, even an equal one, ends the run; the
 * next run then reads what this one wrote. */
typedef struct {
    PyObject *key; /* borrowed from the keys list; NULL before the first run */
    long long next;
} Run;

static int end_run(PyObject *table, Run *run) {
    if (run->key == NULL)
        return 0;
    PyObject *next = PyLong_FromLongLong(run->next);
    if (next == NULL)
        return -1;
    int failed = PyDict_SetItem(table, run->key, next);
    Py_DECREF(next);
    run->key = NULL;
    return failed ? -1 : 0;
}

/* The queue offset of key (the table's, 0 when absent), counted in the run. -1 on error. */
static long long next_queue_offset(PyObject *table, PyObject *key, Run *run) {
    if (key != run->key) {
        if (!PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "a queue key must be a str or None");
            return -1;
        }
        if (end_run(table, run) < 0)
            return -1;
        PyObject *held = PyDict_GetItemWithError(table, key); /* borrowed */
        long long offset = 0;
        if (held != NULL) {
            offset = PyLong_AsLongLong(held);
            if (offset < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "a negative queue offset in the table");
                return -1;
            }
        } else if (PyErr_Occurred()) {
            return -1;
        }
        run->key = key;
        run->next = offset;
    }
    return run->next++;
}

/* Store value at list[k] (both lists are the caller's, of the batch's length). */
static int set_int(PyObject *list, Py_ssize_t k, long long value) {
    PyObject *item = PyLong_FromLongLong(value);
    if (item == NULL)
        return -1;
    PyList_SetItem(list, k, item); /* steals item, releases what was there */
    return 0;
}

typedef struct {
    Py_buffer data;
    PyObject *positions, *keys, *stamps, *table, *physical, *queue;
    long long base, store_timestamp;
    Run run;
} Placing;

static int place_one(Placing *p, Py_ssize_t k) {
    Py_ssize_t at = index_at(p->positions, k), stamp = index_at(p->stamps, k);
    if (at < 0 || stamp < 0)
        return -1;
    if (at > p->data.len - QUEUE_OFFSET_AT - PATCHED_BYTES || stamp > p->data.len - STAMP_BYTES - at) {
        PyErr_Format(PyExc_ValueError, "record %zd at %zd lies outside the batch's %zd bytes", k, at, p->data.len);
        return -1;
    }
    PyObject *key = PyList_GET_ITEM(p->keys, k);
    long long queue_offset = key == Py_None ? 0 : next_queue_offset(p->table, key, &p->run);
    if (queue_offset < 0)
        return -1;
    unsigned char *record = (unsigned char *)p->data.buf + at;
    put_be64(record + QUEUE_OFFSET_AT, queue_offset);
    put_be64(record + QUEUE_OFFSET_AT + 8, p->base + at);
    put_be64(record + stamp, p->store_timestamp);
    if (set_int(p->physical, k, p->base + at) < 0 || set_int(p->queue, k, queue_offset) < 0)
        return -1;
    return 0;
}

static PyObject *place(PyObject *self, PyObject *args) {
    Placing p = {.run = {NULL, 0}};
    Py_ssize_t i, j;
    if (!PyArg_ParseTuple(args, "w*O!O!O!nnO!LLO!O!", &p.data, &PyList_Type, &p.positions, &PyList_Type, &p.keys,
                          &PyList_Type, &p.stamps, &i, &j, &PyDict_Type, &p.table, &p.base, &p.store_timestamp,
                          &PyList_Type, &p.physical, &PyList_Type, &p.queue))
        return NULL;
    int failed = 0;
    Py_ssize_t n = PyList_GET_SIZE(p.positions);
    if (i < 0 || j < i || j > n || PyList_GET_SIZE(p.keys) != n || PyList_GET_SIZE(p.stamps) != n ||
        PyList_GET_SIZE(p.physical) != n || PyList_GET_SIZE(p.queue) != n) {
        PyErr_SetString(PyExc_ValueError, "place: [i, j) must lie in the batch, and every list be its length");
        failed = 1;
    }
    for (Py_ssize_t k = i; k < j && !failed; k++)
        failed = place_one(&p, k) < 0;
    if (failed) { /* the table still counts the records placed, as the Python loop's does */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (end_run(p.table, &p.run) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    } else {
        failed = end_run(p.table, &p.run) < 0;
    }
    PyBuffer_Release(&p.data);
    return failed ? NULL : Py_NewRef(Py_None);
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS,
     "place(data, positions, keys, stamps, i, j, table, base, store_timestamp, physical, queue): "
     "CommitLog._place's per-record loop"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shm._append", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__append(void) { return PyModule_Create(&module); }
