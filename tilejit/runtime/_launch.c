/* tilejit's native launch path: kernel[grid](*args, **kwargs) to cuLaunchKernel without a Python frame.
 *
 * Built from this file by tilejit/runtime/native.py on first use (a C compiler and Python's headers are all
 * it needs: no CUDA headers, no torch headers, no libcuda at build time). The pure-Python path in
 * runtime/jit.py stays the reference and the fallback; this file mirrors it:
 *
 *   1. the call signature: everything the specialization key depends on, read from the arguments
 *      (per tensor: dtype, strides, 16-byte alignment, extents of "shaped" tensors; per int: ==1, %16;
 *      constexpr and keyword values; the device), written as 64-bit words;
 *   2. a hash-table hit on those words gives the Entry of a compiled kernel on one device;
 *   3. the kernel parameters (pointer, sizes and strides per tensor, then scalars, then CUtensorMaps) are
 *      packed into a stack buffer and launched with one cuLaunchKernel on torch's current stream, with the
 *      GIL released around the driver call.
 *
 * An autotuned kernel's launch (tuner[grid]) goes through a Tuned: its tuning key is the kernel's signature of the
 * call plus the key arguments by value and the text of the environment variables the choice depends on; a hit
 * launches the chosen config's Entry as above, a miss goes to the autotuner in Python (which tunes if it must).
 *
 * Anything unusual (an argument the signature cannot encode, a miss, a failed launch) goes to Python: the
 * `fallback` callable for calls the signature cannot describe, the `slow` callable for misses (it compiles,
 * launches and returns the Entry to remember), and the entry's Python launcher when the driver call fails
 * (it retries with the kernel's context and raises tilejit's LaunchError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned smem, void *stream, void **params, void **extra);

static launch_fn cu_launch = NULL;

/* cuda.h's CUlaunchAttribute (an id, padding, a 64-byte value union) and CUlaunchConfig, for cuLaunchKernelEx: a
 * kernel compiled for TMA multicast clusters along x runs in clusters when its grid's x extent allows. */
typedef struct {
    unsigned id;
    char pad[4];
    unsigned value[16];
} launch_attr_t;
typedef struct {
    unsigned grid[3], block[3], smem;
    void *stream;
    launch_attr_t *attrs;
    unsigned nattrs;
} launch_config_t;
typedef int (*launch_ex_fn)(const launch_config_t *config, void *f, void **params, void **extra);
static launch_ex_fn cu_launch_ex = NULL;
#define LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
static PyObject *launch_hook = NULL; /* tests: a Python callable used instead of the driver (no GPU needed) */

enum { KIND_PTR = 0, KIND_I64 = 1, KIND_I32 = 2, KIND_F32 = 3, KIND_TMAP = 4 };
#define MAX_WORDS 1024  /* signature words; a longer signature takes the fallback */
#define MAX_VALUES 256  /* kernel parameters from arguments */
#define MAX_PARAM_BYTES 4096  /* what cuLaunchKernel accepts (4 KiB of parameters) */
#define MAX_ENTRIES 4096  /* per kernel; past this, new signatures take the slow path every time */

/* Word tags, so that values of different kinds never produce the same signature. */
enum { TAG_NONE = 1, TAG_BOOL, TAG_INT, TAG_FLOAT, TAG_STR, TAG_OBJECT, TAG_TENSOR, TAG_KW, TAG_DEVICE, TAG_EXACT,
       TAG_ENV };

typedef struct {
    int64_t i;
    double f;
    int is_float;
} value_t;

/* ---------------------------------------------------------------------------------------------------------- */
/* Entry: one compiled kernel on one device, as the launch needs it.                                         */

typedef struct {
    PyObject_HEAD
    void *function;
    unsigned block[3];
    unsigned smem;
    unsigned zscale; /* programs launched per program of the grid along z (split-K clusters), >= 1 */
    unsigned xcluster; /* programs per cluster along x (TMA multicast), >= 1; a grid x not a multiple: none */
    int python_only; /* every launch goes to `fallback` with the packed values (a stream-K kernel: runtime/launch.py
                        adds its grid and the stream's workspace) */
    int device;
    Py_ssize_t nvalues;   /* parameters that come from arguments, in order */
    Py_ssize_t ntmaps;    /* CUtensorMap parameters after them */
    unsigned char *kinds; /* nvalues + ntmaps */
    int *offsets;
    int nbytes;
    PyObject *tmaps;    /* callable(values tuple) -> sequence of 128-byte CUtensorMaps, or NULL */
    PyObject *fallback; /* Python launcher(grid, stream, values): retries with the kernel's context, raises */
} Entry;

