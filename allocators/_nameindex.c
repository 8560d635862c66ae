/* The prefix cache's index, BlockPool.hash_to_block, as a compact table: block names (ints) to block ids; and the
allocators' other loops over blocks.

Why: a long-context run names, looks up and forgets hundreds of thousands of blocks, and a dict holds each entry
as two boxed ints behind a hash slot. Here a name is 8 bytes beside its block's 4 (a probe reads one cache line), in
open addressing with linear probing (deletion shifts the run back, so there are no tombstones). It behaves as the
dict it replaces for every operation the pool, the block manager and their tests use (get, setdefault, [], del, in,
len, items, keys, iteration, dict(), ==, copy and pickle); a name outside int64, or not an int (or an int of its own
hash), is kept in a plain dict beside the table ("strays"), so any name a dict takes is taken. The loops an hour of
long prompts runs some nine million times a block run here too, each the Python loop beside its call written out:
the pool's naming, forgetting, holding and releasing (register_names, forget_names, hold_refs, release_refs), the
block manager's count of held hits (count_held) and check of kept ones (NameIndex.gives), and a prompt's naming of
its blocks (name_inside, CPython's hash of a pair written out). Without this module built, the allocators use a
dict and their Python loops: the reference this is tested against (tests/test_nameindex.py). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define EMPTY (-1)

/* A name beside its block, so that a probe reads one cache line, not one in each of two arrays. */
typedef struct {
    int64_t name;
    int32_t block; /* EMPTY: a free slot */
} Slot;

typedef struct {
    PyObject_HEAD
    int bits;            /* the table has 2**bits slots */
    size_t mask;         /* 2**bits - 1 */
    Py_ssize_t used;     /* names in the table */
    Py_ssize_t hint;     /* the number of blocks it was made for (kept by pickle) */
    Slot *slots;
    PyObject *strays;    /* dict of the names the table cannot hold; NULL until one comes */
} NameIndex;

static PyTypeObject NameIndexType;

static inline size_t home(const NameIndex *t, int64_t name) {
    return (size_t)(((uint64_t)name * 0x9E3779B97F4A7C15ULL) >> (64 - t->bits));
}

/* Whether ``key`` hashes and compares as an int (an int, a bool): then its value is its whole identity as a key. */
static int int_alike(PyObject *key) {
    PyTypeObject *type = Py_TYPE(key);
    return PyLong_CheckExact(key) || (PyLong_Check(key) && type->tp_hash == PyLong_Type.tp_hash &&
                                      type->tp_richcompare == PyLong_Type.tp_richcompare);
}

/* 1: ``key`` is an int in int64, stored in *name; 0: a stray (an int of its own hash or == too); -1: an error. */
static int name_of(PyObject *key, int64_t *name) {
    if (!int_alike(key)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (overflow) return 0;
    if (v == -1 && PyErr_Occurred()) return -1;
    *name = (int64_t)v;
    return 1;
}

static int block_of(PyObject *value, int32_t *block) {
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "a block id is an int from 0 to 2**31-1, not %ld", v);
        return -1;
    }
    *block = (int32_t)v;
    return 0;
}

static Py_ssize_t slot_of(const NameIndex *t, int64_t name) {
    for (size_t i = home(t, name);; i = (i + 1) & t->mask) {
        if (t->slots[i].block == EMPTY) return -1;
        if (t->slots[i].name == name) return (Py_ssize_t)i;
    }
}

static int alloc_slots(NameIndex *t, int bits) {
    t->slots = PyMem_Malloc(sizeof(Slot) << bits);
    if (!t->slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < (size_t)1 << bits; i++) t->slots[i].block = EMPTY;
    t->bits = bits;
    t->mask = ((size_t)1 << bits) - 1;
    return 0;
}

/* Puts a name known to be absent; the table is at most half full, so a free slot is always found. */
static void place(NameIndex *t, int64_t name, int32_t block) {
    size_t i = home(t, name);
    while (t->slots[i].block != EMPTY) i = (i + 1) & t->mask;
    t->slots[i].name = name;
    t->slots[i].block = block;
    t->used++;
}

/* Doubles the table when one more name would fill it past half (only if used beyond its num_blocks). */
static int make_room(NameIndex *t) {
    if (2 * (size_t)(t->used + 1) <= t->mask + 1) return 0;
    Slot *slots = t->slots;
    size_t n = t->mask + 1;
    if (alloc_slots(t, t->bits + 1) < 0) {
        t->slots = slots;
        return -1;
    }
    t->used = 0;
    for (size_t i = 0; i < n; i++)
        if (slots[i].block != EMPTY) place(t, slots[i].name, slots[i].block);
    PyMem_Free(slots);
    return 0;
}

/* Empties slot i, shifting back each later name of its run that may not be left behind the gap. */
static void erase(NameIndex *t, size_t i) {
    for (size_t j = (i + 1) & t->mask; t->slots[j].block != EMPTY; j = (j + 1) & t->mask) {
        size_t k = home(t, t->slots[j].name);
        int reachable = (i <= j) ? (i < k && k <= j) : (i < k || k <= j); /* k in (i, j], cyclically */
        if (!reachable) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].block = EMPTY;
    t->used--;
}

