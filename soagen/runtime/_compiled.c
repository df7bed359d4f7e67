/* The compiled parts of a planned call (`soagen.runtime.model`): a model's result written into its
 * output block (`BlockWriter`, for `soagen.runtime.buffers.block_writer`), the model's run around
 * it (`ModelRun`), the generated call's way to its plan (`PlannedCall`), a plan's host index
 * checks (`IndexCheckedCall`) and a graph plan's replay (`GraphCall`).
 *
 * `torch.Tensor.copy_` between small CPU tensors spends about a microsecond building its
 * TensorIterator, and once a model has run, that code is out of the instruction cache again: for a
 * [1e3, 2] result it costs more than the copy. Here the copy is a loop over the two tensors'
 * addresses and strides, read by the C functions behind their Python methods and attributes, so
 * this file needs CPython's headers only. What it does not copy itself (a tensor subclass, a
 * negative or conjugate view, a tensor without strided memory, memory shared with the block) goes
 * to `target.copy_(source)`, which copies it, or refuses it, as it always does. Likewise the
 * Python frames around the model cost more than their work once it has run; the other types here
 * do that work for a call that goes as it should and hand any other to the Python function that
 * checks it.
 *
 * Built by `pip install` (pyproject.toml: an optional extension); after editing this file, run
 * `pip install -e .` again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Set once by `set_torch`: torch.Tensor (only plain tensors are copied here), and
 * torch._C._increment_version, which moves a tensor's version counter as copy_ would: autograd
 * then refuses a backward pass through values this write replaced. It takes a tuple of tensors
 * since torch 2.5 (and iterates a tensor given alone), one tensor before. */
static PyObject *tensor_type = NULL, *increment_version = NULL;
static int increment_takes_tuple = 1;
/* The names read off tensors, interned once by the module's init. */
enum {
    /* Read off tensors, */
    DATA_PTR, STRIDE, IS_NEG, IS_CONJ, COPY, SHAPE, STORAGE_OFFSET, DIM, ELEMENT_SIZE, IS_COMPLEX,
    DTYPE, IS_CPU, VERSION, TENSOR_NAME_COUNT,
    /* off guards, */
    ENTER = TENSOR_NAME_COUNT, EXIT,
    /* and off bindings and their plans. */
    PROTECT_INPUTS, PLANS, CALL, RUN_PLAN, FAILED_PLAN, CALL_WITHOUT_PLAN,
    /* and off graphs. */
    TRAINING, MOVE_TO_END, REPLAY,
    NAME_COUNT
};
static const char *const name_texts[NAME_COUNT] = {
    "data_ptr", "stride", "is_neg", "is_conj", "copy_", "shape", "storage_offset", "dim",
    "element_size", "is_complex", "dtype", "is_cpu", "_version", "__enter__", "__exit__",
    "protect_inputs", "_plans", "call", "_run_plan", "_failed_plan", "_call_without_plan",
    "training", "move_to_end", "replay",
};
static PyObject *names[NAME_COUNT];

/* torch's own C functions behind those names on torch.Tensor, found by `set_torch`: a getter for
 * an attribute, a method's definition for a method taking no argument (or NULL: the name is
 * looked up on each read). Called directly for a plain tensor, they skip CPython's attribute
 * lookup and call dispatch, a third of a read's cost; they read the tensor itself (whatever a
 * Python attribute of the same name says), and still hand the read to an active torch function
 * mode, as the attribute would. */
static getter tensor_getters[TENSOR_NAME_COUNT];
static void *getter_closures[TENSOR_NAME_COUNT];
static PyMethodDef *tensor_methods[TENSOR_NAME_COUNT];
static PyObject *tensor_descriptors[TENSOR_NAME_COUNT];  /* held for the two above */
static PyObject *no_arguments = NULL;              /* () */

/* The method's calling conventions that `tensor_method` calls directly. */
static int called_directly(const PyMethodDef *method) {
    switch (method->ml_flags & ~METH_COEXIST) {
        case METH_NOARGS:
        case METH_VARARGS:
        case METH_VARARGS | METH_KEYWORDS:
        case METH_FASTCALL:
        case METH_FASTCALL | METH_KEYWORDS:
            return 1;
    }
    return 0;
}

/* Each name's getter or method definition on `type`, where it is one of torch's C ones. */
static int find_tensor_functions(PyObject *type) {
    for (int name = 0; name < TENSOR_NAME_COUNT; name++) {
        tensor_getters[name] = NULL;
        tensor_methods[name] = NULL;
        Py_CLEAR(tensor_descriptors[name]);
        PyObject *descriptor = PyObject_GetAttr(type, names[name]);
        if (descriptor == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
            continue;
        }
        if (Py_IS_TYPE(descriptor, &PyGetSetDescr_Type)) {
            PyGetSetDef *definition = ((PyGetSetDescrObject *)descriptor)->d_getset;
            tensor_getters[name] = definition->get;
            getter_closures[name] = definition->closure;
        } else if (Py_IS_TYPE(descriptor, &PyMethodDescr_Type) &&
                   called_directly(((PyMethodDescrObject *)descriptor)->d_method)) {
            tensor_methods[name] = ((PyMethodDescrObject *)descriptor)->d_method;
        }
        tensor_descriptors[name] = descriptor;
    }
    return 0;
}

/* `tensor.name` (an attribute); NULL with an exception set. */
static PyObject *tensor_attribute(PyObject *tensor, int name) {
    if (tensor_getters[name] != NULL && Py_TYPE(tensor) == (PyTypeObject *)tensor_type) {
        return tensor_getters[name](tensor, getter_closures[name]);
    }
    return PyObject_GetAttr(tensor, names[name]);
}

/* `tensor.name()` (a method without arguments); NULL with an exception set. */
static PyObject *tensor_method(PyObject *tensor, int name) {
    const PyMethodDef *method = tensor_methods[name];
    if (method == NULL || Py_TYPE(tensor) != (PyTypeObject *)tensor_type) {
        return PyObject_CallMethodNoArgs(tensor, names[name]);
    }
    void (*function)(void) = (void (*)(void))method->ml_meth;
    switch (method->ml_flags & ~METH_COEXIST) {
        case METH_NOARGS:
            return ((PyCFunction)function)(tensor, NULL);
        case METH_VARARGS:
            return ((PyCFunction)function)(tensor, no_arguments);
        case METH_VARARGS | METH_KEYWORDS:
            return ((PyCFunctionWithKeywords)function)(tensor, no_arguments, NULL);
        case METH_FASTCALL:
            return ((_PyCFunctionFast)function)(tensor, NULL, 0);
        default: /* METH_FASTCALL | METH_KEYWORDS */
            return ((_PyCFunctionFastWithKeywords)function)(tensor, NULL, 0, NULL);
    }
}

static PyObject *set_torch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    int takes_tuple = nargs == 3 ? PyObject_IsTrue(args[2]) : -1;
    if (takes_tuple < 0 || !PyType_Check(args[0]) || !PyCallable_Check(args[1])) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "set_torch(torch.Tensor, "
                                             "torch._C._increment_version, takes_tuple)");
        }
        return NULL;
    }
    /* No tensor is read by the functions of another type (a failed search finds none). */
    Py_CLEAR(tensor_type);
    if (find_tensor_functions(args[0]) < 0) return NULL;
    tensor_type = Py_NewRef(args[0]);
    Py_XSETREF(increment_version, Py_NewRef(args[1]));
    increment_takes_tuple = takes_tuple;
    Py_RETURN_NONE;
}

/* Set by `set_function_mode_check`: torch._C._is_torch_function_mode_enabled. Under a torch
 * function mode a plain tensor's strides, address and the rest are the mode's answers, which
 * could be anything: then nothing here reads memory by them. */
static PyObject *function_mode_enabled = NULL;

static PyObject *set_function_mode_check(PyObject *module, PyObject *check) {
    if (!PyCallable_Check(check)) {
        PyErr_SetString(PyExc_TypeError, "set_function_mode_check(callable)");
        return NULL;
    }
    Py_XSETREF(function_mode_enabled, Py_NewRef(check));
    Py_RETURN_NONE;
}

/* Whether a torch function mode is active: 1, 0, or -1 with an exception set (1 where no check
 * was set: nothing is read by the tensors' answers then). */