static void entry_dealloc(Entry *self) {
    PyMem_Free(self->kinds);
    PyMem_Free(self->offsets);
    Py_XDECREF(self->tmaps);
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Entry(function, block, smem, kinds, device, tmaps, fallback[, zscale[, xcluster[, python_only]]]); kinds is
 * bytes of KIND_* codes. */
static int entry_init(Entry *self, PyObject *args, PyObject *kw) {
    unsigned long long function;
    unsigned bx, by, bz, smem;
    int device;
    const char *kinds;
    Py_ssize_t nkinds;
    PyObject *tmaps, *fallback;
    unsigned zscale = 1, xcluster = 1;
    int python_only = 0;
    if (!PyArg_ParseTuple(args, "K(III)Iy#iOO|IIp", &function, &bx, &by, &bz, &smem, &kinds, &nkinds, &device, &tmaps,
                          &fallback, &zscale, &xcluster, &python_only))
        return -1;
    if (zscale < 1 || zscale > 16) {
        PyErr_SetString(PyExc_ValueError, "zscale must be 1 to 16");
        return -1;
    }
    if (xcluster < 1 || xcluster > 8) {
        PyErr_SetString(PyExc_ValueError, "xcluster must be 1 to 8");
        return -1;
    }
    if (self->fallback) {
        PyErr_SetString(PyExc_TypeError, "an Entry is initialised once");
        return -1;
    }
    if (nkinds > MAX_VALUES + 64) { /* more than any kernel the launcher takes: checked before sizes are added */
        PyErr_SetString(PyExc_ValueError, "too many kernel parameters for the native launcher");
        return -1;
    }
    self->function = (void *)(uintptr_t)function;
    self->block[0] = bx, self->block[1] = by, self->block[2] = bz;
    self->smem = smem;
    self->zscale = zscale;
    self->xcluster = xcluster;
    self->python_only = python_only;
    self->device = device;
    PyMem_Free(self->kinds);
    PyMem_Free(self->offsets);
    self->kinds = PyMem_Malloc(nkinds + 1);
    self->offsets = PyMem_Malloc(sizeof(int) * (nkinds + 1));
    if (!self->kinds || !self->offsets) {
        PyErr_NoMemory();
        return -1;
    }
    int offset = 0;
    self->nvalues = self->ntmaps = 0;
    for (Py_ssize_t i = 0; i < nkinds; i++) {
        int kind = kinds[i], size, align;
        switch (kind) {
        case KIND_PTR: case KIND_I64: size = align = 8; break;
        case KIND_I32: case KIND_F32: size = align = 4; break;
        case KIND_TMAP: size = 128, align = 64; break;
        default: PyErr_Format(PyExc_ValueError, "unknown parameter kind %d", kind); return -1;
        }
        if (kind == KIND_TMAP)
            self->ntmaps++;
        else if (self->ntmaps) {
            PyErr_SetString(PyExc_ValueError, "tensor-map parameters must come last");
            return -1;
        } else
            self->nvalues++;
        offset = (offset + align - 1) / align * align;
        if (offset > MAX_PARAM_BYTES - size || self->nvalues > MAX_VALUES) { /* before it can overflow */
            PyErr_SetString(PyExc_ValueError, "too many kernel parameters for the native launcher");
            return -1;
        }
        self->kinds[i] = (unsigned char)kind;
        self->offsets[i] = offset;
        offset += size;
    }
    if (offset > MAX_PARAM_BYTES || self->nvalues > MAX_VALUES) {
        PyErr_SetString(PyExc_ValueError, "too many kernel parameters for the native launcher");
        return -1;
    }
    if (self->ntmaps && tmaps == Py_None) {
        PyErr_SetString(PyExc_ValueError, "a kernel with tensor-map parameters needs a tmaps callable");
        return -1;
    }
    self->nbytes = offset;
    self->tmaps = tmaps == Py_None ? NULL : Py_NewRef(tmaps);
    self->fallback = Py_NewRef(fallback);
    return 0;
}

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tilejit._launch.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled kernel on one device, as the native launch path needs it.",
    .tp_init = (initproc)entry_init,
    .tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------------------------------------------------------- */
/* Dispatcher: one per tilejit Kernel; the signature -> Entry table and the launch.                         */

typedef struct {
    uint64_t hash;
    Py_ssize_t nwords;
    uint64_t *words;
    PyObject *entry;
    PyObject *pinned; /* objects whose addresses are in the words (constexprs compared by identity) */
} slot_t;

/* An open-addressing table from signatures to objects (a Dispatcher's Entries, a Tuned's choices). */
typedef struct {
    slot_t *slots;
    Py_ssize_t capacity, used;
} table_t;

typedef struct {
    PyObject_HEAD
    PyObject *roles;          /* the Kernel's list of parameter roles (read on every call; it changes) */
    PyObject *role_constexpr; /* role objects, compared by identity */
    PyObject *role_shaped;
    PyObject *fast_kwargs; /* set of keyword names the signature may hold */
    PyObject *tensor_type;
    PyObject *stream_getter; /* device index -> raw CUstream int */
    PyObject *slow;          /* (grid, args, kwargs) -> Entry to remember, or None */
    PyObject *fallback;      /* (grid, args, kwargs) -> None: calls the signature cannot encode */
    PyObject *grid_fn;       /* (grid, args, kwargs) -> 3-tuple or None, for grids that are not tuples */
    PyObject *names;         /* tuple: every parameter's name, in order */
    PyObject *runtime_index; /* dict: name -> position, of the parameters passed at run time */
    PyObject *defaults;      /* dict: name -> default, of run-time parameters that have one */
    table_t table;           /* signature -> Entry */
    Py_ssize_t hits, misses, fallbacks;
} Dispatcher;

static PyObject *str_dtype, *str_shape, *str_stride, *str_data_ptr, *str_get_device, *str_requires_grad;

static void clear_slots(table_t *t) {
    for (Py_ssize_t i = 0; i < t->capacity; i++) {
        PyMem_Free(t->slots[i].words);
        Py_XDECREF(t->slots[i].entry);
        Py_XDECREF(t->slots[i].pinned);
    }
    PyMem_Free(t->slots);
    t->slots = NULL;
    t->capacity = t->used = 0;
}

static void dispatcher_dealloc(Dispatcher *d) {
    clear_slots(&d->table);
    Py_XDECREF(d->roles);
    Py_XDECREF(d->role_constexpr);
    Py_XDECREF(d->role_shaped);
    Py_XDECREF(d->fast_kwargs);
    Py_XDECREF(d->tensor_type);
    Py_XDECREF(d->stream_getter);
    Py_XDECREF(d->slow);
    Py_XDECREF(d->fallback);
    Py_XDECREF(d->grid_fn);
    Py_XDECREF(d->names);
    Py_XDECREF(d->runtime_index);
    Py_XDECREF(d->defaults);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static int dispatcher_init(Dispatcher *d, PyObject *args, PyObject *kw) {
    static char *names[] = {"roles", "role_constexpr", "role_shaped", "fast_kwargs", "tensor_type", "stream_getter",
                            "slow", "fallback", "grid_fn", "names", "runtime_index", "defaults", NULL};
    PyObject *roles, *rc, *rs, *fk, *tt, *sg, *slow, *fb, *gf, *pn, *ri, *df;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOO!OOOOOO!O!O!", names, &PyList_Type, &roles, &rc, &rs,
                                     &PySet_Type, &fk, &tt, &sg, &slow, &fb, &gf, &PyTuple_Type, &pn, &PyDict_Type,
                                     &ri, &PyDict_Type, &df))
        return -1;
    if (d->roles) {
        /* Python code called from a launch (a tensor's attributes, the slow path) holds borrowed fields of this
         * dispatcher: replacing them under it would free what it reads. Make a new Dispatcher instead. */
        PyErr_SetString(PyExc_TypeError, "a Dispatcher is initialised once");
        return -1;
    }
    if (PyTuple_GET_SIZE(pn) != PyList_GET_SIZE(roles)) {
        PyErr_SetString(PyExc_ValueError, "one name per role");
        return -1;
    }
    if (!PyType_Check(tt)) {
        PyErr_SetString(PyExc_TypeError, "tensor_type must be a type");
        return -1;
    }
    Py_XSETREF(d->roles, Py_NewRef(roles));
    Py_XSETREF(d->role_constexpr, Py_NewRef(rc));
    Py_XSETREF(d->role_shaped, Py_NewRef(rs));
    Py_XSETREF(d->fast_kwargs, Py_NewRef(fk));
    Py_XSETREF(d->tensor_type, Py_NewRef(tt));
    Py_XSETREF(d->stream_getter, Py_NewRef(sg));
    Py_XSETREF(d->slow, Py_NewRef(slow));
    Py_XSETREF(d->fallback, Py_NewRef(fb));
    Py_XSETREF(d->grid_fn, Py_NewRef(gf));
    Py_XSETREF(d->names, Py_NewRef(pn));
    Py_XSETREF(d->runtime_index, Py_NewRef(ri));
    Py_XSETREF(d->defaults, Py_NewRef(df));
    clear_slots(&d->table);
    return 0;
}

/* -- the signature ------------------------------------------------------------------------------------------ */

typedef struct {
    uint64_t words[MAX_WORDS];
    Py_ssize_t n;
    value_t values[MAX_VALUES];
    Py_ssize_t nvalues;
    PyObject *pinned[64]; /* borrowed: objects encoded by identity */
    int npinned;
    long device;
} signature_t;

static inline int put(signature_t *s, uint64_t w) {
    if (s->n >= MAX_WORDS)
        return 0;
    s->words[s->n++] = w;
    return 1;
}