/* A missing key's KeyError as a dict raises it: the key its one argument (a tuple or None too). */
static void key_error(PyObject *key) {
    PyObject *args = PyTuple_Pack(1, key);
    if (args) PyErr_SetObject(PyExc_KeyError, args);
    Py_XDECREF(args);
}

/* A stray key looked up where there are no strays: absent (0), or unhashable (-1, a TypeError set), as a dict. */
static int no_stray(PyObject *key) {
    return PyObject_Hash(key) == -1 ? -1 : 0;
}

static PyObject *strays(NameIndex *t) {
    if (!t->strays) t->strays = PyDict_New();
    return t->strays;
}

/* The block stored under ``key`` (a new reference), NULL with no error set if absent, NULL with one on error. */
static PyObject *lookup(NameIndex *t, PyObject *key) {
    int64_t name;
    int kind = name_of(key, &name);
    if (kind < 0) return NULL;
    if (kind == 0) {
        if (!t->strays) {
            no_stray(key);
            return NULL;
        }
        PyObject *v = PyDict_GetItemWithError(t->strays, key);
        Py_XINCREF(v);
        return v;
    }
    Py_ssize_t i = slot_of(t, name);
    return i < 0 ? NULL : PyLong_FromLong(t->slots[i].block);
}

/* dict.setdefault(key, value): the block stored under ``key`` after the call (a new reference). */
static PyObject *set_default(NameIndex *t, PyObject *key, PyObject *value) {
    int64_t name;
    int32_t block;
    int kind = name_of(key, &name);
    if (kind < 0 || block_of(value, &block) < 0) return NULL;
    if (kind == 0) {
        PyObject *d = strays(t);
        PyObject *v = d ? PyDict_SetDefault(d, key, value) : NULL;
        Py_XINCREF(v);
        return v;
    }
    Py_ssize_t i = slot_of(t, name);
    if (i >= 0) return PyLong_FromLong(t->slots[i].block);
    if (make_room(t) < 0) return NULL;
    place(t, name, block);
    Py_INCREF(value);
    return value;
}

/* ---------------------------------------------------------------- the type */

static int ni_setitem(NameIndex *t, PyObject *key, PyObject *value);

/* Each (name, block) of ``pairs`` stored in turn, the last of a name's kept, as dict(pairs). */
static int add_pairs(NameIndex *t, PyObject *pairs) {
    PyObject *it = PyObject_GetIter(pairs);
    if (!it) return -1;
    PyObject *pair;
    while ((pair = PyIter_Next(it))) {
        PyObject *key, *value;
        int failed = !PyArg_ParseTuple(pair, "OO:NameIndex pair", &key, &value) || ni_setitem(t, key, value) < 0;
        Py_DECREF(pair);
        if (failed) break;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *ni_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"num_blocks", "pairs", NULL};
    Py_ssize_t n;
    PyObject *pairs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|O:NameIndex", kwlist, &n, &pairs)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "num_blocks must be >= 0, not %zd", n);
    NameIndex *t = (NameIndex *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    int bits = 4;
    while (((size_t)1 << bits) < 4 * (size_t)n) bits++; /* at most a quarter full while it holds num_blocks */
    t->hint = n;
    if (alloc_slots(t, bits) < 0 || (pairs && add_pairs(t, pairs) < 0)) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static int ni_traverse(NameIndex *t, visitproc visit, void *arg) {
    Py_VISIT(t->strays);
    return 0;
}

static int ni_clear(NameIndex *t) {
    Py_CLEAR(t->strays);
    return 0;
}

static void ni_dealloc(NameIndex *t) {
    PyObject_GC_UnTrack(t);
    ni_clear(t);
    PyMem_Free(t->slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t ni_len(NameIndex *t) {
    return t->used + (t->strays ? PyDict_GET_SIZE(t->strays) : 0);
}

static PyObject *ni_getitem(NameIndex *t, PyObject *key) {
    PyObject *v = lookup(t, key);
    if (!v && !PyErr_Occurred()) key_error(key);
    return v;
}

static int ni_setitem(NameIndex *t, PyObject *key, PyObject *value) {
    int64_t name;
    int32_t block;
    int kind = name_of(key, &name);
    if (kind < 0 || (value && block_of(value, &block) < 0)) return -1;
    if (kind == 0) {
        if (value) return strays(t) ? PyDict_SetItem(t->strays, key, value) : -1;
        if (t->strays) return PyDict_DelItem(t->strays, key);
        if (no_stray(key) == 0) key_error(key);
        return -1;
    }
    Py_ssize_t i = slot_of(t, name);
    if (!value) {
        if (i < 0) {
            key_error(key);
            return -1;
        }
        erase(t, (size_t)i);
        return 0;
    }
    if (i >= 0) {
        t->slots[i].block = block;
        return 0;
    }
    if (make_room(t) < 0) return -1;
    place(t, name, block);
    return 0;
}

static int ni_contains(NameIndex *t, PyObject *key) {
    PyObject *v = lookup(t, key);
    if (!v) return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(v);
    return 1;
}

static int arity(const char *name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most) {
    if (nargs >= least && nargs <= most) return 1;
    PyErr_Format(PyExc_TypeError, "%s expected %zd to %zd arguments, got %zd", name, least, most, nargs);
    return 0;
}

static PyObject *ni_get(NameIndex *t, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity("get", nargs, 1, 2)) return NULL;
    PyObject *v = lookup(t, args[0]);
    if (v || PyErr_Occurred()) return v;
    v = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(v);
    return v;
}

static PyObject *ni_setdefault(NameIndex *t, PyObject *const *args, Py_ssize_t nargs) {
    if (!arity("setdefault", nargs, 2, 2)) return NULL;
    return set_default(t, args[0], args[1]);
}

static PyObject *ni_items(NameIndex *t, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].block == EMPTY) continue;
        PyObject *pair = Py_BuildValue("(Li)", (long long)t->slots[i].name, (int)t->slots[i].block);
        if (!pair || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
    }
    if (t->strays) {
        PyObject *rest = PyDict_Items(t->strays);
        int failed = !rest || PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, rest) < 0;
        Py_XDECREF(rest);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *ni_keys(NameIndex *t, PyObject *unused) {
    PyObject *items = ni_items(t, NULL), *keys = items ? PyList_New(PyList_GET_SIZE(items)) : NULL;
    for (Py_ssize_t i = 0; keys && i < PyList_GET_SIZE(items); i++)
        PyList_SET_ITEM(keys, i, Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0)));
    Py_XDECREF(items);
    return keys;
}