static int modes_active(void) {
    if (function_mode_enabled == NULL) return 1;
    PyObject *enabled = PyObject_CallNoArgs(function_mode_enabled);
    if (enabled == NULL) return -1;
    int truth = PyObject_IsTrue(enabled);
    Py_DECREF(enabled);
    return truth;
}

/* `tensor.name()` as a C integer; -1 with an exception set on failure. */
static int call_for_integer(PyObject *tensor, int name, long long *value) {
    PyObject *result = tensor_method(tensor, name);
    if (result == NULL) return -1;
    *value = PyLong_AsLongLong(result);
    Py_DECREF(result);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* `tensor.data_ptr()` as an address; -1 with an exception set on failure. */
static int call_for_address(PyObject *tensor, char **address) {
    PyObject *result = tensor_method(tensor, DATA_PTR);
    if (result == NULL) return -1;
    *address = (char *)PyLong_AsVoidPtr(result);
    Py_DECREF(result);
    return (*address == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* A tuple of `count` integers (a shape or strides) into `values`: 1, 0 where it is not such a
 * tuple, -1 with an exception set. */
static int read_integers(PyObject *tuple, long long count, long long values[2]) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != count) return 0;
    for (Py_ssize_t axis = 0; axis < count; axis++) {
        values[axis] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, axis));
        if (values[axis] == -1 && PyErr_Occurred()) return -1;
    }
    return 1;
}

/* Whether `tensor.name()` is false; -1 with an exception set on failure. */
static int is_false(PyObject *tensor, int name) {
    PyObject *result = tensor_method(tensor, name);
    if (result == NULL) return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth < 0 ? -1 : !truth;
}

/* `tensor`'s `dims` strides (into `strides`) and its address: 1 where its values lie in memory
 * there; 0 where the strides are no such tuple, or no memory is behind it (a tensor of zeros
 * without storage, sliced or not, reports its offset's bytes past none as its address); -1 with
 * an exception set. */
static int read_memory(PyObject *tensor, Py_ssize_t dims, long long itemsize, long long *strides,
                       char **address) {
    PyObject *stride = tensor_method(tensor, STRIDE);
    if (stride == NULL) return -1;
    int readable = read_integers(stride, dims, strides);
    Py_DECREF(stride);
    if (readable != 1) return readable;
    long long offset;
    if (call_for_integer(tensor, STORAGE_OFFSET, &offset) < 0 ||
        call_for_address(tensor, address) < 0) {
        return -1;
    }
    return *address != NULL && (uintptr_t)*address != (uintptr_t)(offset * itemsize);
}

/* Whether a vectorcall passed `count` positional arguments and no keyword; else a TypeError
 * saying `message` is set. */
static int called_with(size_t nargsf, PyObject *kwnames, Py_ssize_t count, const char *message) {
    int keywords = kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0;
    if (PyVectorcall_NARGS(nargsf) == count && !keywords) return 1;
    PyErr_SetString(PyExc_TypeError, message);
    return 0;
}

/* The garbage collector's functions of a type here, from the offsets of the objects it owns
 * (fields that may be NULL included): tp_traverse visits them, tp_clear and tp_dealloc release
 * them. A call after tp_clear finds them NULL and raises. */
static int traverse_fields(PyObject *self, const Py_ssize_t *fields, visitproc visit, void *arg) {
    for (; *fields >= 0; fields++) Py_VISIT(*(PyObject **)((char *)self + *fields));
    return 0;
}

static int clear_fields(PyObject *self, const Py_ssize_t *fields) {
    for (; *fields >= 0; fields++) {
        PyObject **field = (PyObject **)((char *)self + *fields);
        Py_CLEAR(*field);
    }
    return 0;
}

#define GC_FUNCTIONS(Type, ...)                                                            \
    static const Py_ssize_t Type##_fields[] = {__VA_ARGS__, -1};                          \
    static int Type##_traverse(PyObject *self, visitproc visit, void *arg) {              \
        return traverse_fields(self, Type##_fields, visit, arg);                          \
    }                                                                                     \
    static int Type##_clear(PyObject *self) { return clear_fields(self, Type##_fields); } \
    static void Type##_dealloc(PyObject *self) {                                          \
        PyObject_GC_UnTrack(self);                                                        \
        clear_fields(self, Type##_fields);                                                \
        Py_TYPE(self)->tp_free(self);                                                     \
    }

/* The slots every callable type here shares: its name, size, vectorcall, GC and constructor. */
#define CALLABLE_TYPE_SLOTS(Type, more_flags)                                              \
    .tp_name = "soagen.runtime._compiled." #Type, .tp_basicsize = sizeof(Type),           \
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |    \
                (more_flags),                                                             \
    .tp_vectorcall_offset = offsetof(Type, vectorcall), .tp_new = Type##_new,             \
    .tp_traverse = Type##_traverse, .tp_clear = Type##_clear, .tp_dealloc = Type##_dealloc, \
    .tp_call = PyVectorcall_Call

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* BlockWriter_vectorcall: a call without an argument tuple */
    PyObject *target;  /* the output block: a plain CPU tensor, held for its memory */
    PyObject *targets; /* (target,), for increment_version */
    PyObject *dtype;   /* the target's torch.dtype (one object per dtype) */
    /* Called with the sources that the vectorized loops do not copy, where given (a large block's
     * `copy_values`, which beats the general loop there); else the general loop copies them. */
    PyObject *fallback;
    long long dims;    /* 1: [rows] (columns 1), 2: [rows, columns] */
    long long rows, columns, itemsize;
    long long strides[2];  /* the target's, in elements (0 for a missing second axis) */
    int is_complex;        /* whether a conjugate bit could change the values */
} BlockWriter;

/* What `read_source` found of a source. */
enum {
    SOURCE_OTHER = 0,  /* not a plain CPU tensor of the block's dtype and shape, or not read here */
    SOURCE_COPY_ = 1,  /* of the block's signature, but copy_ writes it (see below) */
    SOURCE_LOOP = 2,   /* of the block's signature, in memory the loops may read */
};

/* A RuntimeError raised by a read (a tensor that cannot say: a sparse or mkldnn one has no
 * strides) taken as `status`; any other error raised (-1). */
static int unless_runtime_error(int status) {
    if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) return -1;
    PyErr_Clear();
    return status;
}

/* The source checked at the write itself, whatever Python code ran since the caller checked it
 * (`t.data = ...` changes a tensor's dtype in place): SOURCE_LOOP, with its element strides and
 * address, for a plain CPU tensor of the block's dtype and shape, with memory, without a neg or
 * conj bit; SOURCE_COPY_ for one of the block's signature that copy_ must write; SOURCE_OTHER for
 * any other, and under a torch function mode (whose answers could be anything); -1 with an
 * exception set. Torch keeps a tensor's shape, strides and offset inside its storage. */
