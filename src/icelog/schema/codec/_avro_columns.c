/*
 * icelog.schema.codec._avro_columns: Avro binary datums → Arrow column buffers, in one pass, without building a
 * Python object per value.
 *
 * decode(program, bodies) decodes every body (bytes, one datum each, no envelope) with the writer schema that
 * `program` describes and returns, per program node, the buffers of the Arrow array of that node's values:
 * (length, null_count, validity, data, offsets) where validity is an Arrow bitmap (None if no value is null),
 * data the fixed-width values (a bitmap for booleans, int32 enum indices) or the bytes of strings, and offsets
 * int32 (strings, bytes, arrays; else None). icelog/schema/codec/avro_columns.py builds the program from the
 * schema and the Arrow arrays from the buffers.
 *
 * It answers only for a batch it can prove ordinary: every body one datum using every byte, in the canonical
 * encoding fastavro (and Java's Avro) writes (minimal varints, booleans 0 or 1, each array in one block, no
 * NaN, strict UTF-8), so that re-encoding a row gives the body back byte for byte. Anything else raises
 * ValueError and the caller decodes the batch with fastavro, row by row where needed: this module never has to
 * be right about a datum it is unsure of.
 *
 * Program: a tuple of nodes, node 0 the root; each node is (kind, arg, arg2, children): kind as below; arg the
 * enum's symbol count, the fixed's size (FIXED, DECIMAL_FIXED), the null branch's index (NULLABLE), the null
 * branch's index + 1 or 0 without one (UNION), a decimal's precision (DECIMAL_BYTES); arg2 a DECIMAL_FIXED's
 * precision; children a tuple of node indices: a record's fields in order, an array's items, a map's key (a
 * STRING node) and value, a nullable union's non-null branch, a union's non-null branches in order.
 *
 * Extra buffers: a UNION's data is the chosen branch per value (int8, its position among `children`); its
 * branches hold a null wherever another was chosen. A map's entries are its key and value nodes' values, its
 * offsets count entries. Decimals are 16-byte little-endian two's complement (Arrow's decimal128); a uuid on a
 * 16-byte fixed is its 36-character text (a string's offsets and data).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../_c/column_buffers.h"
#include "../../_c/utf8.h"

enum { K_BOOLEAN, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_STRING, K_BYTES, K_ENUM, K_FIXED, K_ARRAY, K_RECORD,
       K_NULLABLE, K_MAP, K_UNION, K_DECIMAL_BYTES, K_DECIMAL_FIXED, K_UUID_FIXED, K_KINDS };

#define MAX_MAP_ENTRIES 64 /* a map's keys are checked for duplicates pairwise; a bigger map goes to fastavro */

#define MAX_NODES 4096
#define MAX_DEPTH 64

typedef struct {
    int kind;
    long long arg, arg2;
    Py_ssize_t nchildren;
    int *children;
    Py_ssize_t length, nulls;
    buffer validity; /* one bit per value, grown a byte at a time */
    buffer data;
    buffer offsets; /* int32, starting with 0 (strings, bytes, arrays) */
} node;

typedef struct {
    node *nodes;
    Py_ssize_t count;
    char why[160];
} decoder;

static int put_offset(node *n, Py_ssize_t value)
{
    if (value > INT32_MAX)
        return -2; /* past Arrow's int32 offsets: not this module's batch */
    int32_t v = (int32_t)value;
    return put(&n->offsets, &v, sizeof v);
}

/* How many values a node holds (a nullable union's are its branch's). */
static Py_ssize_t values_of(const decoder *d, int index)
{
    while (d->nodes[index].kind == K_NULLABLE)
        index = d->nodes[index].children[0];
    return d->nodes[index].length;
}

static int unsure(decoder *d, const char *why)
{
    snprintf(d->why, sizeof d->why, "%s", why);
    return UNSURE;
}

/* A canonical zigzag varint of at most `max_bytes` bytes (5: int, 10: long). */
static int read_zigzag(decoder *d, const uint8_t **p, const uint8_t *end, int max_bytes, int64_t *out)
{
    const uint8_t *s = *p;
    uint64_t raw = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (s >= end)
            return unsure(d, "a varint runs past the datum's end");
        uint8_t byte = *s++;
        raw |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            if (i > 0 && byte == 0)
                return unsure(d, "a varint is not in its shortest form");
            if (max_bytes == 10 && i == 9 && byte > 1)
                return unsure(d, "a varint overflows 64 bits");
            int64_t value = (int64_t)((raw >> 1) ^ (0 - (raw & 1)));
            if (max_bytes == 5 && (value < INT32_MIN || value > INT32_MAX))
                return unsure(d, "an int overflows 32 bits");
            *out = value;
            *p = s;
            return 0;
        }
    }
    return unsure(d, "a varint is too long");
}

