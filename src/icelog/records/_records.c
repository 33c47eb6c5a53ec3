/*
 * icelog.records._records: walk the records of a Kafka v2 record batch without building Python objects.
 *
 * validate_records(buffer, count, base_timestamp, require_keys=False, earliest=INT64_MIN,
 * latest=INT64_MAX) checks that `buffer` (the batch's records section, decompressed) holds exactly `count`
 * well-formed records, as Kafka's broker does before it appends a produced batch, each timestamp (but -1,
 * none) within [earliest, latest] (message.timestamp.before.max.ms / after.max.ms around the broker's clock).
 * It returns the records' max timestamp (-1 if none has one: what Kafka writes into the batch header,
 * whatever the producer put there), or (error_code, record_index, message) for the first problem.
 *
 * read_records(buffer, count, base_offset, base_timestamp, log_append_time=None) walks the same bytes
 * with the same structural checks (not the produce rules: offset deltas may have gaps, as after
 * compaction, and any timestamp is read, even below -1) and returns the records as
 * (offset, timestamp, key, value, headers) tuples; it raises ValueError(message) for the first problem.
 *
 * icelog/records/walk.py holds the pure-Python twins of both functions: every check and message here
 * must match them (tests/records/test_records.py runs both on the same inputs).
 *
 * Record layout: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
 *   keyLength varint | key | valueLength varint | value | headerCount varint |
 *   headers: (keyLength varint | key | valueLength varint | value)*
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "../_c/utf8.h"

/* Kafka error codes (icelog.errors.ErrorCode). */
#define CORRUPT_MESSAGE 2
#define INVALID_TIMESTAMP 32
#define INVALID_RECORD 87

#define VARINT_BYTES 5
#define VARLONG_BYTES 10
#define NO_TIMESTAMP (-1LL)

typedef struct {
    int code;
    long long index;
    char message[256];
} failure;

/* What read_records collects; NULL for validate_records (which runs without the GIL). */
typedef struct {
    PyObject *out; /* list of record tuples */
    long long base_offset;
    int append_time_set; /* LogAppendTime: every record's timestamp is the batch's maxTimestamp */
    long long append_time;
} reader;

/* Reads a zigzag varint at *p (not past `limit`); 0 if fine, else writes why into `why`. */
static int read_varint(const uint8_t **p, const uint8_t *limit, int max_bytes, int64_t *out,
                       char *why, size_t why_size)
{
    const uint8_t *s = *p;
    uint64_t raw = 0;
    int width = max_bytes == VARINT_BYTES ? 32 : 64;
    for (int i = 0; i < max_bytes; i++) {
        if (s >= limit) {
            snprintf(why, why_size, "varint is truncated");
            return -1;
        }
        uint8_t byte = *s++;
        if (i == max_bytes - 1) {
            if (byte & 0x80) {
                snprintf(why, why_size, "varint is longer than %d bytes", max_bytes);
                return -1;
            }
            if (byte >> (width - 7 * i)) {
                snprintf(why, why_size, "varint overflows %d bits", width);
                return -1;
            }
        }
        raw |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int64_t)((raw >> 1) ^ (0 - (raw & 1)));
            *p = s;
            return 0;
        }
    }
    snprintf(why, why_size, "varint is longer than %d bytes", max_bytes);
    return -1;
}

#define FAIL(c, ...)                                                      \
    do {                                                                  \
        f->code = (c);                                                    \
        f->index = i;                                                     \
        snprintf(f->message, sizeof f->message, __VA_ARGS__);             \
        return -1;                                                        \
    } while (0)

#define VARINT(field, max_bytes, out)                                                       \
    do {                                                                                    \
        if (read_varint(&p, rec_end, (max_bytes), (out), why, sizeof why) < 0)              \
            FAIL(CORRUPT_MESSAGE, "record %lld: %s: %s", i, (field), why);                 \
    } while (0)

/* Bytes of a length-prefixed field: -1 (null) if `nullable`, else 0..bytes left in the record. */
#define FIELD_BYTES(field, length, nullable)                                                          \
    do {                                                                                              \
        if ((length) < ((nullable) ? -1 : 0))                                                          \
            FAIL(CORRUPT_MESSAGE, "record %lld: %s %lld is negative", i, (field), (long long)(length)); \
        if ((length) > rec_end - p)                                                                   \
            FAIL(CORRUPT_MESSAGE, "record %lld: %s %lld runs past the record's end (%lld bytes left)", \
                 i, (field), (long long)(length), (long long)(rec_end - p));                          \
        if ((length) > 0)                                                                             \
            p += (length);                                                                            \
    } while (0)

static PyObject *bytes_or_none(const uint8_t *p, int64_t length)
{
    if (length < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)length);
}

/* Appends one record (already walked and found whole) to r->out; -1 with a Python error set on failure.
 * `headers` points at the first header of its `header_count`, each known to be well formed. */