static int read_source(BlockWriter *self, PyObject *source, long long strides[2], char **address) {
    if (increment_version == NULL || Py_TYPE(source) != (PyTypeObject *)tensor_type) {
        return SOURCE_OTHER;
    }
    int active = modes_active();
    if (active != 0) return active < 0 ? -1 : SOURCE_OTHER;
    PyObject *dtype = tensor_attribute(source, DTYPE);
    if (dtype == NULL) return unless_runtime_error(SOURCE_OTHER);
    Py_DECREF(dtype);  /* compared by identity only */
    if (dtype != self->dtype) return SOURCE_OTHER;
    PyObject *is_cpu = tensor_attribute(source, IS_CPU);
    if (is_cpu == NULL) return unless_runtime_error(SOURCE_OTHER);
    int on_cpu = PyObject_IsTrue(is_cpu);
    Py_DECREF(is_cpu);
    if (on_cpu != 1) return on_cpu;  /* -1: an error; 0: another device */
    PyObject *shape = tensor_attribute(source, SHAPE);
    if (shape == NULL) return unless_runtime_error(SOURCE_OTHER);
    long long sizes[2] = {0, 0};
    int readable = read_integers(shape, self->dims, sizes);
    Py_DECREF(shape);
    if (readable != 1) return readable;
    if (sizes[0] != self->rows || (self->dims == 2 && sizes[1] != self->columns)) {
        return SOURCE_OTHER;
    }
    readable = is_false(source, IS_NEG);
    if (readable == 1 && self->is_complex) readable = is_false(source, IS_CONJ);
    if (readable == 1) readable = read_memory(source, self->dims, self->itemsize, strides, address);
    if (readable < 0) return unless_runtime_error(SOURCE_COPY_);
    if (readable == 0) return SOURCE_COPY_;  /* a neg or conj bit, no memory behind it */
    /* A stride of an axis of one value is never stepped (and may be any number). */
    if (self->rows == 1) strides[0] = 0;
    if (self->columns == 1) strides[1] = 0;
    return SOURCE_LOOP;
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

/* Column by column, each a run of rows: any strides. Byte steps, and memcpy of a constant size
 * (one move), so that no address needs the type's alignment. */
#define COPY_AS(type)                                                                  \
    for (long long column = 0; column < columns; column++) {                           \
        char *to = target_address + column * target_steps[1];                          \
        const char *from = source_address + column * source_steps[1];                  \
        for (long long row = 0; row < rows; row++, to += target_steps[0], from += source_steps[0]) { \
            type value;                                                                \
            memcpy(&value, from, sizeof value);                                        \
            memcpy(to, &value, sizeof value);                                          \
        }                                                                              \
    }

typedef struct { uint64_t low, high; } sixteen_bytes;

/* A row-major source (a model's [rows, COUNT] result) into columns that each run contiguously
 * (`pitch` bytes apart): with the count a constant the compiler vectorizes the de-interleave,
 * about four times the speed of the loop above with its steps read at run time. */
#define SPLIT_ROWS(type, count)                                                                \
    static void split_rows_##type##_##count(char *restrict to, long long pitch,                \
                                            const char *restrict from, long long rows) {       \
        for (long long row = 0; row < rows; row++) {                                           \
            for (long long column = 0; column < count; column++) {                             \
                type value;                                                                    \
                memcpy(&value, from + (row * count + column) * (long long)sizeof value,        \
                       sizeof value);                                                          \
                memcpy(to + column * pitch + row * (long long)sizeof value, &value,            \
                       sizeof value);                                                          \
            }                                                                                  \
        }                                                                                      \
    }
#define SPLIT_ROWS_OF(type) SPLIT_ROWS(type, 2) SPLIT_ROWS(type, 3) SPLIT_ROWS(type, 4)
SPLIT_ROWS_OF(uint8_t)
SPLIT_ROWS_OF(uint16_t)
SPLIT_ROWS_OF(uint32_t)
SPLIT_ROWS_OF(uint64_t)

typedef void (*split_rows_function)(char *restrict, long long, const char *restrict, long long);
/* By log2 of the value's width (1 to 8 bytes), then the row's count less 2 (2 to 4 values). */
static const split_rows_function split_rows[4][3] = {
    {split_rows_uint8_t_2, split_rows_uint8_t_3, split_rows_uint8_t_4},
    {split_rows_uint16_t_2, split_rows_uint16_t_3, split_rows_uint16_t_4},
    {split_rows_uint32_t_2, split_rows_uint32_t_3, split_rows_uint32_t_4},
    {split_rows_uint64_t_2, split_rows_uint64_t_3, split_rows_uint64_t_4},
};

/* The copy of the source's values (at `source_address`, `source_steps` bytes apart) into the
 * block's, which lie apart from them: 1 where copied, 0 where only the general loop would copy
 * them and the writer has a fallback. */
static int copy_values(const BlockWriter *self, char *target_address, const char *source_address,
                        const long long source_steps[2]) {
    const long long rows = self->rows, columns = self->columns, itemsize = self->itemsize;
    const long long target_steps[2] = {self->strides[0] * itemsize, self->strides[1] * itemsize};
    if (source_steps[0] == itemsize && target_steps[0] == itemsize) {
        /* Both columns run contiguously (a single column, or a column-major result). */
        for (long long column = 0; column < columns; column++) {
            memcpy(target_address + column * target_steps[1],
                   source_address + column * source_steps[1], (size_t)(rows * itemsize));
        }
        return 1;
    }
    int width = itemsize == 1 ? 0 : itemsize == 2 ? 1 : itemsize == 4 ? 2 : itemsize == 8 ? 3 : -1;
    if (width >= 0 && columns >= 2 && columns <= 4 && target_steps[0] == itemsize &&
        source_steps[1] == itemsize && source_steps[0] == columns * itemsize) {
        split_rows[width][columns - 2](target_address, target_steps[1], source_address, rows);
        return 1;
    }
    if (self->fallback != NULL) return 0;
    switch (itemsize) {
        case 1: COPY_AS(uint8_t) break;
        case 2: COPY_AS(uint16_t) break;
        case 4: COPY_AS(uint32_t) break;
        case 8: COPY_AS(uint64_t) break;
        case 16: COPY_AS(sixteen_bytes) break;
    }
    return 1;
}

/* `source` written into the block, bits as they are, and the block's version counter moved (as
 * copy_ moves it): by the loops where `read_source` found SOURCE_LOOP (`strides`, `address`) and
 * the two lie apart, else by the fallback or copy_. A new reference, or NULL with an exception
 * set. */
static PyObject *write_source(BlockWriter *self, PyObject *source, int status,
                              const long long source_strides[2], char *source_address) {
    int readable = status == SOURCE_LOOP;
    char *target_address = NULL;
    if (readable) {
        /* Read at every call: the block's storage is the collection's, whatever became of it. */
        if (call_for_address(self->target, &target_address) < 0) return NULL;
        char *source_low, *source_high, *target_low, *target_high;
        extent(self, source_address, source_strides, &source_low, &source_high);
        extent(self, target_address, self->strides, &target_low, &target_high);
        readable = target_address != NULL &&
                   (source_high <= target_low || target_high <= source_low);
    }
    const long long source_steps[2] = {source_strides[0] * self->itemsize,
                                       source_strides[1] * self->itemsize};
    int copied = 0;
    if (readable && (self->itemsize == 1 || self->itemsize == 2 || self->itemsize == 4 ||
                     self->itemsize == 8 || self->itemsize == 16)) {
        /* Other threads run while a large block is copied, as they do during ATen's copies:
         * this holds both tensors, and the loop touches no Python object. */
        if (self->rows * self->columns >= 1 << 15) {
            Py_BEGIN_ALLOW_THREADS
            copied = copy_values(self, target_address, source_address, source_steps);
            Py_END_ALLOW_THREADS
        } else {
            copied = copy_values(self, target_address, source_address, source_steps);
        }
    }
    if (!copied) {
        if (self->fallback != NULL) return PyObject_CallOneArg(self->fallback, source);
        return PyObject_CallMethodOneArg(self->target, names[COPY], source);
    }
    return PyObject_CallOneArg(increment_version,
                               increment_takes_tuple ? self->targets : self->target);
}

/* Whether the writer's block was cleared (by the garbage collector's tp_clear); then an error
 * is set. */
static int writer_cleared(BlockWriter *self) {
    if (self->target != NULL && self->targets != NULL && self->dtype != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "BlockWriter: its block was cleared");
    return 1;
}

/* writer(source): copy `source`, a tensor of the block's shape, dtype and device (the caller
 * checks them), into the block, bits as they are, and moves the block's version counter. */
static PyObject *BlockWriter_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    BlockWriter *self = (BlockWriter *)callable;
    if (!called_with(nargsf, kwnames, 1, "BlockWriter takes one source")) return NULL;
    if (writer_cleared(self)) return NULL;
    long long source_strides[2] = {0, 0};
    char *source_address = NULL;
    int status = read_source(self, args[0], source_strides, &source_address);
    if (status < 0) return NULL;
    return write_source(self, args[0], status, source_strides, source_address);
}

/* BlockWriter(target, fallback=None): its geometry read off the block, a plain CPU tensor of one
 * or two axes holding at least one element, whose values lie apart (no stride 0), without a neg
 * or conj bit (the caller checks the device). ValueError for any other. `fallback`, a callable
 * or None: see the struct's field. */