static inline int put_value(signature_t *s, int64_t i, double f, int is_float) {
    if (s->nvalues >= MAX_VALUES)
        return 0;
    value_t *v = &s->values[s->nvalues++];
    v->i = i, v->f = f, v->is_float = is_float;
    return 1;
}

static int put_str(signature_t *s, PyObject *str) {
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(str, &len);
    if (!text) {
        PyErr_Clear();
        return 0;
    }
    if (!put(s, TAG_STR) || !put(s, (uint64_t)len))
        return 0;
    for (Py_ssize_t i = 0; i < len; i += 8) {
        uint64_t w = 0;
        memcpy(&w, text + i, len - i < 8 ? (size_t)(len - i) : 8);
        if (!put(s, w))
            return 0;
    }
    return 1;
}

/* A compile-time value: by value for None, bools, ints, floats and strings; any other object by identity (the
 * table keeps it alive, so its address cannot be reused by a different object). */
static int put_constant(signature_t *s, PyObject *v) {
    if (v == Py_None)
        return put(s, TAG_NONE);
    if (PyBool_Check(v))
        return put(s, TAG_BOOL) && put(s, v == Py_True);
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        return put(s, TAG_INT) && put(s, (uint64_t)x);
    }
    if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &x, 8);
        return put(s, TAG_FLOAT) && put(s, bits);
    }
    if (PyUnicode_CheckExact(v))
        return put_str(s, v);
    if (s->npinned >= 64)
        return 0;
    s->pinned[s->npinned++] = v;
    return put(s, TAG_OBJECT) && put(s, (uint64_t)(uintptr_t)v);
}

/* A tensor argument: dtype, strides, 16-byte alignment, requires_grad, [extents], [TAG_EXACT, extents]; values
 * pointer, sizes, strides. requires_grad is signed because the slow path refuses an output that requires grad (or
 * remembers no call writing one): a hit must not let such a tensor through in place of one that did not. `exact`
 * (an autotune key argument) signs its extents once more, whatever its role. */
static int put_tensor(signature_t *s, PyObject *t, int shaped, int exact) {
    PyObject *dtype = NULL, *dev = NULL, *ptr = NULL, *strides = NULL, *shape = NULL, *grad = NULL;
    int ok = 0;
    if (!(dtype = PyObject_GetAttr(t, str_dtype)) || !(dev = PyObject_CallMethodNoArgs(t, str_get_device)) ||
        !(ptr = PyObject_CallMethodNoArgs(t, str_data_ptr)) || !(strides = PyObject_CallMethodNoArgs(t, str_stride)) ||
        !(shape = PyObject_GetAttr(t, str_shape)) || !(grad = PyObject_GetAttr(t, str_requires_grad)))
        goto done;
    if (!PyTuple_Check(strides) || !PyTuple_Check(shape) || PyTuple_GET_SIZE(strides) != PyTuple_GET_SIZE(shape))
        goto done;
    long device = PyLong_AsLong(dev);
    if (device < 0 || (s->device >= 0 && device != s->device)) /* CPU, meta or mixed devices: Python decides */
        goto done;
    s->device = device;
    unsigned long long address = PyLong_AsUnsignedLongLong(ptr);
    if (PyErr_Occurred())
        goto done;
    Py_ssize_t rank = PyTuple_GET_SIZE(shape);
    /* dtype objects are torch's immortal singletons: their address names them. */
    if (!put(s, TAG_TENSOR) || !put(s, (uint64_t)(uintptr_t)dtype) || !put(s, (uint64_t)rank) ||
        !put(s, (address & 15) == 0) || !put(s, grad == Py_True) || !put_value(s, (int64_t)address, 0, 0))
        goto done;
    int64_t dims[2][64];
    if (rank > 64)
        goto done;
    for (int which = 0; which < 2; which++) {
        PyObject *tuple = which == 0 ? shape : strides;
        for (Py_ssize_t i = 0; i < rank; i++) {
            long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
            if (x == -1 && PyErr_Occurred())
                goto done;
            dims[which][i] = x;
            if (!put_value(s, x, 0, 0))
                goto done;
        }
    }
    for (Py_ssize_t i = 0; i < rank; i++)
        if (!put(s, (uint64_t)dims[1][i]))
            goto done;
    int empty = 0; /* an empty tensor is another specialization (the key records it: no tensor map for it) */
    for (Py_ssize_t i = 0; i < rank; i++)
        empty |= dims[0][i] == 0;
    if (!put(s, (uint64_t)empty))
        goto done;
    if (shaped)
        for (Py_ssize_t i = 0; i < rank; i++)
            if (!put(s, (uint64_t)dims[0][i]))
                goto done;
    if (exact) {
        if (!put(s, TAG_EXACT))
            goto done;
        for (Py_ssize_t i = 0; i < rank; i++)
            if (!put(s, (uint64_t)dims[0][i]))
                goto done;
    }
    ok = 1;
done:
    Py_XDECREF(dtype);
    Py_XDECREF(dev);
    Py_XDECREF(ptr);
    Py_XDECREF(strides);
    Py_XDECREF(shape);
    Py_XDECREF(grad);
    if (!ok)
        PyErr_Clear();
    return ok;
}

/* 1: the signature is in s; 0: the call needs the Python fallback (nothing raised). `exact` (NULL, or one flag per
 * parameter, `nexact` of them) marks the parameters signed by their exact value, not only what the specialization
 * depends on: an autotuner's key arguments (Tuned). */
