/* Shared by icelog's column decoders (_avro_columns.c, _proto_columns.c): growable buffers that become the
 * buffers of Arrow arrays (pa.Array.from_buffers), and the decoders' return codes. */
#ifndef ICELOG_COLUMN_BUFFERS_H
#define ICELOG_COLUMN_BUFFERS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NOMEM (-1)  /* out of memory: MemoryError */
#define UNSURE (-2) /* a batch the decoder is not sure of: ValueError, and the caller takes the Python path */

typedef struct {
    uint8_t *p;
    Py_ssize_t len, cap;
} buffer;

static inline int grow(buffer *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2)
            return -1;
        cap *= 2;
    }
    uint8_t *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(buffer *b, const void *src, Py_ssize_t n)
{
    if (n == 0)
        return 0; /* (an empty buffer has no pointer yet) */
    if (grow(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int put_zeros(buffer *b, Py_ssize_t n)
{
    if (n == 0)
        return 0;
    if (grow(b, n) < 0)
        return -1;
    memset(b->p + b->len, 0, (size_t)n);
    b->len += n;
    return 0;
}

/* Appends one bit (bit i of a bitmap of i + 1 bits). */
static inline int put_bit(buffer *b, Py_ssize_t i, int bit)
{
    if ((i & 7) == 0) {
        uint8_t zero = 0;
        if (put(b, &zero, 1) < 0)
            return -1;
    }
    if (bit)
        b->p[i >> 3] |= (uint8_t)(1u << (i & 7));
    return 0;
}

static inline PyObject *bytes_of(buffer *b)
{
    return PyBytes_FromStringAndSize(b->len ? (const char *)b->p : "", b->len);
}

/* The bytes of body `i` of a batch after `head` (the batch's envelope, which every body must start with; "" for
 * none) in [*start, *end): 0, or -1 with ValueError (a null body, or one without the envelope: the caller's Python
 * path takes such a batch) or TypeError (not bytes) set. */
static inline int body_bytes(PyObject *body, Py_ssize_t i, const char *head, Py_ssize_t head_len,
                             const uint8_t **start, const uint8_t **end)
{
    if (body == Py_None) {
        PyErr_Format(PyExc_ValueError, "body %zd is null", i);
        return -1;
    }
    if (!PyBytes_Check(body)) {
        PyErr_Format(PyExc_TypeError, "body %zd is not bytes", i);
        return -1;
    }
    const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(body);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    if (size < head_len || (head_len > 0 && memcmp(s, head, (size_t)head_len) != 0)) {
        PyErr_Format(PyExc_ValueError, "body %zd does not start with the batch's envelope", i);
        return -1;
    }
    *start = s + head_len;
    *end = s + size;
    return 0;
}

/* Sets the exception of body `i` that failed with `rc`: MemoryError (NOMEM), or ValueError with why (UNSURE). */
static inline void body_failed(int rc, Py_ssize_t i, const char *why)
{
    if (rc == NOMEM)
        PyErr_NoMemory();
    else
        PyErr_Format(PyExc_ValueError, "body %zd: %s", i, why);
}

/* One node's answer: (length, null_count, validity or None when no value is null, data, offsets or None). */
static inline PyObject *node_buffers(Py_ssize_t length, Py_ssize_t nulls, buffer *validity, buffer *data,
                                     buffer *offsets)
{
    PyObject *bitmap = nulls ? bytes_of(validity) : Py_NewRef(Py_None);
    PyObject *values = bytes_of(data);
    PyObject *ends = offsets->len ? bytes_of(offsets) : Py_NewRef(Py_None);
    PyObject *item = NULL;
    if (bitmap != NULL && values != NULL && ends != NULL)
        item = Py_BuildValue("(nnOOO)", length, nulls, bitmap, values, ends);
    Py_XDECREF(bitmap);
    Py_XDECREF(values);
    Py_XDECREF(ends);
    return item;
}

#endif