static int valid(node *n, int bit)
{
    if (put_bit(&n->validity, n->length, bit) < 0)
        return NOMEM;
    if (!bit)
        n->nulls++;
    n->length++;
    return 0;
}

/* Appends a null: a zero value (fixed width), an empty entry (offsets), nulls in every field (record). */
static int put_null(decoder *d, int index)
{
    node *n = &d->nodes[index];
    int rc;
    switch (n->kind) {
    case K_BOOLEAN:
        if (put_bit(&n->data, n->length, 0) < 0)
            return NOMEM;
        break;
    case K_INT:
    case K_FLOAT:
    case K_ENUM: {
        uint32_t zero = 0;
        if (put(&n->data, &zero, 4) < 0)
            return NOMEM;
        break;
    }
    case K_LONG:
    case K_DOUBLE: {
        uint64_t zero = 0;
        if (put(&n->data, &zero, 8) < 0)
            return NOMEM;
        break;
    }
    case K_FIXED:
        if (grow(&n->data, (Py_ssize_t)n->arg) < 0)
            return NOMEM;
        memset(n->data.p + n->data.len, 0, (size_t)n->arg);
        n->data.len += (Py_ssize_t)n->arg;
        break;
    case K_DECIMAL_BYTES:
    case K_DECIMAL_FIXED: {
        uint8_t zero[16] = {0};
        if (put(&n->data, zero, 16) < 0)
            return NOMEM;
        break;
    }
    case K_STRING:
    case K_BYTES:
    case K_UUID_FIXED:
        if ((rc = put_offset(n, n->data.len)) < 0)
            return rc == -2 ? unsure(d, "a column holds over 2 GiB") : NOMEM;
        break;
    case K_ARRAY:
    case K_MAP:
        if ((rc = put_offset(n, values_of(d, n->children[n->kind == K_MAP]))) < 0)
            return rc == -2 ? unsure(d, "a list holds over 2^31 values") : NOMEM;
        break;
    case K_UNION: {
        int8_t none = -1;
        if (put(&n->data, &none, 1) < 0)
            return NOMEM;
        for (Py_ssize_t c = 0; c < n->nchildren; c++)
            if ((rc = put_null(d, n->children[c])) < 0)
                return rc;
        break;
    }
    case K_RECORD:
        for (Py_ssize_t c = 0; c < n->nchildren; c++)
            if ((rc = put_null(d, n->children[c])) < 0)
                return rc;
        break;
    default: /* K_NULLABLE inside K_NULLABLE is refused when the program is read */
        return put_null(d, n->children[0]);
    }
    return n->kind == K_NULLABLE ? 0 : valid(n, 0);
}

/* A decimal: big-endian two's complement (a length-prefixed bytes or a fixed), at most 16 bytes, in its
 * shortest form for bytes (as the encoder writes it back), within its precision; stored as Arrow's decimal128. */
static int read_decimal(decoder *d, node *n, const uint8_t **p, const uint8_t *end)
{
    const uint8_t *s = *p;
    int64_t length = n->arg;
    int precision = (int)(n->kind == K_DECIMAL_BYTES ? n->arg : n->arg2);
    int rc;
    if (n->kind == K_DECIMAL_BYTES && (rc = read_zigzag(d, &s, end, 10, &length)) < 0)
        return rc;
    if (length < 1 || length > 16 || length > end - s)
        return unsure(d, "a decimal of no bytes, over 16 bytes, or running past the datum's end");
    __int128 value = (s[0] & 0x80) ? -1 : 0;
    for (int64_t i = 0; i < length; i++)
        value = (__int128)(((unsigned __int128)value << 8) | s[i]);
    if (n->kind == K_DECIMAL_BYTES) {
        unsigned __int128 magnitude = (unsigned __int128)(value < 0 ? ~value : value);
        int bits = 0;
        while (magnitude) {
            bits++;
            magnitude >>= 1;
        }
        if (bits / 8 + 1 != length)
            return unsure(d, "a decimal's bytes are not in their shortest form");
    }
    unsigned __int128 limit = 1;
    for (int i = 0; i < precision; i++)
        limit *= 10;
    unsigned __int128 absolute = value < 0 ? (unsigned __int128)0 - (unsigned __int128)value : (unsigned __int128)value;
    if (absolute >= limit)
        return unsure(d, "a decimal has more digits than its precision");
    uint8_t little[16];
    for (int i = 0; i < 16; i++)
        little[i] = (uint8_t)((unsigned __int128)value >> (8 * i));
    if (put(&n->data, little, 16) < 0)
        return NOMEM;
    *p = s + length;
    return 0;
}