static int build_signature(Dispatcher *d, PyObject *args, PyObject *kwargs, signature_t *s,
                           const unsigned char *exact, Py_ssize_t nexact) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args), nroles = PyList_GET_SIZE(d->roles);
    s->n = s->nvalues = 0;
    s->npinned = 0;
    s->device = -1;
    if (nargs > nroles)
        return 0;
    put(s, (uint64_t)nargs);
    for (Py_ssize_t i = 0; i < nroles; i++) {
        if (i >= PyList_GET_SIZE(d->roles)) /* the list shrank under a tensor attribute's Python code */
            return 0;
        PyObject *a, *role = PyList_GET_ITEM(d->roles, i);
        if (i < nargs)
            a = PyTuple_GET_ITEM(args, i);
        else if (role == d->role_constexpr)
            continue; /* a keyword (signed with the keywords below) or its default (fixed per kernel) */
        else {        /* a run-time parameter passed by keyword, or left at its default */
            PyObject *name = PyTuple_GET_ITEM(d->names, i);
            a = kwargs ? PyDict_GetItemWithError(kwargs, name) : NULL;
            if (!a && !PyErr_Occurred())
                a = PyDict_GetItemWithError(d->defaults, name);
            if (!a) { /* missing: Python raises the TypeError */
                PyErr_Clear();
                return 0;
            }
        }
        int by_value = exact && i < nexact && exact[i];
        if (role == d->role_constexpr) {
            if (!put_constant(s, a))
                return 0;
        } else if (PyObject_TypeCheck(a, (PyTypeObject *)d->tensor_type)) {
            if (!put_tensor(s, a, role == d->role_shaped, by_value))
                return 0;
        } else if (PyBool_Check(a)) {
            if (!put(s, TAG_BOOL) || !put_value(s, a == Py_True, 0, 0))
                return 0;
            if (by_value && (!put(s, TAG_EXACT) || !put(s, a == Py_True)))
                return 0;
        } else if (PyLong_CheckExact(a)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(a, &overflow);
            if (overflow || (x == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            /* the key's view of an int: == 1, a multiple of 16, or neither */
            if (!put(s, TAG_INT) || !put(s, x == 1 ? 1 : ((x & 15) == 0 ? 16 : 0)) || !put_value(s, x, 0, 0))
                return 0;
            if (by_value && (!put(s, TAG_EXACT) || !put(s, (uint64_t)x)))
                return 0;
        } else if (PyFloat_CheckExact(a)) {
            double x = PyFloat_AS_DOUBLE(a);
            if (!put(s, TAG_FLOAT) || !put_value(s, 0, x, 1))
                return 0;
            if (by_value) {
                uint64_t bits;
                memcpy(&bits, &x, 8);
                if (!put(s, TAG_EXACT) || !put(s, bits))
                    return 0;
            }
        } else
            return 0;
    }
    if (s->device < 0) /* no tensor on a GPU: the interpreter or an error, both in Python */
        return 0;
    put(s, TAG_DEVICE);
    put(s, (uint64_t)s->device);
    if (kwargs && PyDict_GET_SIZE(kwargs)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            PyObject *at = PyDict_GetItemWithError(d->runtime_index, k);
            if (at) { /* a run-time parameter: signed in its place above, unless also given by position */
                if (PyLong_AsSsize_t(at) < nargs)
                    return 0;
                continue;
            }
            int known = PyUnicode_CheckExact(k) ? PySet_Contains(d->fast_kwargs, k) : 0;
            if (known != 1) {
                PyErr_Clear();
                return 0;
            }
            if (!put(s, TAG_KW) || !put_str(s, k) || !put_constant(s, v))
                return 0;
        }
    }
    return s->n < MAX_WORDS;
}

static uint64_t hash_words(const uint64_t *w, Py_ssize_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= w[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
}

static PyObject *lookup(table_t *d, signature_t *s, uint64_t h) {
    if (!d->capacity)
        return NULL;
    Py_ssize_t mask = d->capacity - 1;
    for (Py_ssize_t i = (Py_ssize_t)(h & mask);; i = (i + 1) & mask) {
        slot_t *slot = &d->slots[i];
        if (!slot->entry)
            return NULL;
        if (slot->hash == h && slot->nwords == s->n && memcmp(slot->words, s->words, s->n * 8) == 0)
            return slot->entry;
    }
}

static void place(slot_t *slots, Py_ssize_t capacity, slot_t slot) {
    Py_ssize_t mask = capacity - 1;
    Py_ssize_t i = (Py_ssize_t)(slot.hash & mask);
    while (slots[i].entry)
        i = (i + 1) & mask;
    slots[i] = slot;
}

static int insert(table_t *d, signature_t *s, uint64_t h, PyObject *entry) {
    if (d->used >= MAX_ENTRIES || lookup(d, s, h))
        return 0;
    if ((d->used + 1) * 2 > d->capacity) {
        Py_ssize_t capacity = d->capacity ? d->capacity * 2 : 16;
        slot_t *slots = PyMem_Calloc(capacity, sizeof(slot_t));
        if (!slots)
            return -1;
        for (Py_ssize_t i = 0; i < d->capacity; i++)
            if (d->slots[i].entry)
                place(slots, capacity, d->slots[i]);
        PyMem_Free(d->slots);
        d->slots = slots;
        d->capacity = capacity;
    }
    slot_t slot = {h, s->n, PyMem_Malloc(s->n * 8), entry, NULL};
    if (!slot.words)
        return -1;
    memcpy(slot.words, s->words, s->n * 8);
    if (s->npinned) {
        slot.pinned = PyTuple_New(s->npinned);
        if (!slot.pinned) {
            PyMem_Free(slot.words);
            return -1;
        }
        for (int i = 0; i < s->npinned; i++)
            PyTuple_SET_ITEM(slot.pinned, i, Py_NewRef(s->pinned[i]));
    }
    Py_INCREF(entry);
    place(d->slots, d->capacity, slot);
    d->used++;
    return 1;
}

/* -- the launch --------------------------------------------------------------------------------------------- */

static int load_driver(void) {
    if (cu_launch)
        return 1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        PyErr_Format(PyExc_ImportError, "cannot load libcuda.so.1: %s", dlerror());
        return 0;
    }
    cu_launch_ex = (launch_ex_fn)dlsym(lib, "cuLaunchKernelEx"); /* CUDA 12+; NULL: clusters take the Python path */
    cu_launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    if (!cu_launch) {
        PyErr_SetString(PyExc_ImportError, "libcuda.so.1 has no cuLaunchKernel");
        return 0;
    }
    return 1;
}

static PyObject *values_list(signature_t *s, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (!list)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        value_t *v = &s->values[i];
        PyObject *x = v->is_float ? PyFloat_FromDouble(v->f) : PyLong_FromLongLong(v->i);
        if (!x) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, x);
    }
    return list;
}

/* Launch through the entry's Python launcher: tilejit's errors and its context-switching retry. */
static PyObject *python_launch(Entry *e, const unsigned grid[3], unsigned long long stream, signature_t *s) {
    PyObject *values = values_list(s, s->nvalues);
    if (!values)
        return NULL;
    PyObject *result = PyObject_CallFunction(e->fallback, "(III)KN", grid[0], grid[1], grid[2], stream, values);
    return result;
}

/* The entry's parameters from the signature's values into `buffer` (padding zeroed, so the bytes are the same on
 * every launch) and their addresses into `params`; 0 when an int does not fit its 32-bit parameter. */
static int pack_values(Entry *e, signature_t *s, unsigned char *buffer, void **params) {
    memset(buffer, 0, e->nbytes);
    for (Py_ssize_t i = 0; i < e->nvalues; i++) {
        value_t *v = &s->values[i];
        unsigned char *at = buffer + e->offsets[i];
        params[i] = at;
        switch (e->kinds[i]) {
        case KIND_PTR:
        case KIND_I64: {
            /* The float -> int64 conversion is undefined outside [-2^63, 2^63) and for NaN: Python explains. */
            if (v->is_float && !(v->f >= -0x1p63 && v->f < 0x1p63))
                return 0;
            int64_t x = v->is_float ? (int64_t)v->f : v->i;
            memcpy(at, &x, 8);
            break;
        }
        case KIND_I32: {
            if (v->is_float || v->i < INT32_MIN || v->i > INT32_MAX)
                return 0;
            int32_t x = (int32_t)v->i;
            memcpy(at, &x, 4);
            break;
        }
        case KIND_F32: {
            if (v->is_float && isfinite(v->f) && fabs(v->f) > FLT_MAX) /* out of float's range: Python explains */
                return 0;
            float x = v->is_float ? (float)v->f : (float)v->i;
            memcpy(at, &x, 4);
            break;
        }
        }
    }
    return 1;
}