static PyObject *as_dict(NameIndex *t) {
    PyObject *items = ni_items(t, NULL), *d = PyDict_New();
    if (!items || !d || PyDict_MergeFromSeq2(d, items, 1) < 0) Py_CLEAR(d);
    Py_XDECREF(items);
    return d;
}

static PyObject *ni_iter(NameIndex *t) {
    PyObject *d = as_dict(t);
    PyObject *it = d ? PyObject_GetIter(d) : NULL;
    Py_XDECREF(d);
    return it;
}

/* == and != as between dicts, against a dict or another NameIndex. */
static PyObject *ni_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(b) || PyObject_TypeCheck(b, &NameIndexType)) ||
        !(PyDict_Check(a) || PyObject_TypeCheck(a, &NameIndexType)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *x = PyDict_Check(a) ? Py_NewRef(a) : as_dict((NameIndex *)a);
    PyObject *y = PyDict_Check(b) ? Py_NewRef(b) : as_dict((NameIndex *)b);
    PyObject *result = x && y ? PyObject_RichCompare(x, y, op) : NULL;
    Py_XDECREF(x);
    Py_XDECREF(y);
    return result;
}

static PyObject *ni_repr(NameIndex *t) {
    PyObject *d = as_dict(t);
    PyObject *r = d ? PyUnicode_FromFormat("NameIndex(%R)", d) : NULL;
    Py_XDECREF(d);
    return r;
}

static PyObject *ni_reduce(NameIndex *t, PyObject *unused) {
    PyObject *items = ni_items(t, NULL);
    if (!items) return NULL;
    return Py_BuildValue("O(nN)", Py_TYPE(t), t->hint, items);
}

/* ---------------------------------------------------------------- the pool's bulk loops */

/* The loops below read, a block at a time, an index slot and (forgetting) a name's int that the rest of the
   engine has long pushed out of the cache. Asked for AHEAD blocks before they are read, those reads overlap instead
   of waiting one after another. Hints only: nothing is changed, no error is raised, no result depends on them. */
#define AHEAD 8

static inline void prefetch_slot(const NameIndex *t, PyObject *key) {
    int overflow;
    long long name = PyLong_CheckExact(key) ? PyLong_AsLongLongAndOverflow(key, &overflow) : 0;
    size_t i = home(t, (int64_t)name);
    __builtin_prefetch(&t->slots[i]);
}

/* ``block``'s id if it is an int from 0 to size - 1, else -1, no error set: reading it runs no Python code. */
static inline Py_ssize_t block_id(PyObject *block, Py_ssize_t size) {
    Py_ssize_t b = PyLong_CheckExact(block) ? PyLong_AsSsize_t(block) : -1;
    if (b == -1) PyErr_Clear(); /* an id past a C ssize_t */
    return b >= 0 && b < size ? b : -1;
}

/* ``named[block]`` if block is an int that indexes it, else NULL (no error set). */
static inline PyObject *peek_name(PyObject *named, PyObject *block) {
    Py_ssize_t b = block_id(block, PyList_GET_SIZE(named));
    return b < 0 ? NULL : PyList_GET_ITEM(named, b);
}

/* Whether ``seq`` is a list or a tuple: read again by the Python loop if handed back, not an iterator used up. */
static int listed(PyObject *seq) {
    return PyList_CheckExact(seq) || PyTuple_CheckExact(seq);
}

/* Whether the first n of ``bs`` are ints from 0 to size - 1 (reading them runs no Python code); else the Python loop
   indexes the list with them, and raises or not (a negative id, an int-like object), as it would. */
static int blocks_of_list(PyObject *const *items, Py_ssize_t n, Py_ssize_t size) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (block_id(items[i], size) < 0) return 0;
    return 1;
}

/* register_names's loop while each unnamed block's name is an int in int64 and, with ``keep``, its content is in
   no other block (the engine's every block but V1's rare duplicates): no Python code runs, so the lists are read in
   place (``bs``, ``hs``: the items of the blocks and their names, the first n checked block ids). Returns the
   position of the first block it leaves to the loop that copes with any name or a duplicate, n if none; -1 with an
   error set. */