static int read_value(decoder *d, int index, const uint8_t **p, const uint8_t *end, int depth)
{
    node *n = &d->nodes[index];
    const uint8_t *s = *p;
    int64_t v;
    int rc;
    if (depth > MAX_DEPTH)
        return unsure(d, "values nest too deep");
    switch (n->kind) {
    case K_BOOLEAN:
        if (s >= end)
            return unsure(d, "a boolean runs past the datum's end");
        if (*s > 1)
            return unsure(d, "a boolean is neither 0 nor 1");
        if (put_bit(&n->data, n->length, *s) < 0)
            return NOMEM;
        s++;
        break;
    case K_INT:
    case K_ENUM: {
        if ((rc = read_zigzag(d, &s, end, 5, &v)) < 0)
            return rc;
        if (n->kind == K_ENUM && (v < 0 || v >= n->arg))
            return unsure(d, "an enum index is out of range");
        int32_t value = (int32_t)v;
        if (put(&n->data, &value, 4) < 0)
            return NOMEM;
        break;
    }
    case K_LONG:
        if ((rc = read_zigzag(d, &s, end, 10, &v)) < 0)
            return rc;
        if (put(&n->data, &v, 8) < 0)
            return NOMEM;
        break;
    case K_FLOAT: {
        float value;
        if (end - s < 4)
            return unsure(d, "a float runs past the datum's end");
        memcpy(&value, s, 4);
        if (isnan(value))
            return unsure(d, "a NaN float (its bits may not survive the row)");
        if (put(&n->data, s, 4) < 0)
            return NOMEM;
        s += 4;
        break;
    }
    case K_DOUBLE: {
        double value;
        if (end - s < 8)
            return unsure(d, "a double runs past the datum's end");
        memcpy(&value, s, 8);
        if (isnan(value))
            return unsure(d, "a NaN double (its bits may not survive the row)");
        if (put(&n->data, s, 8) < 0)
            return NOMEM;
        s += 8;
        break;
    }
    case K_STRING:
    case K_BYTES:
        if ((rc = read_zigzag(d, &s, end, 10, &v)) < 0)
            return rc;
        if (v < 0 || v > end - s)
            return unsure(d, "a string's length is negative or runs past the datum's end");
        if (n->kind == K_STRING && !valid_utf8(s, (Py_ssize_t)v))
            return unsure(d, "a string is not UTF-8");
        if (put(&n->data, s, (Py_ssize_t)v) < 0)
            return NOMEM;
        s += v;
        if ((rc = put_offset(n, n->data.len)) < 0)
            return rc == -2 ? unsure(d, "a column holds over 2 GiB") : NOMEM;
        break;
    case K_FIXED:
        if (end - s < n->arg)
            return unsure(d, "a fixed runs past the datum's end");
        if (put(&n->data, s, (Py_ssize_t)n->arg) < 0)
            return NOMEM;
        s += n->arg;
        break;
    case K_UUID_FIXED: {
        static const char hex[] = "0123456789abcdef";
        char text[36];
        if (end - s < 16)
            return unsure(d, "a uuid runs past the datum's end");
        for (int i = 0, t = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10)
                text[t++] = '-';
            text[t++] = hex[s[i] >> 4];
            text[t++] = hex[s[i] & 15];
        }
        if (put(&n->data, text, 36) < 0)
            return NOMEM;
        s += 16;
        if ((rc = put_offset(n, n->data.len)) < 0)
            return rc == -2 ? unsure(d, "a column holds over 2 GiB") : NOMEM;
        break;
    }
    case K_DECIMAL_BYTES:
    case K_DECIMAL_FIXED:
        if ((rc = read_decimal(d, n, &s, end)) < 0)
            return rc;
        break;
    case K_MAP: {
        int64_t count;
        node *keys = &d->nodes[n->children[0]];
        if ((rc = read_zigzag(d, &s, end, 10, &count)) < 0)
            return rc;
        if (count < 0)
            return unsure(d, "a map block with its size (not how fastavro writes it)");
        if (count > MAX_MAP_ENTRIES)
            return unsure(d, "a map of over 64 entries");
        Py_ssize_t first = keys->length;
        for (int64_t i = 0; i < count; i++) {
            if ((rc = read_value(d, n->children[0], &s, end, depth + 1)) < 0)
                return rc;
            if ((rc = read_value(d, n->children[1], &s, end, depth + 1)) < 0)
                return rc;
        }
        const int32_t *at = (const int32_t *)keys->offsets.p;
        for (Py_ssize_t a = first; a < keys->length; a++)
            for (Py_ssize_t b = a + 1; b < keys->length; b++)
                if (at[a + 1] - at[a] == at[b + 1] - at[b] &&
                    (at[a + 1] == at[a] ||
                     memcmp(keys->data.p + at[a], keys->data.p + at[b], (size_t)(at[a + 1] - at[a])) == 0))
                    return unsure(d, "a map with a key twice (fastavro keeps the last)");
        if (count > 0) {
            int64_t more;
            if ((rc = read_zigzag(d, &s, end, 10, &more)) < 0)
                return rc;
            if (more != 0)
                return unsure(d, "a map in several blocks (not how fastavro writes it)");
        }
        if ((rc = put_offset(n, values_of(d, n->children[1]))) < 0)
            return rc == -2 ? unsure(d, "a map holds over 2^31 entries") : NOMEM;
        break;
    }
    case K_UNION: {
        long long null_branch = n->arg - 1;
        if ((rc = read_zigzag(d, &s, end, 10, &v)) < 0)
            return rc;
        if (v < 0 || v >= n->nchildren + (null_branch >= 0))
            return unsure(d, "a union branch index is out of range");
        if (v == null_branch) {
            if ((rc = put_null(d, index)) < 0)
                return rc;
            *p = s;
            return 0;
        }
        int8_t chosen = (int8_t)(null_branch >= 0 && v > null_branch ? v - 1 : v);
        if (put(&n->data, &chosen, 1) < 0)
            return NOMEM;
        for (Py_ssize_t c = 0; c < n->nchildren; c++) {
            rc = c == chosen ? read_value(d, n->children[c], &s, end, depth + 1) : put_null(d, n->children[c]);
            if (rc < 0)
                return rc;
        }
        break;
    }
    case K_ARRAY: {
        int64_t count;
        if ((rc = read_zigzag(d, &s, end, 10, &count)) < 0)
            return rc;
        if (count < 0)
            return unsure(d, "an array block with its size (not how fastavro writes it)");
        if (count > end - s)
            return unsure(d, "an array holds more items than the datum has bytes");
        for (int64_t i = 0; i < count; i++)
            if ((rc = read_value(d, n->children[0], &s, end, depth + 1)) < 0)
                return rc;
        if (count > 0) {
            int64_t more;
            if ((rc = read_zigzag(d, &s, end, 10, &more)) < 0)
                return rc;
            if (more != 0)
                return unsure(d, "an array in several blocks (not how fastavro writes it)");
        }
        if ((rc = put_offset(n, values_of(d, n->children[0]))) < 0)
            return rc == -2 ? unsure(d, "a list holds over 2^31 values") : NOMEM;
        break;
    }
    case K_RECORD:
        for (Py_ssize_t c = 0; c < n->nchildren; c++)
            if ((rc = read_value(d, n->children[c], &s, end, depth + 1)) < 0)
                return rc;
        break;
    case K_NULLABLE:
        if ((rc = read_zigzag(d, &s, end, 10, &v)) < 0)
            return rc;
        if (v != 0 && v != 1)
            return unsure(d, "a union branch index is out of range");
        if (v == n->arg)
            rc = put_null(d, n->children[0]);
        else
            rc = read_value(d, n->children[0], &s, end, depth + 1);
        if (rc < 0)
            return rc;
        *p = s;
        return 0; /* the branch's node holds the value and its validity */
    }
    *p = s;
    return valid(n, 1);
}