static PyObject *launch(Entry *e, const unsigned grid[3], signature_t *s, PyObject *device_index,
                        PyObject *stream_getter) {
    _Alignas(64) unsigned char buffer[MAX_PARAM_BYTES];
    void *params[MAX_VALUES + 64];
    if (s->nvalues != e->nvalues) {
        PyErr_Format(PyExc_RuntimeError, "tilejit native launch: %zd values for %zd kernel parameters", s->nvalues,
                     e->nvalues);
        return NULL;
    }
    PyObject *stream_obj = PyObject_CallOneArg(stream_getter, device_index);
    if (!stream_obj)
        return NULL;
    unsigned long long stream = PyLong_AsUnsignedLongLong(stream_obj);
    Py_DECREF(stream_obj);
    if (stream == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (e->python_only)
        return python_launch(e, grid, stream, s);
    if (!pack_values(e, s, buffer, params)) /* an int too wide for its 32-bit parameter: Python explains */
        return python_launch(e, grid, stream, s);
    const unsigned long long gz64 = (unsigned long long)grid[2] * e->zscale;
    if (e->zscale != 1 && gz64 > 65535) /* a split-K grid past CUDA's limit along z: Python explains */
        return python_launch(e, grid, stream, s);
    const unsigned gz = (unsigned)gz64;
    if (e->ntmaps) {
        PyObject *values = values_list(s, s->nvalues);
        if (!values)
            return NULL;
        PyObject *maps = PyObject_CallOneArg(e->tmaps, values);
        Py_DECREF(values);
        if (!maps)
            return NULL;
        PyObject *seq = PySequence_Fast(maps, "tmaps must return a sequence");
        Py_DECREF(maps);
        if (!seq)
            return NULL;
        if (PySequence_Fast_GET_SIZE(seq) != e->ntmaps) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_RuntimeError, "tilejit native launch: wrong number of tensor maps");
            return NULL;
        }
        for (Py_ssize_t j = 0; j < e->ntmaps; j++) {
            PyObject *m = PySequence_Fast_GET_ITEM(seq, j);
            if (!PyBytes_Check(m) || PyBytes_GET_SIZE(m) != 128) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_TypeError, "tilejit native launch: a tensor map must be 128 bytes");
                return NULL;
            }
            unsigned char *at = buffer + e->offsets[e->nvalues + j];
            memcpy(at, PyBytes_AS_STRING(m), 128);
            params[e->nvalues + j] = at;
        }
        Py_DECREF(seq);
    }
    if (launch_hook) {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)buffer, e->nbytes);
        if (!raw)
            return NULL;
        PyObject *offsets = PyList_New(e->nvalues + e->ntmaps);
        if (!offsets) {
            Py_DECREF(raw);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < e->nvalues + e->ntmaps; i++)
            PyList_SET_ITEM(offsets, i, PyLong_FromLong((long)((unsigned char *)params[i] - buffer)));
        return PyObject_CallFunction(launch_hook, "K(III)(III)IKNN", (unsigned long long)(uintptr_t)e->function,
                                     grid[0], grid[1], gz, e->block[0], e->block[1], e->block[2], e->smem,
                                     stream, raw, offsets);
    }
    if (!load_driver())
        return NULL;
    int err;
    int clustered = e->xcluster > 1 && grid[0] % e->xcluster == 0;
    if (clustered && !cu_launch_ex)
        return python_launch(e, grid, stream, s);
    /* Released: a full launch queue blocks here, and other Python threads should run meanwhile. Measured on an
     * H200 host, releasing and keeping the GIL, or passing one packed buffer through `extra` instead of
     * `params`, all cost the same within noise (the driver call itself is ~4 us there). */
    Py_BEGIN_ALLOW_THREADS
    if (clustered) {
        launch_attr_t attr = {LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, {0}, {e->xcluster, 1, 1}};
        launch_config_t config = {{grid[0], grid[1], gz}, {e->block[0], e->block[1], e->block[2]}, e->smem,
                                  (void *)(uintptr_t)stream, &attr, 1};
        err = cu_launch_ex(&config, e->function, params, NULL);
    } else {
        err = cu_launch(e->function, grid[0], grid[1], gz, e->block[0], e->block[1], e->block[2], e->smem,
                        (void *)(uintptr_t)stream, params, NULL);
    }
    Py_END_ALLOW_THREADS
    if (err)
        return python_launch(e, grid, stream, s);
    Py_RETURN_NONE;
}

/* A grid tuple of 1 to 3 positive ints; 0 when it is something else (Python resolves or rejects it). */
static int parse_grid(PyObject *grid, unsigned out[3]) {
    if (!PyTuple_CheckExact(grid))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(grid);
    if (n < 1 || n > 3)
        return 0;
    out[0] = out[1] = out[2] = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *g = PyTuple_GET_ITEM(grid, i);
        if (!PyLong_CheckExact(g))
            return 0;
        long x = PyLong_AsLong(g);
        if (x < 1 || x > 0x7fffffffL) {
            PyErr_Clear();
            return 0;
        }
        out[i] = (unsigned)x;
    }
    return 1;
}

static PyObject *call3(PyObject *fn, PyObject *grid, PyObject *args, PyObject *kwargs) {
    PyObject *kw = kwargs ? Py_NewRef(kwargs) : PyDict_New();
    if (!kw)
        return NULL;
    Py_INCREF(fn);
    PyObject *r = PyObject_CallFunctionObjArgs(fn, grid, args, kw, NULL);
    Py_DECREF(fn);
    Py_DECREF(kw);
    return r;
}

static int check_ready(Dispatcher *d) {
    if (!d->roles) { /* made by __new__ without __init__ */
        PyErr_SetString(PyExc_TypeError, "the Dispatcher was not initialised");
        return 0;
    }
    return 1;
}

static PyObject *dispatch(Dispatcher *d, PyObject *grid, PyObject *args, PyObject *kwargs) {
    signature_t s;
    if (!check_ready(d))
        return NULL;
    if (!build_signature(d, args, kwargs, &s, NULL, 0)) {
        d->fallbacks++;
        return call3(d->fallback, grid, args, kwargs);
    }
    uint64_t h = hash_words(s.words, s.n);
    PyObject *entry = lookup(&d->table, &s, h);
    if (!entry) {
        d->misses++;
        PyObject *made = call3(d->slow, grid, args, kwargs);
        if (!made)
            return NULL;
        if (PyObject_TypeCheck(made, &EntryType) && !((Entry *)made)->fallback) {
            Py_DECREF(made);
            PyErr_SetString(PyExc_TypeError, "the slow path returned an Entry that was not initialised");
            return NULL;
        }
        if (PyObject_TypeCheck(made, &EntryType)) {
            /* The slow path may have learned compile-time extents: sign the call again before remembering it. */
            if (build_signature(d, args, kwargs, &s, NULL, 0) &&
                insert(&d->table, &s, hash_words(s.words, s.n), made) < 0) {
                Py_DECREF(made);
                return PyErr_NoMemory();
            }
        }
        Py_DECREF(made);
        Py_RETURN_NONE;
    }
    Py_INCREF(entry); /* before any Python code runs (the grid function may drop the table's reference) */
    unsigned g[3];
    if (!parse_grid(grid, g)) {
        if (PyTuple_CheckExact(grid)) {
            Py_DECREF(entry);
            return call3(d->slow, grid, args, kwargs); /* a bad grid: Python says what is wrong */
        }
        PyObject *resolved = call3(d->grid_fn, grid, args, kwargs);
        if (!resolved) {
            Py_DECREF(entry);
            return NULL;
        }
        int ok = parse_grid(resolved, g);
        Py_DECREF(resolved);
        if (!ok) {
            Py_DECREF(entry);
            PyObject *r = call3(d->slow, grid, args, kwargs);
            Py_XDECREF(r);
            if (!r)
                return NULL;
            Py_RETURN_NONE;
        }
    }
    d->hits++;
    PyObject *device = PyLong_FromLong(s.device);
    PyObject *r = device ? launch((Entry *)entry, g, &s, device, d->stream_getter) : NULL;
    Py_XDECREF(device);
    Py_DECREF(entry);
    return r;
}