static Py_ssize_t register_plain(NameIndex *t, PyObject *named, PyObject *const *bs, PyObject *const *hs,
                                 Py_ssize_t n, int keep, PyObject *done) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n && PyLong_CheckExact(hs[i + AHEAD])) prefetch_slot(t, hs[i + AHEAD]);
        Py_ssize_t b = PyLong_AsSsize_t(bs[i]);
        if (PyList_GET_ITEM(named, b) != Py_None) continue;
        int64_t name;
        if (!PyLong_CheckExact(hs[i]) || name_of(hs[i], &name) != 1 || b > INT32_MAX) return i;
        Py_ssize_t slot = slot_of(t, name);
        if (slot >= 0 && t->slots[slot].block != b) { /* the content is cached in another block already */
            if (!keep) continue;
            return i; /* a duplicate, kept in a dict whose keys' own code may run */
        }
        if (slot < 0) {
            if (make_room(t) < 0) return -1;
            place(t, name, (int32_t)b);
        }
        PyList_SET_ITEM(named, b, Py_NewRef(hs[i]));
        Py_DECREF(Py_None); /* what the block's place held */
        if (PyList_Append(done, bs[i]) < 0) return -1;
    }
    return n;
}

/* One turn of BlockPool.register's Python loop, written out with the abstract API (``named[block]`` as Python reads
   and writes it): the loop for any name, whose own code may change any of the lists. 0, or -1 with an error set. */
static int register_one(NameIndex *t, PyObject *named, PyObject *block, PyObject *h, int keep, PyObject *duplicates,
                        PyObject *done) {
    PyObject *current = PyObject_GetItem(named, block);
    if (!current) return -1;
    int unnamed = current == Py_None;
    Py_DECREF(current);
    if (!unnamed) return 0;
    PyObject *first = set_default(t, h, block);
    if (!first) return -1;
    int other = PyObject_RichCompareBool(first, block, Py_NE);
    Py_DECREF(first);
    if (other < 0) return -1;
    if (other) { /* the content is cached in another block already */
        if (!keep) return 0;
        PyObject *fresh = PyList_New(0);
        PyObject *younger = fresh ? PyDict_SetDefault(duplicates, h, fresh) : NULL;
        Py_XINCREF(younger);
        Py_XDECREF(fresh);
        int failed = !younger || PyList_Append(younger, block) < 0;
        Py_XDECREF(younger);
        if (failed) return -1;
    }
    return PyObject_SetItem(named, block, h) < 0 || PyList_Append(done, block) < 0 ? -1 : 0;
}

/* What BlockPool.register's Python loop does: name each unnamed block (``named``, the pool's block_hash) by its
   content hash in ``index``; a content already cached elsewhere is named only with ``keep`` (its block joins
   ``duplicates``). Returns the blocks named, or None, having changed nothing, for blocks or hashes not a list or a
   tuple or a block id not an int from 0 to the list's length (blocks_of_list). The engine's blocks go through
   register_plain; what it leaves, from the first block it stops at, through register_one, each list read again at
   each turn as zip's list iterators read it (a stray name's Python code, its hash, its ==, may change them). */
static PyObject *register_names(PyObject *module, PyObject *args) {
    NameIndex *t;
    PyObject *named, *blocks, *hashes, *duplicates;
    int keep;
    if (!PyArg_ParseTuple(args, "O!O!OOpO!:register_names", &NameIndexType, &t, &PyList_Type, &named, &blocks,
                          &hashes, &keep, &PyDict_Type, &duplicates))
        return NULL;
    if (!listed(blocks) || !listed(hashes)) Py_RETURN_NONE;
    Py_ssize_t n = Py_MIN(PySequence_Fast_GET_SIZE(blocks), PySequence_Fast_GET_SIZE(hashes)), from = 0;
    if (!blocks_of_list(PySequence_Fast_ITEMS(blocks), n, PyList_GET_SIZE(named))) Py_RETURN_NONE;
    PyObject *done = PyList_New(0);
    if (!done) return NULL;
    if (blocks != named && hashes != named)
        from = register_plain(t, named, PySequence_Fast_ITEMS(blocks), PySequence_Fast_ITEMS(hashes), n, keep, done);
    if (from == n) return done;
    if (from < 0) goto fail;
    for (Py_ssize_t i = from; i < PySequence_Fast_GET_SIZE(blocks) && i < PySequence_Fast_GET_SIZE(hashes); i++) {
        if (i + AHEAD < PySequence_Fast_GET_SIZE(hashes)) prefetch_slot(t, PySequence_Fast_GET_ITEM(hashes, i + AHEAD));
        PyObject *block = Py_NewRef(PySequence_Fast_GET_ITEM(blocks, i));
        PyObject *h = Py_NewRef(PySequence_Fast_GET_ITEM(hashes, i));
        int failed = register_one(t, named, block, h, keep, duplicates, done) < 0;
        Py_DECREF(block);
        Py_DECREF(h);
        if (failed) goto fail;
    }
    return done;
fail:
    Py_DECREF(done);
    return NULL;
}