static void release(decoder *d)
{
    for (Py_ssize_t i = 0; i < d->count; i++) {
        PyMem_Free(d->nodes[i].children);
        PyMem_Free(d->nodes[i].validity.p);
        PyMem_Free(d->nodes[i].data.p);
        PyMem_Free(d->nodes[i].offsets.p);
    }
    PyMem_Free(d->nodes);
}

/* Reads the program; -1 with a Python exception set if it is malformed (a bug of avro_columns.py). */
static int read_program(decoder *d, PyObject *program)
{
    if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) < 1 || PyTuple_GET_SIZE(program) > MAX_NODES) {
        PyErr_SetString(PyExc_TypeError, "program: a tuple of 1 to 4096 nodes");
        return -1;
    }
    d->count = PyTuple_GET_SIZE(program);
    d->nodes = PyMem_Calloc((size_t)d->count, sizeof(node));
    if (d->nodes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->count; i++) {
        node *n = &d->nodes[i];
        PyObject *children;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(program, i), "iLLO!", &n->kind, &n->arg, &n->arg2, &PyTuple_Type,
                              &children))
            return -1;
        n->nchildren = PyTuple_GET_SIZE(children);
        int needs = n->kind == K_ARRAY || n->kind == K_NULLABLE ? 1 : n->kind == K_MAP ? 2
                    : n->kind == K_RECORD || n->kind == K_UNION ? -1 : 0;
        if (n->kind < 0 || n->kind >= K_KINDS || (needs >= 0 && n->nchildren != needs) || n->arg < 0 ||
            (n->kind == K_FIXED && n->arg > INT32_MAX) || (n->kind == K_NULLABLE && n->arg > 1) ||
            (n->kind == K_UNION && (n->nchildren < 1 || n->nchildren > 100 || n->arg > n->nchildren + 1)) ||
            (n->kind == K_DECIMAL_BYTES && (n->arg < 1 || n->arg > 38)) ||
            (n->kind == K_DECIMAL_FIXED && (n->arg2 < 1 || n->arg2 > 38))) {
            PyErr_Format(PyExc_ValueError, "program node %zd is malformed", i);
            return -1;
        }
        n->children = PyMem_Calloc((size_t)(n->nchildren ? n->nchildren : 1), sizeof(int));
        if (n->children == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t c = 0; c < n->nchildren; c++) {
            long child = PyLong_AsLong(PyTuple_GET_ITEM(children, c));
            /* children come after their parent: the program is a tree, never a cycle */
            if (child <= i || child >= d->count) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "program node %zd: child %ld is not a later node", i, child);
                return -1;
            }
            n->children[c] = (int)child;
        }
        if (n->kind == K_STRING || n->kind == K_BYTES || n->kind == K_ARRAY || n->kind == K_MAP ||
            n->kind == K_UUID_FIXED) {
            int32_t zero = 0;
            if (put(&n->offsets, &zero, 4) < 0) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    for (Py_ssize_t i = 0; i < d->count; i++) {
        node *n = &d->nodes[i];
        if ((n->kind == K_NULLABLE && d->nodes[n->children[0]].kind == K_NULLABLE) ||
            (n->kind == K_MAP && d->nodes[n->children[0]].kind != K_STRING)) {
            PyErr_Format(PyExc_ValueError, "program node %zd: a nullable of a nullable, or a map's key not a string", i);
            return -1;
        }
    }
    return 0;
}

