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