/* -- BoundLaunch: what kernel[grid] returns ----------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Dispatcher *dispatcher;
    PyObject *grid;
} BoundLaunch;

static void bound_dealloc(BoundLaunch *b) {
    Py_XDECREF(b->dispatcher);
    Py_XDECREF(b->grid);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *bound_call(BoundLaunch *b, PyObject *args, PyObject *kwargs) {
    PyObject *r = dispatch(b->dispatcher, b->grid, args, kwargs);
    if (r && r != Py_None) { /* the slow path's own return value is not the caller's business */
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    return r;
}

static PyTypeObject BoundLaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tilejit._launch.BoundLaunch",
    .tp_basicsize = sizeof(BoundLaunch),
    .tp_dealloc = (destructor)bound_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "kernel[grid]: call it with the kernel's arguments to launch.",
    .tp_call = (ternaryfunc)bound_call,
};

static PyObject *dispatcher_bind(Dispatcher *d, PyObject *grid) {
    BoundLaunch *b = PyObject_New(BoundLaunch, &BoundLaunchType);
    if (!b)
        return NULL;
    b->dispatcher = (Dispatcher *)Py_NewRef(d);
    b->grid = Py_NewRef(grid);
    return (PyObject *)b;
}

static PyObject *dispatcher_stats(Dispatcher *d, PyObject *unused) {
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "hits", d->hits, "misses", d->misses, "fallbacks", d->fallbacks,
                         "entries", d->table.used);
}

static PyObject *dispatcher_signature(Dispatcher *d, PyObject *args, PyObject *kwargs) {
    /* For tests: the signature words of a call, or None when the call takes the fallback. */
    signature_t s;
    if (!check_ready(d))
        return NULL;
    if (!build_signature(d, args, kwargs, &s, NULL, 0))
        Py_RETURN_NONE;
    PyObject *t = PyTuple_New(s.n);
    if (!t)
        return NULL;
    for (Py_ssize_t i = 0; i < s.n; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromUnsignedLongLong(s.words[i]));
    return t;
}

static PyMethodDef dispatcher_methods[] = {
    {"bind", (PyCFunction)dispatcher_bind, METH_O, "bind(grid) -> the launch callable kernel[grid] returns"},
    {"stats", (PyCFunction)dispatcher_stats, METH_NOARGS, "hits, misses, fallbacks and entries so far"},
    {"signature", (PyCFunction)(void (*)(void))dispatcher_signature, METH_VARARGS | METH_KEYWORDS,
     "signature(*args, **kwargs) -> the call's signature words, or None when it takes the fallback"},
    {NULL},
};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tilejit._launch.Dispatcher",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_dealloc = (destructor)dispatcher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel's signature -> compiled-kernel table and its launch path.",
    .tp_methods = dispatcher_methods,
    .tp_init = (initproc)dispatcher_init,
    .tp_new = PyType_GenericNew,
};

/* -- Tuned: an autotuned kernel's launch: the tuning key and the cached choice, then the Dispatcher's launch ---- */

#define MAX_ENV 16 /* environment variables a tuned choice may depend on */

extern char **environ;

typedef struct {
    PyObject_HEAD
    Dispatcher *dispatcher; /* the tuned kernel's own */
    unsigned char *exact;   /* per parameter: 1 for the autotune key's arguments, signed by value */
    Py_ssize_t nexact;
    char *env_names[MAX_ENV]; /* the variables whose text is part of the key, "NAME=" each */
    size_t env_lengths[MAX_ENV];
    int nenv;
    size_t env_prefix; /* bytes every name of env_names starts with: an entry without them is skipped at once */
    PyObject *slow;     /* (grid, args, kwargs) -> (the chosen config's launch kwargs, config) to remember, or None */
    PyObject *fallback; /* (grid, args, kwargs) -> None: calls the signature cannot encode, grids to check */
    PyObject *grid_fn;  /* (grid, args, kwargs, launch kwargs) -> the grid a grid function gives for the choice */
    PyObject *owner;    /* the Autotuner: its best_config is set to the choice of every launch */
    table_t table;      /* tuned signature -> (Entry, launch kwargs, config) */
    Py_ssize_t hits, misses, fallbacks;
} Tuned;

static PyObject *str_best_config;

static void tuned_dealloc(Tuned *t) {
    clear_slots(&t->table);
    for (int i = 0; i < t->nenv; i++)
        PyMem_Free(t->env_names[i]);
    PyMem_Free(t->exact);
    Py_XDECREF(t->dispatcher);
    Py_XDECREF(t->slow);
    Py_XDECREF(t->fallback);
    Py_XDECREF(t->grid_fn);
    Py_XDECREF(t->owner);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* Tuned(dispatcher=, exact=bytes, env_names=tuple of str, slow=, fallback=, grid_fn=, owner=) */
static int tuned_init(Tuned *t, PyObject *args, PyObject *kw) {
    static char *names[] = {"dispatcher", "exact", "env_names", "slow", "fallback", "grid_fn", "owner", NULL};
    PyObject *d, *env, *slow, *fb, *gf, *owner;
    const char *exact;
    Py_ssize_t nexact;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!y#O!OOOO", names, &DispatcherType, &d, &exact, &nexact,
                                     &PyTuple_Type, &env, &slow, &fb, &gf, &owner))
        return -1;
    if (t->dispatcher) {
        PyErr_SetString(PyExc_TypeError, "a Tuned is initialised once");
        return -1;
    }
    if (PyTuple_GET_SIZE(env) > MAX_ENV) {
        PyErr_SetString(PyExc_ValueError, "too many environment variables for a tuned launch");
        return -1;
    }
    t->exact = PyMem_Malloc(nexact + 1);
    if (!t->exact) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(t->exact, exact, nexact);
    t->nexact = nexact;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(env); i++) {
        Py_ssize_t len;
        const char *name = PyUnicode_Check(PyTuple_GET_ITEM(env, i))
                               ? PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(env, i), &len) : NULL;
        if (!name) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "env_names must be strings");
            return -1;
        }
        char *copy = PyMem_Malloc(len + 2);
        if (!copy) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, name, len);
        copy[len] = '=', copy[len + 1] = 0;
        t->env_names[t->nenv] = copy;
        t->env_lengths[t->nenv++] = (size_t)len + 1;
    }
    t->env_prefix = t->nenv ? t->env_lengths[0] : 0;
    for (int i = 1; i < t->nenv; i++) {
        size_t n = 0;
        while (n < t->env_prefix && n < t->env_lengths[i] && t->env_names[i][n] == t->env_names[0][n])
            n++;
        t->env_prefix = n;
    }
    t->dispatcher = (Dispatcher *)Py_NewRef(d);
    t->slow = Py_NewRef(slow);
    t->fallback = Py_NewRef(fb);
    t->grid_fn = Py_NewRef(gf);
    t->owner = Py_NewRef(owner);
    return 0;
}