/* The stages of forget_plain's prefetching for the block ``ahead`` places on (0 <= ahead < n, the list's items
   checked ints in range): at 4 * AHEAD its id's int, at 3 * AHEAD its place in ``named``, at 2 * AHEAD its name's
   int, at AHEAD its slot. Each stage reads only what the one before asked for, so no read waits on memory. */
static inline void prefetch_forget(const NameIndex *t, PyObject *named, PyObject *const *items, Py_ssize_t ahead,
                                   int stage) {
    if (stage == 4) {
        __builtin_prefetch(items[ahead]);
        return;
    }
    Py_ssize_t b = PyLong_AsSsize_t(items[ahead]);
    PyObject **slot = &((PyListObject *)named)->ob_item[b];
    if (stage == 3) {
        __builtin_prefetch(slot);
        return;
    }
    if (stage == 2) {
        __builtin_prefetch(*slot);
        return;
    }
    if (PyLong_CheckExact(*slot)) prefetch_slot(t, *slot);
}

/* forget_names's loop while each block's name is an int in int64 in the table (the engine's every name): the name
   leaves the table and the block ``named`` None, no Python code run, so the list ``items`` of ``blocks`` is read in
   place. Returns the position of the first block it leaves to the loop that copes with any name (a stray one, one
   absent, None), n if none. */
static Py_ssize_t forget_plain(NameIndex *t, PyObject *named, PyObject *const *items, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        for (int stage = 4; stage >= 1; stage--)
            if (i + stage * AHEAD < n) prefetch_forget(t, named, items, i + stage * AHEAD, stage);
        Py_ssize_t b = PyLong_AsSsize_t(items[i]);
        PyObject *name = PyList_GET_ITEM(named, b);
        int64_t key;
        if (!PyLong_CheckExact(name) || name_of(name, &key) != 1) break; /* also PyErr-free: an exact int */
        Py_ssize_t slot = slot_of(t, key);
        if (slot < 0) break; /* absent: the loop below raises KeyError, as del does */
        erase(t, (size_t)slot);
        PyList_SET_ITEM(named, b, Py_NewRef(Py_None));
        Py_DECREF(name); /* an int: freeing it runs no Python code */
    }
    return i;
}

/* What BlockPool.forget's Python loop does while no content has duplicates: each block's name leaves ``index``
   and the block is unnamed. False, having changed nothing, as register_names returns None. The engine's blocks (a
   list of block ids, ``named`` another list) go through forget_plain; what it leaves, from the first block it
   stops at, through the Python loop written out, as a stray name's own code may change the lists. */
static PyObject *forget_names(PyObject *module, PyObject *args) {
    NameIndex *t;
    PyObject *named, *blocks;
    if (!PyArg_ParseTuple(args, "O!O!O:forget_names", &NameIndexType, &t, &PyList_Type, &named, &blocks))
        return NULL;
    if (!listed(blocks)) Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks), done = 0;
    if (!blocks_of_list(PySequence_Fast_ITEMS(blocks), n, PyList_GET_SIZE(named))) Py_RETURN_FALSE;
    if (blocks != named) done = forget_plain(t, named, PySequence_Fast_ITEMS(blocks), n);
    if (done == n) Py_RETURN_TRUE;
    for (Py_ssize_t i = done; i < PySequence_Fast_GET_SIZE(blocks); i++) { /* ``blocks`` read as its iterator would */
        PyObject *ahead = i + AHEAD < PySequence_Fast_GET_SIZE(blocks)
                              ? peek_name(named, PySequence_Fast_GET_ITEM(blocks, i + AHEAD))
                              : NULL;
        if (ahead) prefetch_slot(t, ahead);
        PyObject *block = Py_NewRef(PySequence_Fast_GET_ITEM(blocks, i)), *name = PyObject_GetItem(named, block);
        /* del index[named[block]]; named[block] = None, as Python does them (a stray name's own code may run) */
        int failed = !name || ni_setitem(t, name, NULL) < 0 || PyObject_SetItem(named, block, Py_None) < 0;
        Py_XDECREF(name);
        Py_DECREF(block);
        if (failed) return NULL;
    }
    Py_RETURN_TRUE;
}

/* index.gives(names, blocks): whether each of ``blocks`` is what the index gives its name, the same place in
   ``names`` (a sequence's kept cache hits, checked again each step it waits: CacheHits.holds). */