static int emit(reader *r, long long offset, long long ts, const uint8_t *key, int64_t key_length,
                const uint8_t *value, int64_t value_length, const uint8_t *headers, int64_t header_count,
                const uint8_t *rec_end)
{
    char why[64];
    PyObject *header_tuple = PyTuple_New((Py_ssize_t)header_count);
    if (header_tuple == NULL)
        return -1;
    const uint8_t *p = headers;
    for (int64_t h = 0; h < header_count; h++) {
        int64_t hkey_length, hvalue_length;
        read_varint(&p, rec_end, VARINT_BYTES, &hkey_length, why, sizeof why);
        PyObject *hkey = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)hkey_length, "strict");
        p += hkey_length;
        read_varint(&p, rec_end, VARINT_BYTES, &hvalue_length, why, sizeof why);
        PyObject *hvalue = bytes_or_none(p, hvalue_length);
        if (hvalue_length > 0)
            p += hvalue_length;
        PyObject *pair = (hkey && hvalue) ? PyTuple_Pack(2, hkey, hvalue) : NULL;
        Py_XDECREF(hkey);
        Py_XDECREF(hvalue);
        if (pair == NULL) {
            Py_DECREF(header_tuple);
            return -1;
        }
        PyTuple_SET_ITEM(header_tuple, (Py_ssize_t)h, pair);
    }
    PyObject *record = PyTuple_New(5);
    if (record == NULL) {
        Py_DECREF(header_tuple);
        return -1;
    }
    PyObject *items[5] = {PyLong_FromLongLong(offset), PyLong_FromLongLong(ts), bytes_or_none(key, key_length),
                          bytes_or_none(value, value_length), header_tuple};
    int ok = 1;
    for (int k = 0; k < 5; k++) {
        if (items[k] == NULL) {
            ok = 0;
            items[k] = Py_NewRef(Py_None);
        }
        PyTuple_SET_ITEM(record, k, items[k]);
    }
    if (!ok || PyList_Append(r->out, record) < 0) {
        Py_DECREF(record);
        return -1;
    }
    Py_DECREF(record);
    return 0;
}

/* Walks `count` records: validates them (r == NULL) or reads them into r->out, raising *max_ts to the
 * largest record timestamp. 0 if all is well, -1 with `f` filled for a problem in the bytes, -2 with a
 * Python error set (reading only: out of memory). */
static int walk(const uint8_t *data, Py_ssize_t size, long long count, long long base_ts, long long *max_ts,
                int require_keys, long long earliest, long long latest, failure *f, reader *r)
{
    const uint8_t *p = data;
    const uint8_t *end = data + size;
    char why[64];
    char field[64];
    long long i = 0;
    for (i = 0; i < count; i++) {
        if (p >= end)
            FAIL(CORRUPT_MESSAGE, "record %lld is missing: the batch declares %lld records", i, count);
        int64_t length, ts_delta, offset_delta, key_length, value_length, header_count;
        const uint8_t *rec_end = end;
        VARINT("length", VARINT_BYTES, &length);
        if (length < 0)
            FAIL(CORRUPT_MESSAGE, "record %lld: length %lld is negative", i, (long long)length);
        if (length > end - p)
            FAIL(CORRUPT_MESSAGE, "record %lld: length %lld runs past the end of the batch (%lld bytes left)",
                 i, (long long)length, (long long)(end - p));
        rec_end = p + length;
        if (p >= rec_end)
            FAIL(CORRUPT_MESSAGE, "record %lld: attributes: truncated", i);
        p++; /* attributes: unused in v2 records */
        VARINT("timestamp delta", VARLONG_BYTES, &ts_delta);
        VARINT("offset delta", VARINT_BYTES, &offset_delta);
        long long offset = 0;
        if (r == NULL && offset_delta != i)
            FAIL(CORRUPT_MESSAGE, "record %lld: offset delta %lld, expected %lld (deltas run 0..count-1)", i,
                 (long long)offset_delta, i);
        if (r != NULL && __builtin_add_overflow(r->base_offset, (long long)offset_delta, &offset))
            FAIL(CORRUPT_MESSAGE, "record %lld: base offset %lld + delta %lld overflows", i, r->base_offset,
                 (long long)offset_delta);
        long long ts;
        if (__builtin_add_overflow(base_ts, (long long)ts_delta, &ts))
            FAIL(INVALID_TIMESTAMP, "record %lld: base timestamp %lld + delta %lld overflows", i, base_ts,
                 (long long)ts_delta);
        if (r == NULL && ts < NO_TIMESTAMP)
            FAIL(INVALID_TIMESTAMP, "record %lld: timestamp %lld is negative (only -1, no timestamp, is allowed)",
                 i, ts);
        if (r == NULL && ts != NO_TIMESTAMP && (ts < earliest || ts > latest))
            FAIL(INVALID_TIMESTAMP, "record %lld: timestamp %lld is out of range: it must be within [%lld, %lld]",
                 i, ts, earliest, latest);
        if (ts > *max_ts)
            *max_ts = ts;
        VARINT("key length", VARINT_BYTES, &key_length);
        const uint8_t *key = p;
        FIELD_BYTES("key length", key_length, 1);
        if (require_keys && key_length < 0)
            FAIL(INVALID_RECORD, "record %lld: a compacted topic cannot accept a record without a key", i);
        VARINT("value length", VARINT_BYTES, &value_length);
        const uint8_t *value = p;
        FIELD_BYTES("value length", value_length, 1);
        VARINT("header count", VARINT_BYTES, &header_count);
        if (header_count < 0)
            FAIL(CORRUPT_MESSAGE, "record %lld: header count %lld is negative", i, (long long)header_count);
        const uint8_t *headers = p;
        for (int64_t h = 0; h < header_count; h++) {
            int64_t hkey_length, hvalue_length;
            snprintf(field, sizeof field, "header %lld key length", (long long)h);
            VARINT(field, VARINT_BYTES, &hkey_length);
            FIELD_BYTES(field, hkey_length, 0);
            if (!valid_utf8(p - hkey_length, (Py_ssize_t)hkey_length))
                FAIL(INVALID_RECORD, "record %lld: header %lld key is not valid UTF-8", i, (long long)h);
            snprintf(field, sizeof field, "header %lld value length", (long long)h);
            VARINT(field, VARINT_BYTES, &hvalue_length);
            FIELD_BYTES(field, hvalue_length, 1);
        }
        if (p != rec_end)
            FAIL(CORRUPT_MESSAGE, "record %lld: its fields end %lld bytes before the end its length gives", i,
                 (long long)(rec_end - p));
        if (r != NULL && emit(r, offset, r->append_time_set ? r->append_time : ts, key, key_length, value,
                              value_length, headers, header_count, rec_end) < 0)
            return -2;
    }
    i = -1;
    if (p != end)
        FAIL(CORRUPT_MESSAGE, "%lld bytes follow the %lld records the batch declares", (long long)(end - p), count);
    return 0;
}