static PyObject *decode(PyObject *self, PyObject *args)
{
    PyObject *program, *bodies, *result = NULL;
    if (!PyArg_ParseTuple(args, "OO!", &program, &PyList_Type, &bodies))
        return NULL;
    decoder d = {0};
    if (read_program(&d, program) < 0)
        goto done;
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *s, *end;
        if (body_bytes(PyList_GET_ITEM(bodies, i), i, "", 0, &s, &end) < 0)
            goto done;
        int rc = read_value(&d, 0, &s, end, 0);
        if (rc == 0 && s != end)
            rc = unsure(&d, "bytes after the datum");
        if (rc < 0) {
            body_failed(rc, i, d.why);
            goto done;
        }
    }
    result = PyTuple_New(d.count);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < d.count; i++) {
        node *n = &d.nodes[i];
        PyObject *item = node_buffers(n->length, n->nulls, &n->validity, &n->data, &n->offsets);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, i, item);
    }
done:
    release(&d);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(program, bodies) -> per node (length, null_count, validity, data, offsets)\n\nDecode Avro binary "
     "datums into Arrow buffers; ValueError for a batch that is not plainly canonical (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro_columns", "Avro datums to Arrow buffers (see icelog.schema.codec.avro_columns).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__avro_columns(void)
{
    return PyModule_Create(&module);
}