static PyObject *BlockWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *target, *fallback = Py_None;
    static char *keywords[] = {"target", "fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", keywords, &target, &fallback)) {
        return NULL;
    }
    if (fallback != Py_None && !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "BlockWriter: the fallback is neither callable nor None");
        return NULL;
    }
    if (increment_version == NULL || Py_TYPE(target) != (PyTypeObject *)tensor_type) {
        PyErr_SetString(PyExc_ValueError, "BlockWriter: the block is not a plain torch.Tensor "
                                          "(or set_torch was not called)");
        return NULL;
    }
    /* Its geometry, read under a torch function mode, would be the mode's answers. */
    int active = modes_active();
    if (active != 0) {
        if (active > 0) {
            PyErr_SetString(PyExc_ValueError, "BlockWriter: made under a torch function mode");
        }
        return NULL;
    }
    long long dims, itemsize, sizes[2] = {1, 1}, strides[2] = {0, 0};
    if (call_for_integer(target, DIM, &dims) < 0) return NULL;
    if (dims != 1 && dims != 2) {
        PyErr_SetString(PyExc_ValueError, "BlockWriter: the block has neither one axis nor two");
        return NULL;
    }
    PyObject *shape = tensor_attribute(target, SHAPE);
    if (shape == NULL) return NULL;
    int read = read_integers(shape, dims, sizes);
    Py_DECREF(shape);
    PyObject *stride = read == 1 ? tensor_method(target, STRIDE) : NULL;
    if (stride != NULL) {
        read = read_integers(stride, dims, strides);
        Py_DECREF(stride);
    } else if (read == 1) {
        return NULL;
    }
    if (read < 0 || call_for_integer(target, ELEMENT_SIZE, &itemsize) < 0) return NULL;
    int plain = read == 1 ? is_false(target, IS_NEG) : 0;
    if (plain == 1) plain = is_false(target, IS_CONJ);
    if (plain < 0) return NULL;
    int is_complex = is_false(target, IS_COMPLEX);
    if (is_complex < 0) return NULL;
    is_complex = !is_complex;
    if (!plain || sizes[0] < 1 || sizes[1] < 1 || strides[0] < 1 || (dims == 2 && strides[1] < 1)) {
        PyErr_SetString(PyExc_ValueError, "BlockWriter: the block holds no element, has values "
                                          "over each other, or a neg or conj bit");
        return NULL;
    }
    BlockWriter *self = (BlockWriter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->target = Py_NewRef(target);
    self->targets = PyTuple_Pack(1, target);
    self->dtype = tensor_attribute(target, DTYPE);
    self->fallback = fallback == Py_None ? NULL : Py_NewRef(fallback);
    if (self->targets == NULL || self->dtype == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->dims = dims;
    self->rows = sizes[0];
    self->columns = sizes[1];
    self->itemsize = itemsize;
    /* As the source's (`read_source`): never stepped where the axis has one value. */
    self->strides[0] = sizes[0] == 1 ? 0 : strides[0];
    self->strides[1] = sizes[1] == 1 ? 0 : strides[1];
    self->is_complex = is_complex;
    self->vectorcall = BlockWriter_vectorcall;
    return (PyObject *)self;
}

GC_FUNCTIONS(BlockWriter,
             offsetof(BlockWriter, target), offsetof(BlockWriter, targets),
             offsetof(BlockWriter, dtype), offsetof(BlockWriter, fallback))

static PyTypeObject BlockWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    CALLABLE_TYPE_SLOTS(BlockWriter, 0),
    .tp_doc = "BlockWriter(target, fallback=None): called with a source tensor of the block's "
              "shape, dtype and device, writes it into the block (a plain CPU tensor of one or "
              "two axes); fallback(source) writes what its vectorized loops do not.",
};


/* A call plan's model run (`soagen.runtime.model.ModelBinding._model_call`), for backends that
 * return their results: the inputs' version counters read, the runner called under the guard,
 * then, where the run went as it should (the counters unmoved, results that are plain tensors
 * of their blocks' signatures), each result written by its block's writer. Anything else goes,
 * with what was read, to `finish`: the Python function that checks it, says what went wrong, and
 * writes what it must. The run, the checks and the write are what `finish` does for the same
 * result; this only spares a well-behaved call the Python frames. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *runner;     /* runner(views) -> the model's return value */
    PyObject *guard;      /* guard(True): a context manager the runner runs in; NULL for none */
    PyObject *signature;  /* signature(tensor) -> (shape, dtype, device) */
    PyObject *signatures; /* a tuple: each output block's signature, in schema order */
    PyObject *writers;    /* a tuple: each output block's writer, in schema order */
    PyObject *finish;     /* finish(views, versions or None, result) -> list of results */
    int watched;          /* whether the views' version counters are compared around the run */
} ModelRun;