static PyObject *validate_records(PyObject *self, PyObject *args)
{
    Py_buffer buffer;
    long long count, base_ts, max_ts = NO_TIMESTAMP;
    long long earliest = LLONG_MIN, latest = LLONG_MAX;
    int require_keys = 0;
    failure f;
    int result;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LL|pLL:validate_records", &buffer, &count, &base_ts, &require_keys, &earliest,
                          &latest))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)buffer.buf, buffer.len, count, base_ts, &max_ts, require_keys, earliest, latest,
                  &f, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (result == 0)
        return PyLong_FromLongLong(max_ts);
    return Py_BuildValue("(iLs)", f.code, f.index, f.message);
}

static PyObject *read_records(PyObject *self, PyObject *args)
{
    Py_buffer buffer;
    long long count, base_offset, base_ts;
    PyObject *append_time = Py_None;
    reader r;
    failure f;
    int result;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLL|O:read_records", &buffer, &count, &base_offset, &base_ts, &append_time))
        return NULL;
    r.base_offset = base_offset;
    r.append_time_set = append_time != Py_None;
    r.append_time = 0;
    if (r.append_time_set) {
        r.append_time = PyLong_AsLongLong(append_time);
        if (r.append_time == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&buffer);
            return NULL;
        }
    }
    r.out = PyList_New(0);
    if (r.out == NULL) {
        PyBuffer_Release(&buffer);
        return NULL;
    }
    long long max_ts = NO_TIMESTAMP;
    result = walk((const uint8_t *)buffer.buf, buffer.len, count, base_ts, &max_ts, 0, LLONG_MIN, LLONG_MAX, &f, &r);
    PyBuffer_Release(&buffer);
    if (result == 0)
        return r.out;
    Py_DECREF(r.out);
    if (result == -1)
        PyErr_SetString(PyExc_ValueError, f.message);
    return NULL;
}

static PyMethodDef methods[] = {
    {"validate_records", validate_records, METH_VARARGS,
     "validate_records(buffer, count, base_timestamp, require_keys=False, earliest=INT64_MIN, latest=INT64_MAX) -> "
     "max_timestamp | (error_code, record_index, message)\n\nCheck that a v2 batch's (decompressed) records "
     "section holds exactly `count` well-formed records (each with a key when require_keys: a compacted topic; "
     "each timestamp but -1 within [earliest, latest]); answer their max timestamp (-1 if none has one)."},
    {"read_records", read_records, METH_VARARGS,
     "read_records(buffer, count, base_offset, base_timestamp, log_append_time=None) -> list[(offset, "
     "timestamp, key, value, headers)]\n\nThe records of a v2 batch's (decompressed) records section, which must "
     "hold exactly `count` well-formed records; ValueError(message) for the first problem. Every timestamp is "
     "log_append_time when it is given (a LogAppendTime batch's maxTimestamp)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_records", "Compiled walker of Kafka v2 records (see icelog.records.walk).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__records(void)
{
    return PyModule_Create(&module);
}