/* The text of each of the tuner's environment variables (TAG_NONE where unset), read in one pass over the C
 * environment, which os.environ's assignments and deletions keep up to date. */
static int put_environment(Tuned *t, signature_t *s) {
    const char *found[MAX_ENV] = {NULL};
    const char *prefix = t->nenv ? t->env_names[0] : "";
    for (char **e = environ; e && *e; e++) {
        const char *entry = *e;
        if (t->env_prefix && memcmp(entry, prefix, t->env_prefix) != 0)
            continue; /* (an entry shorter than the prefix differs at its NUL before memcmp reads past it) */
        for (int i = 0; i < t->nenv; i++)
            if (!found[i] && strncmp(entry, t->env_names[i], t->env_lengths[i]) == 0)
                found[i] = entry + t->env_lengths[i];
    }
    if (!put(s, TAG_ENV))
        return 0;
    for (int i = 0; i < t->nenv; i++) {
        if (!found[i]) {
            if (!put(s, TAG_NONE))
                return 0;
            continue;
        }
        size_t len = strlen(found[i]);
        if (!put(s, TAG_STR) || !put(s, (uint64_t)len))
            return 0;
        for (size_t j = 0; j < len; j += 8) {
            uint64_t w = 0;
            memcpy(&w, found[i] + j, len - j < 8 ? len - j : 8);
            if (!put(s, w))
                return 0;
        }
    }
    return 1;
}

/* The tuning key of a call: the kernel's signature of the call (the launch options and the config's constexprs
 * left out: the choice brings them), the key arguments by value, and the environment the choice depends on. */
static int tuned_signature(Tuned *t, PyObject *args, PyObject *kwargs, signature_t *s) {
    return build_signature(t->dispatcher, args, kwargs, s, t->exact, t->nexact) && put_environment(t, s) &&
           s->n < MAX_WORDS;
}

/* After the slow path launched the chosen config: find the Entry the kernel's Dispatcher remembered for that launch
 * (the call with the config's launch kwargs) and remember it under the call's tuning key. Nothing is remembered
 * while the Dispatcher has no Entry for it (the kernel's first launches, calls its fast path refuses). */
static int remember_choice(Tuned *t, PyObject *args, PyObject *kwargs, PyObject *launch_kwargs, PyObject *config) {
    if (!PyDict_Check(launch_kwargs)) {
        PyErr_SetString(PyExc_TypeError, "the tuned slow path must return (launch kwargs dict, config) or None");
        return -1;
    }
    PyObject *merged = kwargs ? PyDict_Copy(kwargs) : PyDict_New();
    if (!merged)
        return -1;
    if (PyDict_Update(merged, launch_kwargs) < 0) {
        Py_DECREF(merged);
        return -1;
    }
    signature_t *s = PyMem_Malloc(sizeof(signature_t));
    if (!s) {
        Py_DECREF(merged);
        PyErr_NoMemory();
        return -1;
    }
    int result = 0;
    PyObject *entry = NULL, *chosen = NULL;
    if (build_signature(t->dispatcher, args, merged, s, NULL, 0))
        entry = lookup(&t->dispatcher->table, s, hash_words(s->words, s->n));
    if (entry && tuned_signature(t, args, kwargs, s)) {
        chosen = PyTuple_Pack(3, entry, launch_kwargs, config);
        result = chosen ? insert(&t->table, s, hash_words(s->words, s->n), chosen) : -1;
        Py_XDECREF(chosen);
    }
    Py_DECREF(merged);
    PyMem_Free(s);
    return result < 0 ? -1 : 0;
}

