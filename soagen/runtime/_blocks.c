/* A model's result written into its output block, for `soagen.runtime.buffers.block_writer`.
 *
 * `torch.Tensor.copy_` between small CPU tensors spends about a microsecond building its
 * TensorIterator, and once a model has run, that code is out of the instruction cache again: for a
 * [1e3, 2] result it costs more than the copy. Here the copy is a loop over the two tensors'
 * addresses and strides, read through their public Python methods, so this file needs CPython's
 * headers only. What it does not copy itself (a tensor subclass, a negative or conjugate view, a
 * tensor without strided memory, memory shared with the block) goes to `target.copy_(source)`,
 * which copies it, or refuses it, as it always does.
 *
 * Built by `pip install` (pyproject.toml: an optional extension); after editing this file, run
 * `pip install -e .` again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Set once by `set_torch`: torch.Tensor (only plain tensors are copied here), and
 * torch._C._increment_version, which moves a tensor's version counter as copy_ would: autograd
 * then refuses a backward pass through values this write replaced. */
static PyObject *tensor_type = NULL, *increment_version = NULL;
static PyObject *name_data_ptr, *name_stride, *name_is_neg, *name_is_conj, *name_copy;

static PyObject *set_torch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "set_torch(torch.Tensor, torch._C._increment_version)");
        return NULL;
    }
    Py_XSETREF(tensor_type, Py_NewRef(args[0]));
    Py_XSETREF(increment_version, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* `tensor.name()` as a C integer; -1 with an exception set on failure. */
static int call_for_integer(PyObject *tensor, PyObject *name, long long *value) {
    PyObject *result = PyObject_CallMethodNoArgs(tensor, name);
    if (result == NULL) return -1;
    *value = PyLong_AsLongLong(result);
    Py_DECREF(result);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Whether `tensor.name()` is false; -1 with an exception set on failure. */
static int is_false(PyObject *tensor, PyObject *name) {
    PyObject *result = PyObject_CallMethodNoArgs(tensor, name);
    if (result == NULL) return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth < 0 ? -1 : !truth;
}

typedef struct {
    PyObject_HEAD
    PyObject *target;  /* the output block: a plain CPU tensor, held for its memory */
    PyObject *targets; /* (target,): the argument of increment_version */
    long long dims;    /* 1: [rows] (columns 1), 2: [rows, columns] */
    long long rows, columns, itemsize;
    long long strides[2];  /* the target's, in elements (0 for a missing second axis) */
    int is_complex;        /* whether a conjugate bit could change the values */
} BlockWriter;

/* The source's element strides, its address, and its neg and conj bits: 1 where the loop may
 * copy it, 0 where copy_ must, -1 with an exception set. */
static int read_source(BlockWriter *self, PyObject *source, long long strides[2], char **address) {
    if (increment_version == NULL || Py_TYPE(source) != (PyTypeObject *)tensor_type) return 0;
    int plain = is_false(source, name_is_neg);
    if (plain == 1 && self->is_complex) plain = is_false(source, name_is_conj);
    if (plain != 1) return plain;
    PyObject *stride = PyObject_CallMethodNoArgs(source, name_stride);
    if (stride == NULL) return -1;
    if (!PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != self->dims) {
        Py_DECREF(stride);
        return 0;
    }
    for (Py_ssize_t axis = 0; axis < self->dims; axis++) {
        strides[axis] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, axis));
        if (strides[axis] == -1 && PyErr_Occurred()) {
            Py_DECREF(stride);
            return -1;
        }
    }
    Py_DECREF(stride);
    long long value;
    if (call_for_integer(source, name_data_ptr, &value) < 0) return -1;
    *address = (char *)(uintptr_t)value;
    return value != 0;  /* no memory (a tensor of zeros without storage): copy_'s to handle */
}

/* The lowest and one past the highest byte that the writer's geometry reaches at `strides`. */
static void extent(const BlockWriter *self, char *address, const long long strides[2],
                   char **low, char **high) {
    long long first = 0, last = 0;
    const long long lengths[2] = {self->rows, self->columns};
    for (int axis = 0; axis < 2; axis++) {
        long long reach = (lengths[axis] - 1) * strides[axis] * self->itemsize;
        if (reach < 0) first += reach; else last += reach;
    }
    *low = address + first;
    *high = address + last + self->itemsize;
}

/* Column by column, each a run of rows: the blocks' columns are contiguous. Byte steps, and
 * memcpy of a constant size (one move), so that no address needs the type's alignment. */
#define COPY_AS(type)                                                                  \
    for (long long column = 0; column < self->columns; column++) {                     \
        char *to = target_address + column * target_steps[1];                          \
        const char *from = source_address + column * source_steps[1];                  \
        for (long long row = 0; row < self->rows;                                      \
             row++, to += target_steps[0], from += source_steps[0]) {                  \
            type value;                                                                \
            memcpy(&value, from, sizeof value);                                        \
            memcpy(to, &value, sizeof value);                                          \
        }                                                                              \
    }

typedef struct { uint64_t low, high; } sixteen_bytes;