static PyObject *ni_gives(NameIndex *t, PyObject *args) {
    PyObject *names, *blocks;
    if (!PyArg_ParseTuple(args, "O!O!:gives", &PyList_Type, &names, &PyList_Type, &blocks)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(blocks), i = 0;
    if (PyList_GET_SIZE(names) < n) Py_RETURN_FALSE;
    for (; i < n; i++) { /* names in int64 and block ids, the engine's: read in place, no Python code runs */
        PyObject *key = PyList_GET_ITEM(names, i), *block = PyList_GET_ITEM(blocks, i);
        int64_t name;
        if (!PyLong_CheckExact(block) || !PyLong_CheckExact(key) || name_of(key, &name) != 1) break;
        if (i + AHEAD < n) prefetch_slot(t, PyList_GET_ITEM(names, i + AHEAD));
        Py_ssize_t slot = slot_of(t, name);
        if (slot < 0 || t->slots[slot].block != PyLong_AsLong(block)) {
            PyErr_Clear(); /* a block id past a long is no block of the table's */
            Py_RETURN_FALSE;
        }
    }
    if (i == n) Py_RETURN_TRUE;
    /* Else (a stray name) tuples: what its Python code might do to the lists cannot pull an item from under the
       loop. */
    PyObject *ns = PyList_GetSlice(names, 0, n), *bs = ns ? PySequence_Tuple(blocks) : NULL;
    PyObject *nt = bs ? PySequence_Tuple(ns) : NULL;
    int same = nt ? 1 : -1;
    for (; same > 0 && i < n; i++) { /* from the first stray on */
        PyObject *found = lookup(t, PyTuple_GET_ITEM(nt, i));
        same = found ? PyObject_RichCompareBool(found, PyTuple_GET_ITEM(bs, i), Py_EQ) : PyErr_Occurred() ? -1 : 0;
        Py_XDECREF(found);
    }
    Py_XDECREF(ns);
    Py_XDECREF(bs);
    Py_XDECREF(nt);
    return same < 0 ? NULL : PyBool_FromLong(same);
}

/* release_refs's and hold_refs's prefetching, read AHEAD blocks later (a table's blocks lie anywhere in the pool):
   the int of the block 2 * AHEAD on, and the places in ``counts`` and (if not NULL) ``named`` of the block AHEAD on,
   if an id in range. */
static inline void prefetch_places(PyObject *counts, PyObject *named, PyObject *blocks, Py_ssize_t i,
                                   Py_ssize_t size) {
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    if (i + 2 * AHEAD < n) __builtin_prefetch(PyList_GET_ITEM(blocks, i + 2 * AHEAD));
    Py_ssize_t b = i + AHEAD < n ? block_id(PyList_GET_ITEM(blocks, i + AHEAD), size) : -1;
    if (b < 0) return; /* read (and refused) in its turn */
    __builtin_prefetch(&((PyListObject *)counts)->ob_item[b]);
    if (named) __builtin_prefetch(&((PyListObject *)named)->ob_item[b]);
}

/* What BlockPool.release_many's Python code does: one reference to each block fewer (``counts``, the pool's
   ref_counts), block by block up to a double free (a block given twice with a count of 1 too).
   Returns (the blocks now free, how many of them are unnamed in ``named``, the position of the double free or -1),
   or None, having changed nothing, for a block id that is not an int from 0 to the lists' length or a count that
   is not an int from 0 to a C long's largest (one less than the least would overflow): the Python code then reads
   them, and raises or not, as it would. */
/* Whether the ``nargs`` arguments of ``name`` are ``n`` lists (as PyArg_ParseTuple's "O!" with PyList_Type checks
   them, at a fraction of its cost: the loops below run many times a step), else a TypeError. */
static int lists(const char *name, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n) {
    if (!arity(name, nargs, n, n)) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyList_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "%s() argument %zd must be list, not %.50s", name, i + 1,
                         Py_TYPE(args[i])->tp_name);
            return 0;
        }
    return 1;
}

static PyObject *release_refs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!lists("release_refs", args, nargs, 3)) return NULL;
    PyObject *counts = args[0], *named = args[1], *blocks = args[2];
    Py_ssize_t n = PyList_GET_SIZE(blocks), size = Py_MIN(PyList_GET_SIZE(counts), PyList_GET_SIZE(named));
    for (Py_ssize_t i = 0; i < n; i++) { /* first read every block: that runs no Python code */
        prefetch_places(counts, named, blocks, i, size);
        Py_ssize_t b = block_id(PyList_GET_ITEM(blocks, i), size);
        if (b < 0 || !PyLong_CheckExact(PyList_GET_ITEM(counts, b))) Py_RETURN_NONE;
        int overflow;
        long count = PyLong_AsLongAndOverflow(PyList_GET_ITEM(counts, b), &overflow);
        if (overflow || count < 0) Py_RETURN_NONE;
    }
    PyObject *gone = PyList_New(n); /* room for every block, its length cut to those freed (no append a block) */
    Py_ssize_t unnamed = 0, stop = -1, freed = 0;
    for (Py_ssize_t i = 0; gone && i < n; i++) {
        PyObject *block = PyList_GET_ITEM(blocks, i);
        Py_ssize_t b = PyLong_AsSsize_t(block);
        PyObject *count = PyList_GET_ITEM(counts, b);
        long left = PyLong_AsLong(count) - 1; /* read again: a block given twice is on its second release */
        if (left < 0) { /* a double free */
            stop = i;
            break;
        }
        PyObject *now = PyLong_FromLong(left);
        if (!now) Py_CLEAR(gone);
        if (!now) break;
        PyList_SET_ITEM(counts, b, now);
        Py_DECREF(count); /* an int: freeing it runs no Python code */
        if (left == 0) PyList_SET_ITEM(gone, freed++, Py_NewRef(block));
        unnamed += left == 0 && PyList_GET_ITEM(named, b) == Py_None;
    }
    if (gone) Py_SET_SIZE(gone, freed); /* the slots past it are NULL: nothing to release */
    return gone ? Py_BuildValue("(Nnn)", gone, unnamed, stop) : NULL;
}

