/*
 * icelog.schema.codec._proto_columns: Protobuf messages (wire format) → Arrow column buffers, in one pass, without
 * building a Python message object per record.
 *
 * decode(program, bodies, head=b"") decodes every body (bytes: `head`, the batch's envelope, which every body must
 * start with, then one message) with the message that `program` describes and returns, per program node, the
 * buffers of the Arrow array of that node's values: (length, null_count, validity, data, offsets) where validity is an Arrow bitmap (None if no value is null),
 * data the fixed-width values (a bitmap for bools) or the bytes of strings, and offsets int32 (strings, bytes,
 * lists; else None). icelog/schema/codec/proto_columns.py builds the program from the message descriptor and the
 * Arrow arrays from the buffers.
 *
 * It answers only for a batch whose every body is exactly what upb's SerializeToString writes for the message it
 * parses to, so that dropping `__raw__` for such a row is as safe as the Python path's re-serialization check, and
 * whose values are exactly what upb reads: every field known and of its wire type, fields in field-number order
 * (a repeated field's unpacked elements next to each other), no singular field twice, no two members of one
 * oneof, minimal varints, an int32 or enum varint that is a sign-extended 32-bit value, a uint32 or sint32 varint
 * of 32 bits, bools 0 or 1, no NaN, strict UTF-8 strings, packed repeated scalars in one non-empty chunk exactly
 * where the field is packed, no implicit-presence scalar written with its default value (upb omits those), a
 * closed enum's number among its values (upb files any other as an unknown field), every required field present,
 * a Timestamp or Duration whose microseconds fit 64 bits. Anything else raises ValueError and the caller parses
 * the batch with upb as before: this module never has to be right about a message it is unsure of.
 *
 * Program: a tuple of nodes, node 0 the root message; each node is (kind, number, flags, oneof, children, enums):
 * kind as below; number the field number (0 for the root and a list's element); flags F_*; oneof the index of
 * the real oneof the field belongs to in its message (-1: none); children a tuple of node indices (a message's
 * fields in field-number order, a list's element); enums a closed enum's numbers in increasing order (else ()).
 *
 * Values: int32, sint32, sfixed32 and enum numbers as int32; uint32 and fixed32 (zero-extended), int64, sint64,
 * sfixed64, Timestamp and Duration (microseconds: seconds * 10^6 + floor(nanos / 1000)) as int64; uint64 and
 * fixed64 as uint64; float, double; bool as a bitmap. A message's buffers hold only its validity (its fields are
 * its children's). An absent field is null if it has presence (messages, proto3 `optional`, oneof members, proto2
 * fields), an empty list if repeated, else its default (0, false, "", the enum's 0).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../_c/column_buffers.h"
#include "../../_c/utf8.h"

enum { K_INT32, K_SINT32, K_SFIXED32, K_UINT32, K_FIXED32, K_INT64, K_SINT64, K_SFIXED64, K_UINT64, K_FIXED64,
       K_FLOAT, K_DOUBLE, K_BOOL, K_STRING, K_BYTES, K_ENUM, K_MESSAGE, K_TIMESTAMP, K_LIST, K_KINDS };

enum { F_PRESENCE = 1, F_PACKED = 2, F_CLOSED = 4, F_REQUIRED = 8, F_ALL = 15 };

enum { W_VARINT = 0, W_I64 = 1, W_LEN = 2, W_I32 = 5 };

#define MAX_NODES 4096
#define MAX_DEPTH 64
#define MAX_ONEOFS 64

typedef struct {
    int kind;
    uint32_t number;
    int flags;
    int oneof;
    Py_ssize_t nchildren;
    int *children;
    Py_ssize_t nenums;
    int32_t *enums; /* a closed enum's numbers, increasing */
    Py_ssize_t length, nulls;
    buffer validity; /* one bit per value, grown a byte at a time */
    buffer data;
    buffer offsets; /* int32, starting with 0 (strings, bytes, lists) */
} node;

typedef struct {
    node *nodes;
    Py_ssize_t count;
    char why[160];
} decoder;

static int unsure(decoder *d, const char *why)
{
    snprintf(d->why, sizeof d->why, "%s", why);
    return UNSURE;
}