/* writer(source): copy `source`, a tensor of the block's shape, dtype and device (the caller
 * checks them), into the block, bits as they are, and moves the block's version counter. */
static PyObject *BlockWriter_call(BlockWriter *self, PyObject *args, PyObject *kwargs) {
    PyObject *source;
    if (kwargs != NULL || !PyArg_UnpackTuple(args, "BlockWriter", 1, 1, &source)) {
        if (kwargs != NULL) PyErr_SetString(PyExc_TypeError, "BlockWriter takes one source");
        return NULL;
    }
    long long source_strides[2] = {0, 0};
    char *source_address = NULL;
    int readable = read_source(self, source, source_strides, &source_address);
    if (readable < 0) {
        /* A tensor that cannot say (a sparse or mkldnn one): copy_ says what it makes of it. */
        PyErr_Clear();
        readable = 0;
    }
    char *target_address = NULL;
    if (readable) {
        /* Read at every call: the block's storage is the collection's, whatever became of it. */
        long long value;
        if (call_for_integer(self->target, name_data_ptr, &value) < 0) return NULL;
        target_address = (char *)(uintptr_t)value;
        char *source_low, *source_high, *target_low, *target_high;
        extent(self, source_address, source_strides, &source_low, &source_high);
        extent(self, target_address, self->strides, &target_low, &target_high);
        readable = target_address != NULL && (source_high <= target_low || target_high <= source_low);
    }
    if (!readable) return PyObject_CallMethodOneArg(self->target, name_copy, source);
    const long long target_steps[2] = {self->strides[0] * self->itemsize,
                                       self->strides[1] * self->itemsize};
    const long long source_steps[2] = {source_strides[0] * self->itemsize,
                                       source_strides[1] * self->itemsize};
    switch (self->itemsize) {
        case 1: COPY_AS(uint8_t) break;
        case 2: COPY_AS(uint16_t) break;
        case 4: COPY_AS(uint32_t) break;
        case 8: COPY_AS(uint64_t) break;
        case 16: COPY_AS(sixteen_bytes) break;
        default: return PyObject_CallMethodOneArg(self->target, name_copy, source);
    }
    return PyObject_CallOneArg(increment_version, self->targets);
}

/* BlockWriter(target, dims, rows, columns, itemsize, row_stride, column_stride, is_complex) */
static PyObject *BlockWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *target;
    long long dims, rows, columns, itemsize, row_stride, column_stride;
    int is_complex;
    static char *keywords[] = {"target", "dims", "rows", "columns", "itemsize", "row_stride",
                               "column_stride", "is_complex", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLLLLLLp", keywords, &target, &dims, &rows,
                                     &columns, &itemsize, &row_stride, &column_stride,
                                     &is_complex)) {
        return NULL;
    }
    if ((dims != 1 && dims != 2) || (dims == 1 && (columns != 1 || column_stride != 0)) ||
        rows < 1 || columns < 1 || row_stride < 0 || column_stride < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "BlockWriter: dims 1 ([rows]; columns 1, column_stride 0) or 2 ([rows, "
                        "columns]), at least one element, strides not negative");
        return NULL;
    }
    BlockWriter *self = (BlockWriter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->targets = PyTuple_Pack(1, target);
    if (self->targets == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->target = Py_NewRef(target);
    self->dims = dims;
    self->rows = rows;
    self->columns = columns;
    self->itemsize = itemsize;
    self->strides[0] = row_stride;
    self->strides[1] = column_stride;
    self->is_complex = is_complex;
    return (PyObject *)self;
}

static void BlockWriter_dealloc(BlockWriter *self) {
    Py_XDECREF(self->target);
    Py_XDECREF(self->targets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject BlockWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "soagen.runtime._blocks.BlockWriter",
    .tp_doc = "BlockWriter(target, dims, rows, columns, itemsize, row_stride, column_stride, "
              "is_complex): called with a source tensor of the block's shape, dtype and device, "
              "writes it into the block.",
    .tp_basicsize = sizeof(BlockWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = BlockWriter_new,
    .tp_dealloc = (destructor)BlockWriter_dealloc,
    .tp_call = (ternaryfunc)BlockWriter_call,
};

static PyMethodDef methods[] = {
    {"set_torch", (PyCFunction)(void (*)(void))set_torch, METH_FASTCALL,
     "set_torch(torch.Tensor, torch._C._increment_version)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "soagen.runtime._blocks",
    "A model's result written into its output block (see soagen.runtime.buffers.block_writer).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__blocks(void) {
    name_data_ptr = PyUnicode_InternFromString("data_ptr");
    name_stride = PyUnicode_InternFromString("stride");
    name_is_neg = PyUnicode_InternFromString("is_neg");
    name_is_conj = PyUnicode_InternFromString("is_conj");
    name_copy = PyUnicode_InternFromString("copy_");
    if (!name_data_ptr || !name_stride || !name_is_neg || !name_is_conj || !name_copy) return NULL;
    if (PyType_Ready(&BlockWriterType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "BlockWriter", (PyObject *)&BlockWriterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