static PyObject *tuned_dispatch(Tuned *t, PyObject *grid, PyObject *args, PyObject *kwargs) {
    signature_t s;
    if (!t->dispatcher) {
        PyErr_SetString(PyExc_TypeError, "the Tuned was not initialised");
        return NULL;
    }
    if (!tuned_signature(t, args, kwargs, &s)) {
        t->fallbacks++;
        return call3(t->fallback, grid, args, kwargs);
    }
    PyObject *chosen = lookup(&t->table, &s, hash_words(s.words, s.n));
    if (!chosen) {
        t->misses++;
        PyObject *made = call3(t->slow, grid, args, kwargs);
        if (!made)
            return NULL;
        int failed = 0;
        if (made != Py_None) {
            if (!PyTuple_Check(made) || PyTuple_GET_SIZE(made) != 2) {
                PyErr_SetString(PyExc_TypeError, "the tuned slow path must return (launch kwargs, config) or None");
                failed = 1;
            } else
                failed = remember_choice(t, args, kwargs, PyTuple_GET_ITEM(made, 0), PyTuple_GET_ITEM(made, 1)) < 0;
        }
        Py_DECREF(made);
        if (failed)
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(chosen); /* before any Python code runs */
    Entry *entry = (Entry *)PyTuple_GET_ITEM(chosen, 0);
    unsigned g[3];
    if (!parse_grid(grid, g)) {
        PyObject *resolved = PyTuple_CheckExact(grid) ? NULL
                                                      : PyObject_CallFunctionObjArgs(t->grid_fn, grid, args, kwargs
                                                                                     ? kwargs : Py_None,
                                                                                     PyTuple_GET_ITEM(chosen, 1), NULL);
        if (!resolved && PyErr_Occurred()) {
            Py_DECREF(chosen);
            return NULL;
        }
        int ok = resolved && parse_grid(resolved, g);
        Py_XDECREF(resolved);
        if (!ok) { /* a bad grid, or one the launch resolves further (an int, a list): Python decides */
            Py_DECREF(chosen);
            t->fallbacks++;
            return call3(t->fallback, grid, args, kwargs);
        }
    }
    t->hits++;
    if (PyObject_SetAttr(t->owner, str_best_config, PyTuple_GET_ITEM(chosen, 2)) < 0) {
        Py_DECREF(chosen);
        return NULL;
    }
    PyObject *device = PyLong_FromLong(s.device);
    PyObject *r = device ? launch(entry, g, &s, device, t->dispatcher->stream_getter) : NULL;
    Py_XDECREF(device);
    Py_DECREF(chosen);
    return r;
}

typedef struct {
    PyObject_HEAD
    Tuned *tuned;
    PyObject *grid;
} TunedLaunch;

static void tuned_launch_dealloc(TunedLaunch *b) {
    Py_XDECREF(b->tuned);
    Py_XDECREF(b->grid);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *tuned_launch_call(TunedLaunch *b, PyObject *args, PyObject *kwargs) {
    PyObject *r = tuned_dispatch(b->tuned, b->grid, args, kwargs);
    if (r && r != Py_None) {
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    return r;
}

static PyTypeObject TunedLaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tilejit._launch.TunedLaunch",
    .tp_basicsize = sizeof(TunedLaunch),
    .tp_dealloc = (destructor)tuned_launch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "tuner[grid]: call it with the kernel's arguments to launch the tuned choice.",
    .tp_call = (ternaryfunc)tuned_launch_call,
};

static PyObject *tuned_bind(Tuned *t, PyObject *grid) {
    TunedLaunch *b = PyObject_New(TunedLaunch, &TunedLaunchType);
    if (!b)
        return NULL;
    b->tuned = (Tuned *)Py_NewRef(t);
    b->grid = Py_NewRef(grid);
    return (PyObject *)b;
}

static PyObject *tuned_stats(Tuned *t, PyObject *unused) {
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "hits", t->hits, "misses", t->misses, "fallbacks", t->fallbacks,
                         "entries", t->table.used);
}

static PyObject *tuned_signature_method(Tuned *t, PyObject *args, PyObject *kwargs) {
    /* For tests: the tuning-key words of a call, or None when the call takes the fallback. */
    signature_t *s = PyMem_Malloc(sizeof(signature_t));
    if (!s)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    if (!t->dispatcher)
        PyErr_SetString(PyExc_TypeError, "the Tuned was not initialised");
    else if (!tuned_signature(t, args, kwargs, s))
        out = Py_NewRef(Py_None);
    else if ((out = PyTuple_New(s->n)))
        for (Py_ssize_t i = 0; i < s->n; i++)
            PyTuple_SET_ITEM(out, i, PyLong_FromUnsignedLongLong(s->words[i]));
    PyMem_Free(s);
    return out;
}

static PyObject *tuned_clear(Tuned *t, PyObject *unused) {
    clear_slots(&t->table);
    Py_RETURN_NONE;
}

static PyMethodDef tuned_methods[] = {
    {"bind", (PyCFunction)tuned_bind, METH_O, "bind(grid) -> the launch callable tuner[grid] returns"},
    {"stats", (PyCFunction)tuned_stats, METH_NOARGS, "hits, misses, fallbacks and remembered choices so far"},
    {"signature", (PyCFunction)(void (*)(void))tuned_signature_method, METH_VARARGS | METH_KEYWORDS,
     "signature(*args, **kwargs) -> the call's tuning-key words, or None when it takes the fallback"},
    {"clear", (PyCFunction)tuned_clear, METH_NOARGS, "forget every remembered choice"},
    {NULL},
};

static PyTypeObject TunedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tilejit._launch.Tuned",
    .tp_basicsize = sizeof(Tuned),
    .tp_dealloc = (destructor)tuned_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An autotuned kernel's tuning key -> chosen compiled kernel table and its launch path.",
    .tp_methods = tuned_methods,
    .tp_init = (initproc)tuned_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *set_launch_hook(PyObject *self, PyObject *hook) {
    Py_XSETREF(launch_hook, hook == Py_None ? NULL : Py_NewRef(hook));
    Py_RETURN_NONE;
}

/* benchmarks/launch.py: the driver's own floor. Launches the entry (args, kwargs) select `n` times from a C loop with
 * the parameters packed once (grid 1x1x1), and returns the microseconds per cuLaunchKernel. */
static PyObject *time_driver_launches(PyObject *self, PyObject *a) {
    PyObject *d, *args, *kwargs = NULL;
    Py_ssize_t n;
    unsigned long long stream;
    if (!PyArg_ParseTuple(a, "O!nKO!|O!", &DispatcherType, &d, &n, &stream, &PyTuple_Type, &args, &PyDict_Type,
                          &kwargs))
        return NULL;
    signature_t *s = PyMem_Malloc(sizeof(signature_t));
    if (!s)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Entry *e = NULL;
    if (!check_ready((Dispatcher *)d))
        goto done;
    if (!build_signature((Dispatcher *)d, args, kwargs, s, NULL, 0) ||
        !(e = (Entry *)lookup(&((Dispatcher *)d)->table, s, hash_words(s->words, s->n))) || e->ntmaps || e->python_only) {
        PyErr_SetString(PyExc_ValueError, "launch the kernel with these arguments first (and not one with tensor maps)");
        goto done;
    }
    if (!load_driver())
        goto done;
    _Alignas(64) unsigned char buffer[MAX_PARAM_BYTES];
    void *params[MAX_VALUES];
    if (!pack_values(e, s, buffer, params)) {
        PyErr_SetString(PyExc_ValueError, "an int argument does not fit its 32-bit kernel parameter");
        goto done;
    }
    struct timespec t0, t1;
    int err = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (Py_ssize_t i = 0; i < n && !err; i++)
        err = cu_launch(e->function, 1, 1, 1, e->block[0], e->block[1], e->block[2], e->smem,
                        (void *)(uintptr_t)stream, params, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (err)
        PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed with CUresult %d", err);
    else
        result = PyFloat_FromDouble(((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / (n > 0 ? n : 1));
done:
    PyMem_Free(s);
    return result;
}

static PyMethodDef module_methods[] = {
    {"time_driver_launches", time_driver_launches, METH_VARARGS,
     "time_driver_launches(dispatcher, n, stream, args[, kwargs]) -> microseconds per bare cuLaunchKernel"},
    {"set_launch_hook", set_launch_hook, METH_O,
     "set_launch_hook(fn or None): call fn(function, grid, block, smem, stream, params, offsets) instead of "
     "cuLaunchKernel (tests without a GPU)"},
    {NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_launch", "tilejit's native launch path.", -1,
                                       module_methods};

#define INTERN(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__launch(void) {
    INTERN(str_dtype, "dtype");
    INTERN(str_shape, "shape");
    INTERN(str_stride, "stride");
    INTERN(str_requires_grad, "requires_grad");
    INTERN(str_data_ptr, "data_ptr");
    INTERN(str_get_device, "get_device");
    INTERN(str_best_config, "best_config");
    if (PyType_Ready(&EntryType) < 0 || PyType_Ready(&DispatcherType) < 0 || PyType_Ready(&BoundLaunchType) < 0 ||
        PyType_Ready(&TunedType) < 0 || PyType_Ready(&TunedLaunchType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Entry", (PyObject *)&EntryType) < 0 ||
        PyModule_AddObjectRef(m, "Dispatcher", (PyObject *)&DispatcherType) < 0 ||
        PyModule_AddObjectRef(m, "BoundLaunch", (PyObject *)&BoundLaunchType) < 0 ||
        PyModule_AddObjectRef(m, "Tuned", (PyObject *)&TunedType) < 0 ||
        PyModule_AddObjectRef(m, "TunedLaunch", (PyObject *)&TunedLaunchType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_ENTRIES", MAX_ENTRIES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