/* What BlockPool.allocate_many's Python loop does: each of ``blocks`` (just taken from the free list or evicted) is
   held by one table, its count in ``counts`` 1. Returns False, having changed nothing, for a block id that is not
   an int from 0 to the list's length or a count that is not an int (the Python loop then reads them, and raises or
   not, as it would): freeing another object could run its own code, which could change the lists under the loop. */
static PyObject *hold_refs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!lists("hold_refs", args, nargs, 2)) return NULL;
    PyObject *counts = args[0], *blocks = args[1];
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < n; i++) {
        prefetch_places(counts, NULL, blocks, i, PyList_GET_SIZE(counts));
        Py_ssize_t b = block_id(PyList_GET_ITEM(blocks, i), PyList_GET_SIZE(counts));
        if (b < 0 || !PyLong_CheckExact(PyList_GET_ITEM(counts, b))) Py_RETURN_FALSE;
    }
    PyObject *one = PyLong_FromLong(1);
    if (!one) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t b = PyLong_AsSsize_t(PyList_GET_ITEM(blocks, i));
        PyObject *old = PyList_GET_ITEM(counts, b);
        PyList_SET_ITEM(counts, b, Py_NewRef(one));
        Py_DECREF(old); /* an int, checked: freeing it runs no Python code */
    }
    Py_DECREF(one);
    Py_RETURN_TRUE;
}

/* What the block manager's _num_held does: how many of ``blocks`` (a prompt's cache hits, read twice each time a
   waiting prompt is refused for want of blocks) some table holds, their counts in ``counts`` not 0. None for a block
   id that is not an int from 0 to the list's length or a count that is not an int (the Python code then reads
   them, and raises or not, as it would). */
static PyObject *count_held(PyObject *module, PyObject *args) {
    PyObject *counts, *blocks;
    if (!PyArg_ParseTuple(args, "O!O!:count_held", &PyList_Type, &counts, &PyList_Type, &blocks)) return NULL;
    Py_ssize_t held = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) {
        Py_ssize_t b = block_id(PyList_GET_ITEM(blocks, i), PyList_GET_SIZE(counts));
        if (b < 0 || !PyLong_CheckExact(PyList_GET_ITEM(counts, b))) Py_RETURN_NONE;
        held += PyObject_IsTrue(PyList_GET_ITEM(counts, b)); /* an int: no error possible */
    }
    return PyLong_FromSsize_t(held);
}

/* ---------------------------------------------------------------- naming a run of blocks (BlockPrompt) */

/* CPython's hash of an int in int64: its magnitude modulo 2**61 - 1 (folded, not divided), the sign kept, -1 made
   -2. */
static Py_uhash_t int_hash(int64_t v) {
    uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    m = (m & _PyHASH_MODULUS) + (m >> _PyHASH_BITS);
    m = m >= _PyHASH_MODULUS ? m - _PyHASH_MODULUS : m;
    int64_t h = v < 0 ? -(int64_t)m : (int64_t)m;
    return (Py_uhash_t)(h == -1 ? -2 : h);
}

