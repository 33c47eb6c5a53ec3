/*
 * icelog.log._records: walk the records of a Kafka v2 record batch without building Python objects.
 *
 * validate_records(buffer, count, base_timestamp, max_timestamp) checks that `buffer` (the batch's
 * records section, decompressed) holds exactly `count` well-formed records, as Kafka's broker does before
 * it appends a produced batch. It returns None, or (error_code, record_index, message) for the first
 * problem. icelog/log/records.py holds the pure-Python twin of this function: every check and message
 * here must match it (tests/log/test_records.py runs both on the same inputs).
 *
 * Record layout: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
 *   keyLength varint | key | valueLength varint | value | headerCount varint |
 *   headers: (keyLength varint | key | valueLength varint | value)*
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>

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

/* Strict UTF-8 as Python's bytes.decode("utf-8"): no overlong forms, surrogates or code points > U+10FFFF. */
static int valid_utf8(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F))
                return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
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

static int walk(const uint8_t *data, Py_ssize_t size, long long count, long long base_ts, long long max_ts,
                int require_keys, failure *f)
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
        if (offset_delta != i)
            FAIL(CORRUPT_MESSAGE, "record %lld: offset delta %lld, expected %lld (deltas run 0..count-1)", i,
                 (long long)offset_delta, i);
        long long ts;
        if (__builtin_add_overflow(base_ts, (long long)ts_delta, &ts))
            FAIL(INVALID_TIMESTAMP, "record %lld: base timestamp %lld + delta %lld overflows", i, base_ts,
                 (long long)ts_delta);
        if (ts < NO_TIMESTAMP)
            FAIL(INVALID_TIMESTAMP, "record %lld: timestamp %lld is negative (only -1, no timestamp, is allowed)",
                 i, ts);
        if (ts > max_ts)
            FAIL(INVALID_TIMESTAMP, "record %lld: timestamp %lld is after the batch's max timestamp %lld", i, ts,
                 max_ts);
        VARINT("key length", VARINT_BYTES, &key_length);
        FIELD_BYTES("key length", key_length, 1);
        if (require_keys && key_length < 0)
            FAIL(INVALID_RECORD, "record %lld: a compacted topic cannot accept a record without a key", i);
        VARINT("value length", VARINT_BYTES, &value_length);
        FIELD_BYTES("value length", value_length, 1);
        VARINT("header count", VARINT_BYTES, &header_count);
        if (header_count < 0)
            FAIL(CORRUPT_MESSAGE, "record %lld: header count %lld is negative", i, (long long)header_count);
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
    }
    i = -1;
    if (p != end)
        FAIL(CORRUPT_MESSAGE, "%lld bytes follow the %lld records the batch declares", (long long)(end - p), count);
    return 0;
}

static PyObject *validate_records(PyObject *self, PyObject *args)
{
    Py_buffer buffer;
    long long count, base_ts, max_ts;
    int require_keys = 0;
    failure f;
    int result;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLL|p:validate_records", &buffer, &count, &base_ts, &max_ts, &require_keys))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)buffer.buf, buffer.len, count, base_ts, max_ts, require_keys, &f);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (result == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(iLs)", f.code, f.index, f.message);
}

static PyMethodDef methods[] = {
    {"validate_records", validate_records, METH_VARARGS,
     "validate_records(buffer, count, base_timestamp, max_timestamp, require_keys=False) -> None | (error_code, "
     "record_index, message)\n\nCheck that a v2 batch's (decompressed) records section holds exactly `count` "
     "well-formed records (each with a key when require_keys: a compacted topic)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_records", "Compiled walker of Kafka v2 records (see icelog.log.records).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__records(void)
{
    return PyModule_Create(&module);
}