static int put_offset(decoder *d, node *n, Py_ssize_t value)
{
    if (value > INT32_MAX)
        return unsure(d, "a column holds over 2 GiB or a list over 2^31 values");
    int32_t v = (int32_t)value;
    return put(&n->offsets, &v, sizeof v) < 0 ? NOMEM : 0;
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

/* Bytes of a fixed-width value in the data buffer (0: a bitmap, offsets, or nothing). */
static int width_of(int kind)
{
    switch (kind) {
    case K_INT32:
    case K_SINT32:
    case K_SFIXED32:
    case K_ENUM:
    case K_FLOAT:
        return 4;
    case K_UINT32:
    case K_FIXED32:
    case K_INT64:
    case K_SINT64:
    case K_SFIXED64:
    case K_UINT64:
    case K_FIXED64:
    case K_DOUBLE:
    case K_TIMESTAMP:
        return 8;
    default:
        return 0;
    }
}

static int wire_of(int kind)
{
    switch (kind) {
    case K_SFIXED64:
    case K_FIXED64:
    case K_DOUBLE:
        return W_I64;
    case K_SFIXED32:
    case K_FIXED32:
    case K_FLOAT:
        return W_I32;
    case K_STRING:
    case K_BYTES:
    case K_MESSAGE:
    case K_TIMESTAMP:
    case K_LIST:
        return W_LEN;
    default:
        return W_VARINT;
    }
}

/* A value of `n`'s kind that is all zero bits: 0, false, "", an empty list; `is_valid` 0 makes it a null. */
static int put_zero(decoder *d, node *n, int is_valid)
{
    int width = width_of(n->kind);
    int rc;
    if (width > 0) {
        if (put_zeros(&n->data, width) < 0)
            return NOMEM;
    } else if (n->kind == K_BOOL) {
        if (put_bit(&n->data, n->length, 0) < 0)
            return NOMEM;
    } else if (n->kind == K_STRING || n->kind == K_BYTES) {
        if ((rc = put_offset(d, n, n->data.len)) < 0)
            return rc;
    } else if (n->kind == K_LIST) {
        if ((rc = put_offset(d, n, d->nodes[n->children[0]].length)) < 0)
            return rc;
    }
    return valid(n, is_valid);
}

/* Appends a null: zero bits (fixed width), an empty entry (offsets), nulls in every field (message). */
static int put_null(decoder *d, int index)
{
    node *n = &d->nodes[index];
    if (n->kind == K_MESSAGE) {
        int rc;
        for (Py_ssize_t c = 0; c < n->nchildren; c++)
            if ((rc = put_null(d, n->children[c])) < 0)
                return rc;
    }
    return put_zero(d, n, 0);
}

/* A field its message does not hold: null with presence, an empty list if repeated, else its default. */
static int put_absent(decoder *d, int index)
{
    node *n = &d->nodes[index];
    if (n->flags & F_REQUIRED)
        return unsure(d, "a required field is missing (upb would not serialize the message)");
    if (n->kind == K_LIST)
        return put_zero(d, n, 1);
    if ((n->flags & F_PRESENCE) || n->kind == K_MESSAGE || n->kind == K_TIMESTAMP)
        return put_null(d, index);
    return put_zero(d, n, 1);
}

/* A minimal varint of at most 10 bytes (of at most 64 bits). */
static int read_varint(decoder *d, const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    const uint8_t *s = *p;
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (s >= end)
            return unsure(d, "a varint runs past its message's end");
        uint8_t byte = *s++;
        value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            if (i > 0 && byte == 0)
                return unsure(d, "a varint is not in its shortest form");
            if (i == 9 && byte > 1)
                return unsure(d, "a varint overflows 64 bits");
            *out = value;
            *p = s;
            return 0;
        }
    }
    return unsure(d, "a varint is over 10 bytes");
}

/* A length-delimited value's length: its bytes are [*p, *p + length) after the call. */
static int read_length(decoder *d, const uint8_t **p, const uint8_t *end, Py_ssize_t *out)
{
    uint64_t length;
    int rc = read_varint(d, p, end, &length);
    if (rc < 0)
        return rc;
    if (length > (uint64_t)(end - *p))
        return unsure(d, "a length runs past its message's end");
    *out = (Py_ssize_t)length;
    return 0;
}

