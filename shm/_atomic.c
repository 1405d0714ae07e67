/* The one atomic the rings need (shm/ring.py): a full memory fence.
 *
 * A ring's producer stores `tail`, then loads the consumer's `sleeping`; the consumer stores
 * `sleeping`, then loads `tail` (Dekker's pattern, the Disruptor's blocking wait strategy).
 * x86-64 may let a load pass an earlier store to another address, so without a fence on both
 * sides each could read the other's old value and the consumer would sleep through a message.
 * Python has no fence; this is one (an mfence, or a locked instruction, on x86-64). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *fence(PyObject *self, PyObject *unused) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fence", fence, METH_NOARGS, "fence(): a full memory fence (stores before it are visible before loads after it)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shm._atomic", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__atomic(void) { return PyModule_Create(&module); }