/* Each view's version counter into `versions` (`count` of them); -1 with an exception set. */
static int read_versions(PyObject *const *views, Py_ssize_t count, long long *versions) {
    for (Py_ssize_t position = 0; position < count; position++) {
        PyObject *version = tensor_attribute(views[position], VERSION);
        if (version == NULL) return -1;
        versions[position] = PyLong_AsLongLong(version);
        Py_DECREF(version);
        if (versions[position] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* `value` made the exception being handled, as inside an `except` block, its predecessor kept in
 * `saved` until `stop_handling`: an exception raised meanwhile gets it as its context, chained
 * as Python chains exceptions. */
static void start_handling(PyObject *type, PyObject *value, PyObject *traceback,
                           PyObject *saved[3]) {
    PyErr_GetExcInfo(&saved[0], &saved[1], &saved[2]);
    PyErr_SetExcInfo(Py_XNewRef(type), Py_XNewRef(value), Py_XNewRef(traceback));
}

static void stop_handling(PyObject *saved[3]) {
    PyErr_SetExcInfo(saved[0], saved[1], saved[2]);
}

/* The exception now set, taken out of the thread's state (normalized, its traceback attached):
 * a new reference to its value, which `PyErr_Restore` puts back with `type` and `traceback`. */
static PyObject *fetch_error(PyObject **type, PyObject **traceback) {
    PyObject *value;
    PyErr_Fetch(type, &value, traceback);
    PyErr_NormalizeException(type, &value, traceback);
    if (*traceback != NULL && value != NULL) PyException_SetTraceback(value, *traceback);
    return value;
}

/* The runner on `views` inside the guard, as a `with` statement runs it: its return value (None
 * where the guard swallowed the runner's exception), or NULL with an exception set. */
static PyObject *run_guarded(ModelRun *self, PyObject *views) {
    if (self->guard == NULL) return PyObject_CallOneArg(self->runner, views);
    PyObject *context = PyObject_CallOneArg(self->guard, Py_True);
    if (context == NULL) return NULL;
    PyObject *entered = PyObject_CallMethodNoArgs(context, names[ENTER]);
    if (entered == NULL) {
        Py_DECREF(context);
        return NULL;
    }
    Py_DECREF(entered);
    PyObject *result = PyObject_CallOneArg(self->runner, views);
    PyObject *exited;
    if (result != NULL) {
        exited = PyObject_CallMethodObjArgs(context, names[EXIT], Py_None, Py_None, Py_None, NULL);
    } else {
        /* The runner's exception goes on once the guard has exited, unless __exit__ returns
         * true; an error of the guard's own replaces it, with it as its context. */
        PyObject *type, *traceback, *value = fetch_error(&type, &traceback), *saved[3];
        start_handling(type, value, traceback, saved);
        exited = PyObject_CallMethodObjArgs(context, names[EXIT], type, value,
                                            traceback != NULL ? traceback : Py_None, NULL);
        int swallowed = exited != NULL ? PyObject_IsTrue(exited) : -1;
        stop_handling(saved);
        if (swallowed == 1) {
            result = Py_NewRef(Py_None);
        }
        if (swallowed == 0) {
            PyErr_Restore(type, value, traceback);
        } else {
            if (swallowed < 0) Py_CLEAR(exited);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        }
    }
    Py_DECREF(context);
    if (exited == NULL) {
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(exited);
    return result;
}

/* run(views): the model run on `views` (a list), its results written; returns them as a list. */
static PyObject *ModelRun_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    ModelRun *self = (ModelRun *)callable;
    if (!called_with(nargsf, kwnames, 1, "ModelRun takes the list of input views")) return NULL;
    if (self->runner == NULL || self->signatures == NULL || self->writers == NULL ||
        self->finish == NULL || self->signature == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ModelRun: it was cleared");
        return NULL;
    }
    PyObject *views = args[0];
    if (!PyList_CheckExact(views)) {
        PyErr_SetString(PyExc_TypeError, "ModelRun takes the list of input views");
        return NULL;
    }
    PyObject *held = NULL, *result = NULL, *written = NULL;
    const Py_ssize_t outputs = PyTuple_GET_SIZE(self->writers);
    int usual = 1;
    /* The counters before the run, then after it, read off a copy of the list (the runner may
     * change the list itself). */
    Py_ssize_t count = self->watched ? PyList_GET_SIZE(views) : 0;
    long long stack_versions[32];
    long long *versions = stack_versions;
    if (count > 16) {
        versions = PyMem_Malloc((size_t)count * 2 * sizeof(long long));
        if (versions == NULL) return PyErr_NoMemory();
    }
    if (count > 0) {
        held = PyList_GetSlice(views, 0, count);
        if (held == NULL || read_versions(&PyList_GET_ITEM(held, 0), count, versions) < 0) {
            goto done;
        }
    }
    result = run_guarded(self, views);
    if (result == NULL) goto done;
    if (count > 0) {
        /* A runner that changed the list goes to `finish`, which reads the list as it is. */
        usual = PyList_GET_SIZE(views) == count;
        for (Py_ssize_t position = 0; usual && position < count; position++) {
            usual = PyList_GET_ITEM(views, position) == PyList_GET_ITEM(held, position);
        }
        if (read_versions(&PyList_GET_ITEM(held, 0), count, versions + count) < 0) goto done;
        usual = usual && memcmp(versions, versions + count, (size_t)count * sizeof(long long)) == 0;
    }
    /* The results in a list of this call's own before anything runs Python code (a signature
     * read may: a torch function mode), which could change a list the runner returned. */
    if (usual && Py_TYPE(result) == (PyTypeObject *)tensor_type && outputs == 1) {
        written = PyList_New(1);
        if (written != NULL) PyList_SET_ITEM(written, 0, Py_NewRef(result));
    } else if (usual && (PyTuple_CheckExact(result) || PyList_CheckExact(result)) &&
               Py_SIZE(result) == outputs) {
        written = PySequence_List(result);
    } else {
        usual = 0;
    }
    if (usual && written == NULL) goto done;
    if (usual && outputs == 1 && Py_IS_TYPE(PyTuple_GET_ITEM(self->writers, 0), &BlockWriterType)) {
        /* A single output's BlockWriter checks and writes it at once: its source check reads
         * the signature the check below would. */
        BlockWriter *writer = (BlockWriter *)PyTuple_GET_ITEM(self->writers, 0);
        PyObject *item = PyList_GET_ITEM(written, 0);
        long long strides[2] = {0, 0};
        char *address = NULL;
        int status = writer_cleared(writer) ? -1 : read_source(writer, item, strides, &address);
        if (status > SOURCE_OTHER) {
            PyObject *wrote = write_source(writer, item, status, strides, address);
            if (wrote == NULL) Py_CLEAR(written);
            Py_XDECREF(wrote);
            goto done;
        }
        if (status < 0) {
            Py_CLEAR(written);
            goto done;
        }
        usual = 0;  /* not the block's signature, or not read here: `finish` takes it */
    }
    for (Py_ssize_t position = 0; usual && position < outputs; position++) {
        PyObject *item = PyList_GET_ITEM(written, position);
        if (Py_TYPE(item) != (PyTypeObject *)tensor_type) {
            usual = 0;
            break;
        }
        PyObject *signature = PyObject_CallOneArg(self->signature, item);
        if (signature == NULL) {
            Py_CLEAR(written);
            goto done;
        }
        usual = PyObject_RichCompareBool(signature, PyTuple_GET_ITEM(self->signatures, position),
                                         Py_EQ);
        Py_DECREF(signature);
        if (usual < 0) {
            Py_CLEAR(written);
            goto done;
        }
    }
    if (!usual) {
        /* `finish` checks all of it again and says what went wrong (or writes what is right). */
        Py_CLEAR(written);
        PyObject *read = Py_None;
        if (count > 0) {
            read = PyList_New(count);
            for (Py_ssize_t position = 0; read != NULL && position < count; position++) {
                PyObject *version = PyLong_FromLongLong(versions[position]);
                if (version == NULL) Py_CLEAR(read);
                else PyList_SET_ITEM(read, position, version);
            }
            if (read == NULL) goto done;
        } else {
            Py_INCREF(read);
        }
        written = PyObject_CallFunctionObjArgs(self->finish, views, read, result, NULL);
        Py_DECREF(read);
        goto done;
    }
    for (Py_ssize_t position = 0; position < outputs; position++) {
        PyObject *wrote = PyObject_CallOneArg(PyTuple_GET_ITEM(self->writers, position),
                                              PyList_GET_ITEM(written, position));
        if (wrote == NULL) {
            Py_CLEAR(written);
            break;
        }
        Py_DECREF(wrote);
    }
done:
    Py_XDECREF(result);
    Py_XDECREF(held);
    if (versions != stack_versions) PyMem_Free(versions);
    return written;
}

/* ModelRun(runner, guard, signature, signatures, writers, finish, watched): see the struct. */
static PyObject *ModelRun_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *runner, *guard, *signature, *signatures, *writers, *finish;
    int watched;
    static char *keywords[] = {"runner", "guard", "signature", "signatures", "writers", "finish",
                               "watched", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!O!Op", keywords, &runner, &guard,
                                     &signature, &PyTuple_Type, &signatures, &PyTuple_Type,
                                     &writers, &finish, &watched)) {
        return NULL;
    }
    if (tensor_type == NULL || !PyCallable_Check(runner) || !PyCallable_Check(signature) ||
        !PyCallable_Check(finish) || (guard != Py_None && !PyCallable_Check(guard)) ||
        PyTuple_GET_SIZE(writers) == 0 ||
        PyTuple_GET_SIZE(writers) != PyTuple_GET_SIZE(signatures)) {
        PyErr_SetString(PyExc_ValueError, "ModelRun: callables for runner, guard (or None), "
                                          "signature and finish, and one signature per writer "
                                          "(or set_torch was not called)");
        return NULL;
    }
    ModelRun *self = (ModelRun *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = ModelRun_vectorcall;
    self->runner = Py_NewRef(runner);
    self->guard = guard == Py_None ? NULL : Py_NewRef(guard);
    self->signature = Py_NewRef(signature);
    self->signatures = Py_NewRef(signatures);
    self->writers = Py_NewRef(writers);
    self->finish = Py_NewRef(finish);
    self->watched = watched;
    return (PyObject *)self;
}

GC_FUNCTIONS(ModelRun,
             offsetof(ModelRun, runner), offsetof(ModelRun, guard), offsetof(ModelRun, signature),
             offsetof(ModelRun, signatures), offsetof(ModelRun, writers),
             offsetof(ModelRun, finish))

static PyTypeObject ModelRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    CALLABLE_TYPE_SLOTS(ModelRun, 0),
    .tp_doc = "ModelRun(runner, guard, signature, signatures, writers, finish, watched): called "
              "with the list of input views, runs the model on them and writes its results, or "
              "hands what it read to finish(views, versions, result).",
};

/* The generated call's path through a binding's call plans (`ModelBinding._call_in_schema_order`,
 * which it replaces on the class where this was built): a method, called with the binding, the
 * call's collections (inputs then outputs, in schema order), the stream and the batch size. A
 * call with the collections of a plan whose run is one call (`plan.call`) makes that call, and
 * on an error, hands it to `binding._failed_plan(plan, error)` before raising it; one with a
 * plan without it runs `binding._run_plan(plan, collections)`. Any other call goes to the Python
 * function it replaces, which does the same in Python. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function;  /* the Python method: every call not made here */
} PlannedCall;

/* The plan of `binding`'s call with `collections` (a new reference), or NULL: none, or an
 * exception set. `key` is set to the plans' key of the call (a new reference) where it was
 * looked up, else NULL (protected inputs, no plans kept). */
static PyObject *find_plan(PyObject *binding, PyObject *collections, PyObject **key) {
    *key = NULL;
    PyObject *protect = PyObject_GetAttr(binding, names[PROTECT_INPUTS]);
    int protected = protect == NULL ? -1 : PyObject_IsTrue(protect);
    Py_XDECREF(protect);
    if (protected != 0) return NULL;
    PyObject *plans = PyObject_GetAttr(binding, names[PLANS]);
    if (plans == NULL || !PyDict_CheckExact(plans)) {
        Py_XDECREF(plans);
        return NULL;
    }
    /* `tuple(map(id, collections))`: plans are kept by their collections' ids. */
    const Py_ssize_t count = PyTuple_GET_SIZE(collections);
    PyObject *plan = NULL;
    *key = PyTuple_New(count);
    for (Py_ssize_t position = 0; *key != NULL && position < count; position++) {
        PyObject *id = PyLong_FromVoidPtr(PyTuple_GET_ITEM(collections, position));
        if (id == NULL) Py_CLEAR(*key);
        else PyTuple_SET_ITEM(*key, position, id);
    }
    if (*key != NULL) {
        plan = Py_XNewRef(PyDict_GetItemWithError(plans, *key));
        if (plan == NULL && PyErr_Occurred()) Py_CLEAR(*key);
    }
    Py_DECREF(plans);
    return plan;
}