static uint32_t load32(const uint8_t *s)
{
    return (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24;
}

static uint64_t load64(const uint8_t *s)
{
    return (uint64_t)load32(s) | (uint64_t)load32(s + 4) << 32;
}

/* An int32 (or enum) varint as upb reads it back unchanged: a sign-extended 32-bit value. */
static int int32_of(decoder *d, uint64_t raw, int32_t *out)
{
    if (raw >= 0x80000000ULL && raw < 0xFFFFFFFF80000000ULL)
        return unsure(d, "an int32 varint is not a sign-extended 32-bit value");
    uint32_t low = (uint32_t)raw;
    memcpy(out, &low, 4);
    return 0;
}

static int known_enum(const node *n, int32_t value)
{
    Py_ssize_t lo = 0, hi = n->nenums;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (n->enums[mid] == value)
            return 1;
        if (n->enums[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* A Timestamp or Duration (seconds = 1, nanos = 2, both implicit presence) as microseconds, as proto_values
 * computes them (floor division of the nanos), refused past 64 bits (the Python path makes that an error row). */
static int read_timestamp(decoder *d, node *n, const uint8_t *s, const uint8_t *end)
{
    int64_t seconds = 0;
    int32_t nanos = 0;
    uint32_t last = 0;
    int rc;
    while (s < end) {
        uint64_t tag, raw;
        if ((rc = read_varint(d, &s, end, &tag)) < 0)
            return rc;
        if ((tag != (1 << 3 | W_VARINT) || last >= 1) && (tag != (2 << 3 | W_VARINT) || last >= 2))
            return unsure(d, "a Timestamp/Duration field unknown, twice, out of order or of another wire type");
        if ((rc = read_varint(d, &s, end, &raw)) < 0)
            return rc;
        if (raw == 0)
            return unsure(d, "a Timestamp/Duration field written with its default (upb omits it)");
        last = (uint32_t)(tag >> 3);
        if (last == 1) {
            memcpy(&seconds, &raw, 8);
        } else if ((rc = int32_of(d, raw, &nanos)) < 0) {
            return rc;
        }
    }
    int64_t floor_us = nanos / 1000 - (nanos % 1000 < 0 ? 1 : 0);
    __int128 micros = (__int128)seconds * 1000000 + floor_us;
    if (micros > INT64_MAX || micros < INT64_MIN)
        return unsure(d, "a Timestamp/Duration past what 64-bit microseconds hold");
    int64_t value = (int64_t)micros;
    return put(&n->data, &value, 8) < 0 ? NOMEM : 0;
}

static int read_message(decoder *d, int index, const uint8_t *s, const uint8_t *end, int depth);

/* One value of node `index` (a field's, or a list's element) at *p; `implicit`: an implicit-presence field, which
 * upb never writes with its default value. */
static int read_value(decoder *d, int index, const uint8_t **p, const uint8_t *end, int depth, int implicit)
{
    node *n = &d->nodes[index];
    const uint8_t *s = *p;
    uint64_t raw;
    int rc;
    switch (n->kind) {
    case K_INT32:
    case K_SINT32:
    case K_UINT32:
    case K_INT64:
    case K_SINT64:
    case K_UINT64:
    case K_BOOL:
    case K_ENUM:
        if ((rc = read_varint(d, &s, end, &raw)) < 0)
            return rc;
        if (implicit && raw == 0)
            return unsure(d, "an implicit-presence field written with its default (upb omits it)");
        if (n->kind == K_INT32 || n->kind == K_ENUM) {
            int32_t value;
            if ((rc = int32_of(d, raw, &value)) < 0)
                return rc;
            if ((n->flags & F_CLOSED) && !known_enum(n, value))
                return unsure(d, "a closed enum's number it does not name (upb keeps it as an unknown field)");
            if (put(&n->data, &value, 4) < 0)
                return NOMEM;
        } else if (n->kind == K_SINT32) {
            if (raw > UINT32_MAX)
                return unsure(d, "a sint32 varint over 32 bits");
            uint32_t zigzag = (uint32_t)raw;
            uint32_t bits = (zigzag >> 1) ^ (0u - (zigzag & 1));
            if (put(&n->data, &bits, 4) < 0)
                return NOMEM;
        } else if (n->kind == K_UINT32) {
            if (raw > UINT32_MAX)
                return unsure(d, "a uint32 varint over 32 bits");
            if (put(&n->data, &raw, 8) < 0)
                return NOMEM;
        } else if (n->kind == K_SINT64) {
            uint64_t bits = (raw >> 1) ^ (0 - (raw & 1));
            if (put(&n->data, &bits, 8) < 0)
                return NOMEM;
        } else if (n->kind == K_BOOL) {
            if (raw > 1)
                return unsure(d, "a bool is neither 0 nor 1");
            if (put_bit(&n->data, n->length, (int)raw) < 0)
                return NOMEM;
        } else if (put(&n->data, &raw, 8) < 0) { /* int64, uint64: the two's complement bits as they are */
            return NOMEM;
        }
        break;
    case K_SFIXED32:
    case K_FIXED32:
    case K_FLOAT: {
        if (end - s < 4)
            return unsure(d, "a 32-bit value runs past its message's end");
        uint32_t bits = load32(s);
        s += 4;
        if (implicit && bits == 0)
            return unsure(d, "an implicit-presence field written with its default (upb omits it)");
        if (n->kind == K_FLOAT) {
            float value;
            memcpy(&value, &bits, 4);
            if (isnan(value))
                return unsure(d, "a NaN float (its bits may not survive the row)");
        }
        if (n->kind == K_FIXED32) {
            uint64_t wide = bits;
            if (put(&n->data, &wide, 8) < 0)
                return NOMEM;
        } else if (put(&n->data, &bits, 4) < 0) {
            return NOMEM;
        }
        break;
    }
    case K_SFIXED64:
    case K_FIXED64:
    case K_DOUBLE: {
        if (end - s < 8)
            return unsure(d, "a 64-bit value runs past its message's end");
        uint64_t bits = load64(s);
        s += 8;
        if (implicit && bits == 0)
            return unsure(d, "an implicit-presence field written with its default (upb omits it)");
        if (n->kind == K_DOUBLE) {
            double value;
            memcpy(&value, &bits, 8);
            if (isnan(value))
                return unsure(d, "a NaN double (its bits may not survive the row)");
        }
        if (put(&n->data, &bits, 8) < 0)
            return NOMEM;
        break;
    }
    case K_STRING:
    case K_BYTES: {
        Py_ssize_t length;
        if ((rc = read_length(d, &s, end, &length)) < 0)
            return rc;
        if (implicit && length == 0)
            return unsure(d, "an implicit-presence field written with its default (upb omits it)");
        if (n->kind == K_STRING && !valid_utf8(s, length))
            return unsure(d, "a string is not UTF-8");
        if (put(&n->data, s, length) < 0)
            return NOMEM;
        s += length;
        if ((rc = put_offset(d, n, n->data.len)) < 0)
            return rc;
        break;
    }
    case K_MESSAGE: {
        Py_ssize_t length;
        if (depth >= MAX_DEPTH)
            return unsure(d, "messages nest too deep");
        if ((rc = read_length(d, &s, end, &length)) < 0)
            return rc;
        if ((rc = read_message(d, index, s, s + length, depth + 1)) < 0)
            return rc;
        *p = s + length;
        return 0; /* read_message set the message's validity */
    }
    case K_TIMESTAMP: {
        Py_ssize_t length;
        if ((rc = read_length(d, &s, end, &length)) < 0)
            return rc;
        if ((rc = read_timestamp(d, n, s, s + length)) < 0)
            return rc;
        s += length;
        break;
    }
    default:
        return unsure(d, "a list of lists"); /* refused when the program is read */
    }
    *p = s;
    return valid(n, 1);
}

/* A packed repeated field's one chunk (upb writes a non-empty list as one chunk, an empty one not at all). */
static int read_packed(decoder *d, node *list, const uint8_t **p, const uint8_t *end, int depth)
{
    const uint8_t *s = *p;
    Py_ssize_t length;
    int rc;
    if ((rc = read_length(d, &s, end, &length)) < 0)
        return rc;
    if (length == 0)
        return unsure(d, "an empty packed chunk (upb writes none)");
    const uint8_t *chunk_end = s + length;
    while (s < chunk_end)
        if ((rc = read_value(d, list->children[0], &s, chunk_end, depth + 1, 0)) < 0)
            return rc;
    *p = s;
    return 0;
}

static int close_list(decoder *d, node *list)
{
    int rc = put_offset(d, list, d->nodes[list->children[0]].length);
    return rc < 0 ? rc : valid(list, 1);
}

/* The fields of message node `index` in [s, end), then the message's validity. */
static int read_message(decoder *d, int index, const uint8_t *s, const uint8_t *end, int depth)
{
    node *m = &d->nodes[index];
    Py_ssize_t next = 0; /* the first field not read yet (fields come in field-number order) */
    node *open = NULL;   /* an unpacked repeated field whose elements are being read */
    uint64_t oneofs = 0; /* the oneofs a member of which was read */
    int rc;
    while (s < end) {
        uint64_t tag;
        if ((rc = read_varint(d, &s, end, &tag)) < 0)
            return rc;
        if (tag > UINT32_MAX)
            return unsure(d, "a tag over 32 bits");
        uint32_t number = (uint32_t)(tag >> 3);
        int wire = (int)(tag & 7);
        if (open != NULL) {
            if (open->number == number) {
                if (wire != wire_of(d->nodes[open->children[0]].kind))
                    return unsure(d, "a repeated field's element of another wire type");
                if ((rc = read_value(d, open->children[0], &s, end, depth, 0)) < 0)
                    return rc;
                continue;
            }
            if ((rc = close_list(d, open)) < 0)
                return rc;
            open = NULL;
        }
        Py_ssize_t j = next;
        while (j < m->nchildren && d->nodes[m->children[j]].number != number)
            j++;
        if (j == m->nchildren)
            return unsure(d, "a field unknown, twice, or out of field-number order");
        for (Py_ssize_t k = next; k < j; k++)
            if ((rc = put_absent(d, m->children[k])) < 0)
                return rc;
        next = j + 1;
        int child = m->children[j];
        node *c = &d->nodes[child];
        if (c->oneof >= 0) {
            if (oneofs & (1ULL << c->oneof))
                return unsure(d, "two members of one oneof (upb keeps the last)");
            oneofs |= 1ULL << c->oneof;
        }
        if (c->kind == K_LIST && (c->flags & F_PACKED)) {
            if (wire != W_LEN)
                return unsure(d, "a packed field's element unpacked (upb writes it packed)");
            if ((rc = read_packed(d, c, &s, end, depth)) < 0)
                return rc;
            if ((rc = close_list(d, c)) < 0)
                return rc;
        } else if (c->kind == K_LIST) {
            if (wire != wire_of(d->nodes[c->children[0]].kind))
                return unsure(d, "a repeated field's element of another wire type, or packed where it is not");
            if ((rc = read_value(d, c->children[0], &s, end, depth, 0)) < 0)
                return rc;
            open = c;
        } else {
            if (wire != wire_of(c->kind))
                return unsure(d, "a field of another wire type (upb keeps it as an unknown field)");
            int implicit = !(c->flags & F_PRESENCE) && c->kind != K_MESSAGE && c->kind != K_TIMESTAMP;
            if ((rc = read_value(d, child, &s, end, depth, implicit)) < 0)
                return rc;
        }
    }
    if (open != NULL && (rc = close_list(d, open)) < 0)
        return rc;
    for (Py_ssize_t k = next; k < m->nchildren; k++)
        if ((rc = put_absent(d, m->children[k])) < 0)
            return rc;
    return valid(m, 1);
}

static void release(decoder *d)
{
    for (Py_ssize_t i = 0; i < d->count; i++) {
        PyMem_Free(d->nodes[i].children);
        PyMem_Free(d->nodes[i].enums);
        PyMem_Free(d->nodes[i].validity.p);
        PyMem_Free(d->nodes[i].data.p);
        PyMem_Free(d->nodes[i].offsets.p);
    }
    PyMem_Free(d->nodes);
}

static int packable(int kind)
{
    return kind != K_STRING && kind != K_BYTES && kind != K_MESSAGE && kind != K_TIMESTAMP && kind != K_LIST;
}

/* Reads the program; -1 with a Python exception set if it is malformed (a bug of proto_columns.py). */
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
        PyObject *children, *enums;
        unsigned int number;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(program, i), "iIiiO!O!", &n->kind, &number, &n->flags, &n->oneof,
                              &PyTuple_Type, &children, &PyTuple_Type, &enums))
            return -1;
        n->number = number;
        n->nchildren = PyTuple_GET_SIZE(children);
        n->nenums = PyTuple_GET_SIZE(enums);
        int needs = n->kind == K_LIST ? 1 : n->kind == K_MESSAGE ? -1 : 0;
        if (n->kind < 0 || n->kind >= K_KINDS || (needs >= 0 && n->nchildren != needs) || n->number > 0x1FFFFFFF ||
            (n->flags & ~F_ALL) || n->oneof < -1 || n->oneof >= MAX_ONEOFS ||
            (n->nenums > 0 && n->kind != K_ENUM) || (i == 0 && n->kind != K_MESSAGE)) {
            PyErr_Format(PyExc_ValueError, "program node %zd is malformed", i);
            return -1;
        }
        n->children = PyMem_Calloc((size_t)(n->nchildren ? n->nchildren : 1), sizeof(int));
        n->enums = PyMem_Calloc((size_t)(n->nenums ? n->nenums : 1), sizeof(int32_t));
        if (n->children == NULL || n->enums == NULL) {
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
        for (Py_ssize_t e = 0; e < n->nenums; e++) {
            long value = PyLong_AsLong(PyTuple_GET_ITEM(enums, e));
            if (value < INT32_MIN || value > INT32_MAX || (e > 0 && value <= n->enums[e - 1])) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "program node %zd: enum numbers not increasing int32s", i);
                return -1;
            }
            n->enums[e] = (int32_t)value;
        }
        if (n->kind == K_STRING || n->kind == K_BYTES || n->kind == K_LIST) {
            int32_t zero = 0;
            if (put(&n->offsets, &zero, 4) < 0) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    for (Py_ssize_t i = 0; i < d->count; i++) {
        node *n = &d->nodes[i];
        int bad = n->kind == K_LIST && (d->nodes[n->children[0]].kind == K_LIST ||
                                        ((n->flags & F_PACKED) && !packable(d->nodes[n->children[0]].kind)));
        for (Py_ssize_t c = 0; n->kind == K_MESSAGE && c < n->nchildren; c++) {
            node *field = &d->nodes[n->children[c]];
            bad |= field->number == 0 || (c > 0 && field->number <= d->nodes[n->children[c - 1]].number);
        }
        if (bad) {
            PyErr_Format(PyExc_ValueError,
                         "program node %zd: a list of lists, a packed list of what is not packable, or a "
                         "message's fields not in increasing field-number order", i);
            return -1;
        }
    }
    return 0;
}

static PyObject *decode(PyObject *self, PyObject *args)
{
    PyObject *program, *bodies, *result = NULL;
    const char *head = "";
    Py_ssize_t head_len = 0;
    if (!PyArg_ParseTuple(args, "OO!|y#", &program, &PyList_Type, &bodies, &head, &head_len))
        return NULL;
    decoder d = {0};
    if (read_program(&d, program) < 0)
        goto done;
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *s, *end;
        if (body_bytes(PyList_GET_ITEM(bodies, i), i, head, head_len, &s, &end) < 0)
            goto done;
        int rc = read_message(&d, 0, s, end, 0);
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
     "decode(program, bodies, head=b'') -> per node (length, null_count, validity, data, offsets)\n\nDecode Protobuf "
     "messages into Arrow buffers; ValueError for a batch that is not exactly what upb writes (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_proto_columns",
    "Protobuf messages to Arrow buffers (see icelog.schema.codec.proto_columns).", -1, methods,
};

PyMODINIT_FUNC PyInit__proto_columns(void)
{
    return PyModule_Create(&module);
}