/* CPython's hash of a pair (its tuple hash, xxHash's rounds, since 3.8), given the hashes of its two items. */
#define PRIME_1 11400714785074694791ULL
#define PRIME_2 14029467366897019727ULL
#define PRIME_5 2870177450012600261ULL
static Py_hash_t pair_hash(Py_uhash_t first, Py_uhash_t second) {
    Py_uhash_t acc = PRIME_5, lanes[2] = {first, second};
    for (int i = 0; i < 2; i++) {
        acc += lanes[i] * PRIME_2;
        acc = (acc << 31) | (acc >> 33);
        acc *= PRIME_1;
    }
    acc += 2 ^ (PRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* 1 when pair_hash is this interpreter's hash of a pair (checked once, on sample pairs); else name_inside builds the
   tuples and hashes them, as the Python loop does. */
static int pairs_hash_alike = -1;

static int check_pair_hash(void) {
    const long long samples[][2] = {{0, 0}, {-1, 7}, {LLONG_MIN, LLONG_MAX}, {-123456789012345, 2305843009213693951}};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        PyObject *pair = Py_BuildValue("(LL)", samples[i][0], samples[i][1]);
        Py_hash_t h = pair ? PyObject_Hash(pair) : -1;
        Py_XDECREF(pair);
        if (h == -1) return -1;
        if (h != pair_hash(int_hash(samples[i][0]), int_hash(samples[i][1]))) return 0;
    }
    return 1;
}

/* What BlockPrompt.name_blocks does for blocks that lie inside one of the prompt's blocks: block j (of ``size``
   tokens) inside prompt block q (of ``block`` tokens, id ids[q]) holds the run of ids from ids[q] * block - q * block
   + j * size, and is named hash((parent, that first id)), parent the name before it. Appends the names of blocks
   len(names) .. n - 1 to ``names``, up to the first that spans two prompt blocks (named by its tokens, in Python).
   A long prompt's chunk is hundreds of names a call. */
static PyObject *name_inside(PyObject *module, PyObject *args) {
    PyObject *names, *parent, *ids;
    long long block, size, n;
    if (!PyArg_ParseTuple(args, "O!OO!LLL:name_inside", &PyList_Type, &names, &parent, &PyTuple_Type, &ids, &block,
                          &size, &n))
        return NULL;
    if (block < 1 || size < 1)
        return PyErr_Format(PyExc_ValueError, "name_inside: blocks of %lld and %lld tokens", block, size);
    /* Blocks of over 2**31 tokens are left to the Python loop: (q + 1) * block could pass a long long. */
    if (block > INT32_MAX || size > INT32_MAX) Py_RETURN_NONE;
    if (pairs_hash_alike < 0 && (pairs_hash_alike = check_pair_hash()) < 0) return NULL;
    Py_hash_t h = PyObject_Hash(parent);
    if (h == -1) return NULL;
    Py_INCREF(parent);
    for (long long j = PyList_GET_SIZE(names); j < n && !PyErr_Occurred();) {
        long long q = j * size / block, inside = Py_MIN(n, (q + 1) * block / size); /* j .. inside - 1 lie in q */
        if (inside <= j) break; /* j spans two */
        if (q >= PyTuple_GET_SIZE(ids)) break; /* past the prompt: left to the Python loop, which raises IndexError */
        long long id = PyLong_AsLongLong(PyTuple_GET_ITEM(ids, q));
        if (id < 0 || id > LLONG_MAX / block - 1) { /* BlockPrompt's bound: its tokens' ids stay in int64 */
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "name_inside: an id outside the prompt's");
            break;
        }
        for (long long first = id * block - q * block + j * size; j < inside; j++, first += size) {
            if (pairs_hash_alike) {
                h = pair_hash((Py_uhash_t)h, int_hash(first));
            } else {
                PyObject *pair = Py_BuildValue("(OL)", parent, first);
                h = pair ? PyObject_Hash(pair) : -1;
                Py_XDECREF(pair);
                if (h == -1) break;
            }
            Py_DECREF(parent);
            parent = PyLong_FromSsize_t(h);
            if (!parent || PyList_Append(names, parent) < 0) break;
            h = int_hash(h); /* the next pair's first item: this name, an int */
        }
    }
    Py_XDECREF(parent);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the module */

static PyMappingMethods ni_mapping = {
    .mp_length = (lenfunc)ni_len,
    .mp_subscript = (binaryfunc)ni_getitem,
    .mp_ass_subscript = (objobjargproc)ni_setitem,
};
static PySequenceMethods ni_sequence = {.sq_contains = (objobjproc)ni_contains};
static PyMethodDef ni_methods[] = {
    {"get", (PyCFunction)(void (*)(void))ni_get, METH_FASTCALL, "get(name, default=None), as dict.get"},
    {"setdefault", (PyCFunction)(void (*)(void))ni_setdefault, METH_FASTCALL,
     "setdefault(name, block): the block stored under name, block if none was"},
    {"items", (PyCFunction)ni_items, METH_NOARGS, "a list of (name, block) pairs"},
    {"keys", (PyCFunction)ni_keys, METH_NOARGS, "a list of the names (so that dict(index) copies it)"},
    {"__reduce__", (PyCFunction)ni_reduce, METH_NOARGS, NULL},
    {"gives", (PyCFunction)ni_gives, METH_VARARGS, "gives(names, blocks): whether each name gives its block"},
    {NULL},
};
static PyTypeObject NameIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvsched.allocators._nameindex.NameIndex",
    .tp_doc = "NameIndex(num_blocks, pairs=()): block names (ints) to block ids, as a dict",
    .tp_basicsize = sizeof(NameIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ni_new,
    .tp_dealloc = (destructor)ni_dealloc,
    .tp_traverse = (traverseproc)ni_traverse,
    .tp_clear = (inquiry)ni_clear,
    .tp_repr = (reprfunc)ni_repr,
    .tp_as_mapping = &ni_mapping,
    .tp_as_sequence = &ni_sequence,
    .tp_iter = (getiterfunc)ni_iter,
    .tp_richcompare = ni_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_methods = ni_methods,
};
static PyMethodDef module_methods[] = {
    {"register_names", register_names, METH_VARARGS,
     "register_names(index, named, blocks, hashes, keep, duplicates): BlockPool.register's loop"},
    {"forget_names", forget_names, METH_VARARGS, "forget_names(index, named, blocks): BlockPool.forget's loop"},
    {"release_refs", (PyCFunction)(void (*)(void))release_refs, METH_FASTCALL,
     "release_refs(counts, named, blocks): BlockPool.release_many's loop; (freed, unnamed among them, stop)"},
    {"hold_refs", (PyCFunction)(void (*)(void))hold_refs, METH_FASTCALL, "hold_refs(counts, blocks): BlockPool.allocate_many's loop (False: not)"},
    {"count_held", count_held, METH_VARARGS, "count_held(counts, blocks): the blocks whose count is not 0, or None"},
    {"name_inside", name_inside, METH_VARARGS,
     "name_inside(names, parent, ids, block, size, n): BlockPrompt.name_blocks's loop, up to a block that spans two"},
    {NULL},
};
static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvsched.allocators._nameindex", "The prefix cache's index in C", -1, module_methods,
};

PyMODINIT_FUNC PyInit__nameindex(void) {
    if (PyType_Ready(&NameIndexType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&NameIndexType);
    if (PyModule_AddObject(m, "NameIndex", (PyObject *)&NameIndexType) < 0) {
        Py_DECREF(&NameIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