static PyObject *PlannedCall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    PlannedCall *self = (PlannedCall *)callable;
    if (self->function == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PlannedCall: it was cleared");
        return NULL;
    }
    PyObject *plan = NULL, *key = NULL;
    if (PyVectorcall_NARGS(nargsf) == 4 && kwnames == NULL && PyTuple_CheckExact(args[1]) &&
        args[2] == Py_None && args[3] == Py_None) {
        plan = find_plan(args[0], args[1], &key);
        if (plan == NULL && PyErr_Occurred()) return NULL;
    }
    if (plan == NULL) {
        if (key == NULL) return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
        /* The Python method's path from there, without its lookup again. */
        PyObject *done = PyObject_CallMethodObjArgs(args[0], names[CALL_WITHOUT_PLAN], args[1],
                                                    Py_None, Py_None, key, NULL);
        Py_DECREF(key);
        return done;
    }
    Py_XDECREF(key);
    PyObject *binding = args[0], *result;
    PyObject *call = PyObject_GetAttr(plan, names[CALL]);
    if (call == NULL) {
        result = NULL;
    } else if (call == Py_None) {
        result = PyObject_CallMethodObjArgs(binding, names[RUN_PLAN], plan, args[1], NULL);
    } else {
        result = PyObject_CallNoArgs(call);
        if (result == NULL) {
            PyObject *type, *traceback, *error = fetch_error(&type, &traceback), *saved[3];
            start_handling(type, error, traceback, saved);
            PyObject *failed = PyObject_CallMethodObjArgs(binding, names[FAILED_PLAN], plan,
                                                          error != NULL ? error : Py_None, NULL);
            stop_handling(saved);
            if (failed != NULL) {
                Py_DECREF(failed);
                PyErr_Restore(type, error, traceback);
            } else {
                /* Its own error (the index range that the model refused) is raised instead. */
                Py_XDECREF(type);
                Py_XDECREF(error);
                Py_XDECREF(traceback);
            }
        }
    }
    Py_XDECREF(call);
    Py_DECREF(plan);
    if (result == NULL) return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* PlannedCall(function): see the struct; `function`, the Python method it stands for. */
static PyObject *PlannedCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function;
    static char *keywords[] = {"function", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", keywords, &function)) return NULL;
    if (!PyCallable_Check(function)) {
        PyErr_SetString(PyExc_TypeError, "PlannedCall(function): a callable");
        return NULL;
    }
    PlannedCall *self = (PlannedCall *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = PlannedCall_vectorcall;
    self->function = Py_NewRef(function);
    return (PyObject *)self;
}

/* As a function in a class: `binding.method` is the method bound to the binding. */
static PyObject *PlannedCall_get(PyObject *self, PyObject *instance, PyObject *owner) {
    if (instance == NULL || instance == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, instance);
}

GC_FUNCTIONS(PlannedCall,
             offsetof(PlannedCall, function))

static PyMemberDef PlannedCall_members[] = {
    {"function", T_OBJECT, offsetof(PlannedCall, function), READONLY,
     "the Python method it stands for"},
    {NULL, 0, 0, 0, NULL},
};

/* The Python method's name, qualified name, module and doc, and the method itself as the one it
 * wraps: `inspect.signature` and `help` show the method's. */
static PyObject *PlannedCall_function_attribute(PlannedCall *self, void *name) {
    if (self->function == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PlannedCall: it was cleared");
        return NULL;
    }
    if (name == NULL) return Py_NewRef(self->function);
    return PyObject_GetAttrString(self->function, (const char *)name);
}

static PyGetSetDef PlannedCall_getset[] = {
    {"__name__", (getter)PlannedCall_function_attribute, NULL, NULL, "__name__"},
    {"__qualname__", (getter)PlannedCall_function_attribute, NULL, NULL, "__qualname__"},
    {"__module__", (getter)PlannedCall_function_attribute, NULL, NULL, "__module__"},
    {"__doc__", (getter)PlannedCall_function_attribute, NULL, NULL, "__doc__"},
    {"__wrapped__", (getter)PlannedCall_function_attribute, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlannedCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    CALLABLE_TYPE_SLOTS(PlannedCall, Py_TPFLAGS_METHOD_DESCRIPTOR),
    .tp_doc = "PlannedCall(function): a method that runs the call plan of a binding's call "
              "(binding, collections, stream, batch_size) where it has one, and calls function "
              "(the Python method it stands for) with any other.",
    .tp_descr_get = PlannedCall_get,
    .tp_members = PlannedCall_members,
    .tp_getset = PlannedCall_getset,
};

/* A graph plan's call (`soagen.runtime.graphs.CallGraphs.planned_call`): where each buffer lies
 * where the plan found it and the module is not training, the graph captured for the caller's
 * stream and these collections is replayed and moved to the end of the binding's LRU. Any other
 * call (a buffer moved, no graph for this stream yet, a training module) goes to `call`, the
 * Python function that does the same and captures, or runs eagerly, what it must. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *buffers;    /* a tuple: the collections' buffer tensors */
    PyObject *addresses;  /* a tuple: each buffer's address when the plan was made */
    PyObject *stream_of;  /* stream_of(device): the caller's stream, as keys hold it */
    PyObject *device;
    PyObject *placements; /* a tuple: the collections' part of the key */
    PyObject *graphs;     /* the binding's graphs by key: an OrderedDict, least recent first */
    PyObject *module;     /* the nn.Module whose training flag refuses graphs, or None */
    PyObject *call;       /* call(): the Python function, for every other call */
} GraphCall;

/* The graph to replay for this call (a new reference), or NULL: none, or an exception set. */
static PyObject *replayable_graph(GraphCall *self) {
    for (Py_ssize_t position = 0; position < PyTuple_GET_SIZE(self->buffers); position++) {
        PyObject *address = tensor_method(PyTuple_GET_ITEM(self->buffers, position), DATA_PTR);
        if (address == NULL) return NULL;
        int same = PyObject_RichCompareBool(address, PyTuple_GET_ITEM(self->addresses, position),
                                            Py_EQ);
        Py_DECREF(address);
        if (same != 1) return NULL;
    }
    PyObject *stream = PyObject_CallOneArg(self->stream_of, self->device);
    if (stream == NULL) return NULL;
    const Py_ssize_t count = PyTuple_GET_SIZE(self->placements);
    PyObject *key = PyTuple_New(count + 1);
    if (key == NULL) {
        Py_DECREF(stream);
        return NULL;
    }
    PyTuple_SET_ITEM(key, 0, stream);
    for (Py_ssize_t position = 0; position < count; position++) {
        PyObject *placement = PyTuple_GET_ITEM(self->placements, position);
        PyTuple_SET_ITEM(key, position + 1, Py_NewRef(placement));
    }
    PyObject *graph = Py_XNewRef(PyDict_GetItemWithError(self->graphs, key));
    if (graph != NULL && self->module != Py_None) {
        PyObject *training = PyObject_GetAttr(self->module, names[TRAINING]);
        int trains = training == NULL ? -1 : PyObject_IsTrue(training);
        Py_XDECREF(training);
        if (trains != 0) Py_CLEAR(graph);
    }
    if (graph != NULL) {
        PyObject *moved = PyObject_CallMethodOneArg(self->graphs, names[MOVE_TO_END], key);
        if (moved == NULL) {
            if (PyErr_ExceptionMatches(PyExc_KeyError)) {
                PyErr_Clear();  /* dropped meanwhile by another thread's capture: replayed still */
            } else {
                Py_CLEAR(graph);
            }
        }
        Py_XDECREF(moved);
    }
    Py_DECREF(key);
    return graph;
}

static PyObject *GraphCall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames) {
    GraphCall *self = (GraphCall *)callable;
    if (!called_with(nargsf, kwnames, 0, "GraphCall takes no argument")) return NULL;
    if (self->call == NULL || self->buffers == NULL || self->addresses == NULL ||
        self->stream_of == NULL || self->device == NULL || self->placements == NULL ||
        self->graphs == NULL || self->module == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GraphCall: it was cleared");
        return NULL;
    }
    PyObject *graph = replayable_graph(self);
    if (graph == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallNoArgs(self->call);
    }
    PyObject *replayed = PyObject_CallMethodNoArgs(graph, names[REPLAY]);
    Py_DECREF(graph);
    if (replayed == NULL) return NULL;
    Py_DECREF(replayed);
    Py_RETURN_NONE;
}

/* GraphCall(buffers, addresses, stream_of, device, placements, graphs, module, call): see the
 * struct. */
static PyObject *GraphCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *buffers, *addresses, *stream_of, *device, *placements, *graphs, *module, *call;
    static char *keywords[] = {"buffers", "addresses", "stream_of", "device", "placements",
                               "graphs", "module", "call", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OOO!O!OO", keywords, &PyTuple_Type,
                                     &buffers, &PyTuple_Type, &addresses, &stream_of, &device,
                                     &PyTuple_Type, &placements, &PyDict_Type, &graphs, &module,
                                     &call)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(buffers) != PyTuple_GET_SIZE(addresses) ||
        !PyCallable_Check(stream_of) || !PyCallable_Check(call)) {
        PyErr_SetString(PyExc_ValueError, "GraphCall: one address per buffer, and callables for "
                                          "stream_of and call");
        return NULL;
    }
    GraphCall *self = (GraphCall *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = GraphCall_vectorcall;
    self->buffers = Py_NewRef(buffers);
    self->addresses = Py_NewRef(addresses);
    self->stream_of = Py_NewRef(stream_of);
    self->device = Py_NewRef(device);
    self->placements = Py_NewRef(placements);
    self->graphs = Py_NewRef(graphs);
    self->module = Py_NewRef(module);
    self->call = Py_NewRef(call);
    return (PyObject *)self;
}

GC_FUNCTIONS(GraphCall,
             offsetof(GraphCall, buffers), offsetof(GraphCall, addresses),
             offsetof(GraphCall, stream_of), offsetof(GraphCall, device),
             offsetof(GraphCall, placements), offsetof(GraphCall, graphs),
             offsetof(GraphCall, module), offsetof(GraphCall, call))

static PyTypeObject GraphCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    CALLABLE_TYPE_SLOTS(GraphCall, 0),
    .tp_doc = "GraphCall(buffers, addresses, stream_of, device, placements, graphs, module, call): "
              "called without arguments, replays the graph of the caller's stream where the "
              "buffers lie where they did and the module does not train; call() takes any other.",
};

/* The integer dtypes whose values `index_extremes` reads, by torch.dtype: 0 int8, 1 uint8,
 * 2 int16, 3 uint16, 4 int32, 5 uint32, 6 int64, 7 uint64. Set by `set_index_dtypes`. */
static PyObject *index_dtypes = NULL;

static PyObject *set_index_dtypes(PyObject *module, PyObject *dtypes) {
    PyObject *copy = PyDict_Check(dtypes) ? PyDict_Copy(dtypes) : NULL;
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (copy != NULL && PyDict_Next(copy, &position, &key, &value)) {
        long code = PyLong_Check(value) ? PyLong_AsLong(value) : -1;
        if (code < 0 || code > 7) {
            PyErr_Clear();
            Py_CLEAR(copy);
        }
    }
    if (copy == NULL) {
        PyErr_SetString(PyExc_TypeError, "set_index_dtypes({torch.dtype: code from 0 to 7})");
        return NULL;
    }
    Py_XSETREF(index_dtypes, copy);
    Py_RETURN_NONE;
}

/* The lowest and highest value of a block of integers: uint64's in the unsigned fields, every
 * other dtype's in the signed ones. */
typedef struct {
    long long low, high;
    unsigned long long unsigned_low, unsigned_high;
} extremes;

/* The extremes of `rows` x `columns` values of `type` (`steps` bytes apart) into `found`'s
 * `low_field` and `high_field`. */
#define EXTREMES_AS(type, low_field, high_field)                                            \
    {                                                                                       \
        type low, high;                                                                     \
        memcpy(&low, address, sizeof low);                                                  \
        high = low;                                                                         \
        for (long long row = 0; row < rows; row++) {                                        \
            const char *from = address + row * steps[0];                                    \
            if (steps[1] == (long long)sizeof(type)) {                                      \
                for (long long column = 0; column < columns; column++) {                    \
                    type value;                                                             \
                    memcpy(&value, from + column * (long long)sizeof(type), sizeof value);  \
                    low = value < low ? value : low;                                        \
                    high = value > high ? value : high;                                     \
                }                                                                           \
            } else {                                                                        \
                for (long long column = 0; column < columns; column++) {                    \
                    type value;                                                             \
                    memcpy(&value, from + column * steps[1], sizeof value);                 \
                    low = value < low ? value : low;                                        \
                    high = value > high ? value : high;                                     \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        found->low_field = low;                                                             \
        found->high_field = high;                                                           \
        return;                                                                             \
    }

static const long long index_widths[8] = {1, 1, 2, 2, 4, 4, 8, 8};

/* The extremes of the values `read_indices` found (`code`, `sizes`, element `strides`, `address`):
 * no Python object is touched. */
static void find_extremes(long code, long long sizes[2], long long strides[2], const char *address,
                          extremes *found) {
    /* A stride of an axis of one value is never stepped (and may be any number). */
    for (int axis = 0; axis < 2; axis++) {
        if (sizes[axis] == 1) strides[axis] = 0;
    }
    /* The longer axis inside where the other has one value (one axis: sizes[0] is 1), else the
     * one of the shorter step: an [n, 2] block's columns are runs of n values. */
    const int inner = sizes[0] == 1 ? 1 : sizes[1] == 1 ? 0 : strides[0] < strides[1] ? 0 : 1;
    const long long rows = sizes[1 - inner], columns = sizes[inner];
    const long long steps[2] = {strides[1 - inner] * index_widths[code],
                                strides[inner] * index_widths[code]};
    switch (code) {
        case 0: EXTREMES_AS(int8_t, low, high)
        case 1: EXTREMES_AS(uint8_t, low, high)
        case 2: EXTREMES_AS(int16_t, low, high)
        case 3: EXTREMES_AS(uint16_t, low, high)
        case 4: EXTREMES_AS(int32_t, low, high)
        case 5: EXTREMES_AS(uint32_t, low, high)
        case 6: EXTREMES_AS(int64_t, low, high)
        default: EXTREMES_AS(uint64_t, unsigned_low, unsigned_high)
    }
}

/* What `index_extremes` reads of `tensor`: its dtype's code, its sizes and strides as [rows,
 * columns] (one axis: one row), its address. 1 where it may read the values, 0 where not, -1 with
 * an exception set. */
static int read_indices(PyObject *tensor, long *code, long long sizes[2], long long strides[2],
                        char **address) {
    int active = modes_active();
    if (active != 0 || Py_TYPE(tensor) != (PyTypeObject *)tensor_type) return active < 0 ? -1 : 0;
    PyObject *dtype = tensor_attribute(tensor, DTYPE);
    if (dtype == NULL) return -1;
    PyObject *code_object = PyDict_GetItemWithError(index_dtypes, dtype);
    Py_DECREF(dtype);
    if (code_object == NULL) return PyErr_Occurred() ? -1 : 0;
    *code = PyLong_AsLong(code_object);
    if (*code == -1 && PyErr_Occurred()) return -1;
    PyObject *is_cpu = tensor_attribute(tensor, IS_CPU);
    if (is_cpu == NULL) return -1;
    int readable = PyObject_IsTrue(is_cpu);
    Py_DECREF(is_cpu);
    if (readable == 1) readable = is_false(tensor, IS_NEG);
    if (readable != 1) return readable;
    PyObject *shape = tensor_attribute(tensor, SHAPE);
    if (shape == NULL) return -1;
    Py_ssize_t dims = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : 0;
    readable = dims == 1 || dims == 2 ? read_integers(shape, dims, sizes + 2 - dims) : 0;
    Py_DECREF(shape);
    if (readable != 1) return readable;
    if (sizes[0] < 1 || sizes[1] < 1) return 0;
    return read_memory(tensor, dims, index_widths[*code], strides + 2 - dims, address);
}

/* `read_indices` and `find_extremes` on `tensor` if it holds fewer than `most` values: 1 with
 * `found` and `code` set, 0 where it reads no values (a RuntimeError of a tensor that cannot say
 * is taken as that: no storage, a functorch wrapper, a sparse tensor), -1 with an exception set. */
static int extremes_of(PyObject *tensor, long long most, long *code, extremes *found) {
    long long sizes[2] = {1, 1}, strides[2] = {0, 0};
    char *address = NULL;
    int readable = index_dtypes != NULL && tensor_type != NULL
                       ? read_indices(tensor, code, sizes, strides, &address)
                       : 0;
    if (readable < 0) return unless_runtime_error(0);
    if (!readable || sizes[0] * sizes[1] >= most) return 0;
    find_extremes(*code, sizes, strides, address, found);
    return 1;
}

/* index_extremes(tensor): (lowest, highest) of a plain CPU tensor of one or two axes, at least
 * one element, of an integer dtype that `set_index_dtypes` named, without a neg bit; None for any
 * other (the caller reduces it otherwise), and where a torch function mode is active (its answers
 * to the reads here could be anything). */
static PyObject *index_extremes(PyObject *module, PyObject *tensor) {
    long code = 0;
    extremes found = {0, 0, 0, 0};
    int readable = extremes_of(tensor, LLONG_MAX, &code, &found);
    if (readable < 0) return NULL;
    if (!readable) Py_RETURN_NONE;
    if (code == 7) {
        return Py_BuildValue("(NN)", PyLong_FromUnsignedLongLong(found.unsigned_low),
                             PyLong_FromUnsignedLongLong(found.unsigned_high));
    }
    return Py_BuildValue("(NN)", PyLong_FromLongLong(found.low), PyLong_FromLongLong(found.high));
}

/* A call plan's call with index range checks before it (`ModelBinding._plan`): each index view
 * of fewer than `most` values is read here, and where all lie in [0, bound) the call is made.
 * A view read here that holds an index outside, and any view it does not read (larger ones,
 * which torch's reductions read faster, and those `index_extremes` takes no values of), goes to
 * `check(number)`, the plan's Python check of that view, which raises IndexRangeError naming the
 * values. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *checks;  /* a tuple of (index view, bound) */
    PyObject *call;    /* call(): the run, once every index is in range */
    PyObject *check;   /* check(number): the Python check of checks[number] */
    long long most;    /* views of this many values or more go to `check` */
} IndexCheckedCall;

/* Whether the extremes lie in [0, bound). */
static int in_range(long code, const extremes *found, long long bound) {
    if (code == 7) return found->unsigned_high < (unsigned long long)bound;
    return found->low >= 0 && found->high < bound;
}

static PyObject *IndexCheckedCall_vectorcall(PyObject *callable, PyObject *const *args,
                                             size_t nargsf, PyObject *kwnames) {
    IndexCheckedCall *self = (IndexCheckedCall *)callable;
    if (!called_with(nargsf, kwnames, 0, "IndexCheckedCall takes no argument")) return NULL;
    if (self->checks == NULL || self->call == NULL || self->check == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "IndexCheckedCall: it was cleared");
        return NULL;
    }
    for (Py_ssize_t number = 0; number < PyTuple_GET_SIZE(self->checks); number++) {
        PyObject *pair = PyTuple_GET_ITEM(self->checks, number);
        long long bound = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (bound == -1 && PyErr_Occurred()) return NULL;
        long code = 0;
        extremes found = {0, 0, 0, 0};
        int readable = extremes_of(PyTuple_GET_ITEM(pair, 0), self->most, &code, &found);
        if (readable < 0) return NULL;
        if (readable && in_range(code, &found, bound)) continue;
        PyObject *number_object = PyLong_FromSsize_t(number);
        if (number_object == NULL) return NULL;
        PyObject *checked = PyObject_CallOneArg(self->check, number_object);
        Py_DECREF(number_object);
        if (checked == NULL) return NULL;
        Py_DECREF(checked);
        if (readable) {
            /* The Python check read the same values and let them pass: never run on them. */
            PyErr_SetString(PyExc_RuntimeError, "IndexCheckedCall: an index outside its range "
                                                "passed the Python check");
            return NULL;
        }
    }
    return PyObject_CallNoArgs(self->call);
}

/* IndexCheckedCall(checks, call, check, most): see the struct. */
static PyObject *IndexCheckedCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *checks, *call, *check;
    long long most;
    static char *keywords[] = {"checks", "call", "check", "most", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOL", keywords, &PyTuple_Type, &checks,
                                     &call, &check, &most)) {
        return NULL;
    }
    int valid = PyCallable_Check(call) && PyCallable_Check(check);
    for (Py_ssize_t number = 0; valid && number < PyTuple_GET_SIZE(checks); number++) {
        PyObject *pair = PyTuple_GET_ITEM(checks, number);
        valid = PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
                PyLong_CheckExact(PyTuple_GET_ITEM(pair, 1));
        if (valid) {
            /* A bound a C integer holds; as long long, the compare with uint64 values is exact. */
            long long bound = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
            if (bound == -1 && PyErr_Occurred()) PyErr_Clear();
            valid = bound >= 0;
        }
    }
    if (!valid) {
        PyErr_SetString(PyExc_ValueError, "IndexCheckedCall: a tuple of (view, bound) pairs "
                                          "with int bounds from 0 to 2**63 - 1, and callables "
                                          "for call and check");
        return NULL;
    }
    IndexCheckedCall *self = (IndexCheckedCall *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = IndexCheckedCall_vectorcall;
    self->checks = Py_NewRef(checks);
    self->call = Py_NewRef(call);
    self->check = Py_NewRef(check);
    self->most = most;
    return (PyObject *)self;
}

GC_FUNCTIONS(IndexCheckedCall,
             offsetof(IndexCheckedCall, checks), offsetof(IndexCheckedCall, call),
             offsetof(IndexCheckedCall, check))

static PyTypeObject IndexCheckedCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    CALLABLE_TYPE_SLOTS(IndexCheckedCall, 0),
    .tp_doc = "IndexCheckedCall(checks, call, check, most): called without arguments, checks "
              "that each (index view, bound) of checks holds values in [0, bound) and makes "
              "call(); check(number) checks what it does not read or finds outside.",
};

static PyMethodDef methods[] = {
    {"set_torch", (PyCFunction)(void (*)(void))set_torch, METH_FASTCALL,
     "set_torch(torch.Tensor, torch._C._increment_version, takes_tuple)"},
    {"set_function_mode_check", (PyCFunction)set_function_mode_check, METH_O,
     "set_function_mode_check(torch._C._is_torch_function_mode_enabled)"},
    {"set_index_dtypes", (PyCFunction)set_index_dtypes, METH_O,
     "set_index_dtypes({torch.dtype: code}): the integer dtypes index_extremes reads"},
    {"index_extremes", (PyCFunction)index_extremes, METH_O,
     "index_extremes(tensor): (lowest, highest) value of a plain CPU integer tensor of one or two "
     "axes, or None where it does not read it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "soagen.runtime._compiled",
    "The compiled parts of a planned call: BlockWriter (see soagen.runtime.buffers.block_writer), "
    "ModelRun (see soagen.runtime.model.ModelBinding._model_call) and PlannedCall (see "
    "soagen.runtime.model.ModelBinding._call_in_schema_order).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__compiled(void) {
    for (int name = 0; name < NAME_COUNT; name++) {
        names[name] = PyUnicode_InternFromString(name_texts[name]);
        if (names[name] == NULL) return NULL;
    }
    no_arguments = PyTuple_New(0);
    if (no_arguments == NULL) return NULL;
    if (PyType_Ready(&BlockWriterType) < 0 || PyType_Ready(&ModelRunType) < 0 ||
        PyType_Ready(&PlannedCallType) < 0 || PyType_Ready(&IndexCheckedCallType) < 0 ||
        PyType_Ready(&GraphCallType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "BlockWriter", (PyObject *)&BlockWriterType) < 0 ||
        PyModule_AddObjectRef(module, "ModelRun", (PyObject *)&ModelRunType) < 0 ||
        PyModule_AddObjectRef(module, "PlannedCall", (PyObject *)&PlannedCallType) < 0 ||
        PyModule_AddObjectRef(module, "IndexCheckedCall", (PyObject *)&IndexCheckedCallType) < 0 ||
        PyModule_AddObjectRef(module, "GraphCall", (PyObject *)&GraphCallType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
