/*
 * icelog.schema.codec._json_columns: JSON documents → Arrow column buffers, in one pass, without building a Python
 * object per value.
 *
 * decode(program, bodies, head=b"") parses every body (bytes, one JSON document each, after `head`: with a head, every
 * body must start with it, the batch's Confluent envelope, and none be None) and returns, per program
 * node, the buffers of the Arrow array of that node's values: (length, null_count, validity, data, offsets) as
 * _avro_columns.c does (validity an Arrow bitmap or None, data the fixed-width values or a string's bytes, offsets
 * int32 for strings and lists). icelog/schema/codec/json_columns.py builds the program from the table's columns and
 * the Arrow arrays from the buffers.
 *
 * The values are exactly what json_codec.JSONRows makes of each document (json.loads, then its converters): a
 * value of the wrong JSON type for its column is null, keys without a column are ignored, a missing key is null,
 * a top-level value that is not an object is a row of nulls. The module answers only for a batch it can prove
 * json.loads reads as it does: any body that is not strict RFC 8259 JSON in strict UTF-8 (NaN, Infinity, a raw
 * control character in a string, a lone surrogate, a BOM, nesting past MAX_DEPTH, bytes after the document), a
 * column's key twice in one object (json.loads keeps the last), an integer of over MAX_INT_DIGITS digits (Python's
 * int-string limit), a date or date-time string it cannot prove Python's converter answers the same for: ValueError,
 * and the caller decodes the batch in Python.
 *
 * Program: a tuple of nodes, node 0 the root (a STRUCT: the document's columns); each node is (kind, arg, name,
 * children): kind as below; arg 1 for a LONG node of a 32-bit column (else 0); name the key (UTF-8 bytes) a
 * STRUCT's child is read from (b"" elsewhere); children a tuple of later node indices: a STRUCT's columns, a
 * LIST's element.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../_c/column_buffers.h"
#include "../../_c/utf8.h"

enum { K_STRUCT, K_LIST, K_STRING, K_LONG, K_DOUBLE, K_BOOLEAN, K_DATE, K_TIMESTAMPTZ, K_KINDS };

#define MAX_NODES 4096
#define MAX_DEPTH 64
#define MAX_INT_DIGITS 600 /* Python refuses int strings of over sys.get_int_max_str_digits() digits (>= 640) */
#define SKIP (-1)          /* the node index of a value without a column: checked, not kept */

typedef struct {
    int kind;
    long long arg;
    const char *name; /* borrowed from the program's bytes */
    Py_ssize_t name_len;
    Py_ssize_t nchildren;
    int *children;
    uint64_t *seen; /* STRUCT: per child, the mark of the last object it was read in */
    Py_ssize_t length, nulls;
    buffer validity, data, offsets;
} node;

typedef struct {
    node *nodes;
    Py_ssize_t count;
    uint64_t mark;
    buffer key; /* the current object key, unescaped */
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

/* Appends a null: a zero value, an empty entry (offsets), nulls in every field (struct). */
static int put_null(decoder *d, int index)
{
    node *n = &d->nodes[index];
    int rc;
    switch (n->kind) {
    case K_BOOLEAN:
        if (put_bit(&n->data, n->length, 0) < 0)
            return NOMEM;
        break;
    case K_DATE: {
        int32_t zero = 0;
        if (put(&n->data, &zero, 4) < 0)
            return NOMEM;
        break;
    }
    case K_LONG:
    case K_DOUBLE:
    case K_TIMESTAMPTZ: {
        uint64_t zero = 0;
        if (put(&n->data, &zero, 8) < 0)
            return NOMEM;
        break;
    }
    case K_STRING:
        if ((rc = put_offset(d, n, n->data.len)) < 0)
            return rc;
        break;
    case K_LIST:
        if ((rc = put_offset(d, n, d->nodes[n->children[0]].length)) < 0)
            return rc;
        break;
    case K_STRUCT:
        for (Py_ssize_t c = 0; c < n->nchildren; c++)
            if ((rc = put_null(d, n->children[c])) < 0)
                return rc;
        break;
    }
    return valid(n, 0);
}

typedef struct {
    const uint8_t *s, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\n' || *c->s == '\r' || *c->s == '\t'))
        c->s++;
}

static int hex4(const uint8_t *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t h = s[i];
        v <<= 4;
        if (h >= '0' && h <= '9')
            v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f')
            v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
            v |= (uint32_t)(h - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A string (the cursor on its opening quote): unescaped as json.loads does into `out` (NULL: only checked). */
static int read_string(decoder *d, cursor *c, buffer *out)
{
    const uint8_t *s = c->s + 1, *end = c->end;
    if (out != NULL && grow(out, end - s) < 0) /* the unescaped text is never longer than its spelling */
        return NOMEM;
    for (;;) {
        const uint8_t *run = s;
        uint8_t high = 0;
        while (s < end && *s != '"' && *s != '\\' && *s >= 0x20) {
            high |= *s;
            s++;
        }
        if (s >= end)
            return unsure(d, "a string runs past the body's end");
        if (high & 0x80 && !valid_utf8(run, s - run))
            return unsure(d, "a string is not UTF-8");
        if (out != NULL && s > run) {
            memcpy(out->p + out->len, run, (size_t)(s - run));
            out->len += s - run;
        }
        if (*s == '"')
            break;
        if (*s < 0x20)
            return unsure(d, "a control character in a string (json.loads refuses it)");
        /* an escape */
        if (end - s < 2)
            return unsure(d, "an escape runs past the body's end");
        uint8_t e = s[1], one;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': {
            uint32_t cp, low;
            if (end - s < 6 || hex4(s + 2, &cp) < 0)
                return unsure(d, "a \\u escape without 4 hex digits");
            s += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return unsure(d, "a lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - s < 6 || s[0] != '\\' || s[1] != 'u' || hex4(s + 2, &low) < 0 || low < 0xDC00 ||
                    low > 0xDFFF)
                    return unsure(d, "a lone high surrogate");
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (out != NULL) {
                uint8_t *o = out->p + out->len;
                if (cp < 0x80) {
                    o[0] = (uint8_t)cp;
                    out->len += 1;
                } else if (cp < 0x800) {
                    o[0] = (uint8_t)(0xC0 | (cp >> 6));
                    o[1] = (uint8_t)(0x80 | (cp & 0x3F));
                    out->len += 2;
                } else if (cp < 0x10000) {
                    o[0] = (uint8_t)(0xE0 | (cp >> 12));
                    o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                    o[2] = (uint8_t)(0x80 | (cp & 0x3F));
                    out->len += 3;
                } else {
                    o[0] = (uint8_t)(0xF0 | (cp >> 18));
                    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
                    out->len += 4;
                }
            }
            continue;
        }
        default:
            return unsure(d, "an invalid escape");
        }
        if (out != NULL)
            out->p[out->len++] = one;
        s += 2;
    }
    c->s = s + 1;
    return 0;
}

/* A number token (the cursor on it): RFC 8259's grammar; its extent and whether it is an integer. */
static int scan_number(decoder *d, cursor *c, const uint8_t **start, int *is_int)
{
    const uint8_t *s = c->s, *end = c->end;
    *start = s;
    if (s < end && *s == '-')
        s++;
    const uint8_t *digits = s;
    if (s >= end || *s < '0' || *s > '9')
        return unsure(d, "not a JSON value (NaN, Infinity, or garbage)");
    if (*s == '0') {
        s++;
    } else {
        while (s < end && *s >= '0' && *s <= '9')
            s++;
    }
    *is_int = 1;
    if (s - digits > MAX_INT_DIGITS)
        return unsure(d, "an integer of over 600 digits");
    if (s < end && *s == '.') {
        s++;
        if (s >= end || *s < '0' || *s > '9')
            return unsure(d, "a number's fraction without digits");
        while (s < end && *s >= '0' && *s <= '9')
            s++;
        *is_int = 0;
    }
    if (s < end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < end && (*s == '+' || *s == '-'))
            s++;
        if (s >= end || *s < '0' || *s > '9')
            return unsure(d, "a number's exponent without digits");
        while (s < end && *s >= '0' && *s <= '9')
            s++;
        *is_int = 0;
    }
    if (s < end && *s >= '0' && *s <= '9')
        return unsure(d, "a number with a leading zero");
    c->s = s;
    return 0;
}

/* An integer token as int64 (0: it does not fit). */
static int int_token(const uint8_t *s, const uint8_t *end, int64_t *out)
{
    int negative = *s == '-';
    if (negative)
        s++;
    uint64_t v = 0;
    for (; s < end; s++) {
        unsigned digit = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return 0;
        v = v * 10 + digit;
    }
    if (negative) {
        if (v > (uint64_t)INT64_MAX + 1)
            return 0;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return 0;
        *out = (int64_t)v;
    }
    return 1;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number token as Python's float() of it: correctly rounded (an exact mantissa and power of ten in one
 * operation, else Python's own strtod); ±inf past the double range. */
static int double_token(decoder *d, const uint8_t *s, const uint8_t *end, double *out)
{
    const uint8_t *p = s;
    int negative = *p == '-';
    if (negative)
        p++;
    uint64_t mantissa = 0;
    int64_t digits = 0, exponent = 0; /* (a number of over 2^31 digits still counts right) */
    int fast = 1;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (mantissa || *p != '0')
            digits++;
        if (digits > 15)
            fast = 0;
        else
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    }
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            if (mantissa || *p != '0')
                digits++;
            if (digits > 15)
                fast = 0;
            else
                mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            exponent--;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int64_t sign = 1, e = 0;
        if (*p == '+' || *p == '-')
            sign = *p++ == '-' ? -1 : 1;
        for (; p < end; p++) {
            if (e > 100000)
                fast = 0;
            else
                e = e * 10 + (*p - '0');
        }
        exponent += sign * e;
    }
    if (fast && exponent >= -22 && exponent <= 22) {
        double v = (double)mantissa; /* exact: at most 15 digits */
        v = exponent < 0 ? v / POW10[-exponent] : v * POW10[exponent];
        *out = negative ? -v : v;
        return 0;
    }
    char *stop = NULL;
    double v = PyOS_string_to_double((const char *)s, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return unsure(d, "a number Python's strtod does not read");
    }
    if ((const uint8_t *)stop != end)
        return unsure(d, "a number Python's strtod reads otherwise");
    *out = v;
    return 0;
}

static int is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static int two(const uint8_t *s)
{
    return (s[0] - '0') * 10 + (s[1] - '0');
}

static int days_in_month(int year, int month)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : days[month - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date. */
static int64_t days_from_civil(int64_t y, int m, int dd)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + dd - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* YYYY-MM-DD at s (10 bytes): 1 and its days if it is a date, 0 if it has that shape but is no date, -1 if not
 * that shape. */
static int plain_date(const uint8_t *s, int64_t *days)
{
    for (int i = 0; i < 10; i++)
        if (i == 4 || i == 7 ? s[i] != '-' : !is_digit(s[i]))
            return -1;
    int year = two(s) * 100 + two(s + 2), month = two(s + 5), day = two(s + 8);
    if (year < 1 || month < 1 || month > 12 || day < 1 || day > days_in_month(year, month))
        return 0;
    *days = days_from_civil(year, month, day);
    return 1;
}

/* Whether Python's date.fromisoformat / datetime.fromisoformat cannot read a string, whatever its version: empty,
 * or starting with an ASCII character that is no digit, sign or space (every ISO form starts with a year's digit). */
static int surely_not_iso(const uint8_t *s, Py_ssize_t n)
{
    if (n == 0)
        return 1;
    uint8_t c = s[0];
    return c < 0x80 && c > ' ' && !is_digit(c) && c != '+' && c != '-' && c != 0x7F;
}

/* A date column's string (unescaped, n bytes): as json_codec._date. */
static int put_date(decoder *d, node *n, const uint8_t *s, Py_ssize_t n_bytes)
{
    int64_t days = 0;
    int shape = n_bytes == 10 ? plain_date(s, &days) : -1;
    if (shape < 0) {
        if (!surely_not_iso(s, n_bytes))
            return unsure(d, "a date string other than YYYY-MM-DD (date.fromisoformat may read it)");
        shape = 0;
    }
    int32_t v = (int32_t)days;
    if (put(&n->data, &v, 4) < 0)
        return NOMEM;
    return valid(n, shape);
}

/* A date-time column's string: as json_codec._timestamptz for RFC 3339's strict form
 * YYYY-MM-DD(T|t)HH:MM:SS[.1-6 digits](Z|z|±HH:MM); null for that form without an offset or a plain YYYY-MM-DD
 * (Python's datetime is naive), an impossible date, and a string no ISO reader takes; anything else is unsure. */
static int put_timestamptz(decoder *d, node *n, const uint8_t *s, Py_ssize_t len)
{
    int64_t days = 0, micros = 0;
    int ok = 0;
    if (surely_not_iso(s, len) || (len == 10 && plain_date(s, &days) >= 0))
        goto done; /* a date alone: Python's datetime is naive (or not read at all): null either way */
    if (len < 19)
        return unsure(d, "a date-time string not in RFC 3339's strict form");
    int date = plain_date(s, &days);
    if (date < 0 || (s[10] != 'T' && s[10] != 't') || !is_digit(s[11]) || !is_digit(s[12]) || s[13] != ':' ||
        !is_digit(s[14]) || !is_digit(s[15]) || s[16] != ':' || !is_digit(s[17]) || !is_digit(s[18]))
        return unsure(d, "a date-time string not in RFC 3339's strict form");
    int hour = two(s + 11), minute = two(s + 14), second = two(s + 17);
    Py_ssize_t i = 19;
    int fraction = 0;
    if (i < len && s[i] == '.') {
        int digits = 0;
        for (i++; i < len && is_digit(s[i]) && digits < 7; i++, digits++)
            fraction = fraction * 10 + (s[i] - '0');
        if (digits < 1 || digits > 6)
            return unsure(d, "a date-time's fraction of no or over 6 digits");
        for (; digits < 6; digits++)
            fraction *= 10;
    }
    int offset = 0, naive = 0;
    if (i == len) {
        naive = 1; /* no offset: Python's datetime is naive (or not read at all): null either way */
    } else if (len - i == 1 && (s[i] == 'Z' || s[i] == 'z')) {
        offset = 0;
    } else if (len - i == 6 && (s[i] == '+' || s[i] == '-') && is_digit(s[i + 1]) && is_digit(s[i + 2]) &&
               s[i + 3] == ':' && is_digit(s[i + 4]) && is_digit(s[i + 5])) {
        int oh = two(s + i + 1), om = two(s + i + 4);
        if (oh > 23 || om > 59)
            return unsure(d, "a date-time's offset out of range (Python may still read it)");
        offset = (s[i] == '-' ? -1 : 1) * (oh * 60 + om);
    } else {
        return unsure(d, "a date-time string not in RFC 3339's strict form");
    }
    if (naive)
        goto done;
    if (hour > 23 || minute > 59 || second > 59)
        return unsure(d, "a date-time's time out of range (Python versions differ)");
    if (date == 0)
        goto done; /* no such day: datetime refuses it */
    micros = ((days * 86400 + hour * 3600 + minute * 60 + second) - (int64_t)offset * 60) * 1000000 + fraction;
    ok = 1;
done:
    if (put(&n->data, &micros, 8) < 0)
        return NOMEM;
    return valid(n, ok);
}

static int read_value(decoder *d, int index, cursor *c, int depth);

static int read_object(decoder *d, int index, cursor *c, int depth)
{
    node *n = index == SKIP ? NULL : &d->nodes[index];
    uint64_t mark = ++d->mark;
    Py_ssize_t next = 0; /* keys mostly come in the columns' order: the next column is tried first */
    int rc;
    c->s++; /* { */
    skip_ws(c);
    if (c->s < c->end && *c->s == '}') {
        c->s++;
    } else {
        for (;;) {
            if (c->s >= c->end || *c->s != '"')
                return unsure(d, "an object key is not a string");
            int child = SKIP;
            if (n != NULL) {
                /* the key as spelled when it is plain ASCII (the common case: no copy), else unescaped */
                const uint8_t *key = c->s + 1, *k_end = key;
                while (k_end < c->end && *k_end != '"' && *k_end != '\\' && *k_end >= 0x20 && *k_end < 0x80)
                    k_end++;
                if (k_end < c->end && *k_end == '"') {
                    c->s = k_end + 1;
                } else {
                    d->key.len = 0;
                    if ((rc = read_string(d, c, &d->key)) < 0)
                        return rc;
                    key = d->key.p;
                    k_end = key + d->key.len;
                }
                Py_ssize_t key_len = k_end - key;
                for (Py_ssize_t k = 0, j = next; k < n->nchildren; k++, j++) {
                    if (j >= n->nchildren)
                        j = 0;
                    node *ch = &d->nodes[n->children[j]];
                    if (ch->name_len == key_len && (key_len == 0 || memcmp(ch->name, key, (size_t)key_len) == 0)) {
                        if (n->seen[j] == mark)
                            return unsure(d, "an object with a column's key twice (json.loads keeps the last)");
                        n->seen[j] = mark;
                        child = n->children[j];
                        next = j + 1;
                        break;
                    }
                }
            } else if ((rc = read_string(d, c, NULL)) < 0) {
                return rc;
            }
            skip_ws(c);
            if (c->s >= c->end || *c->s != ':')
                return unsure(d, "an object key without a colon");
            c->s++;
            skip_ws(c);
            if ((rc = read_value(d, child, c, depth + 1)) < 0)
                return rc;
            skip_ws(c);
            if (c->s < c->end && *c->s == ',') {
                c->s++;
                skip_ws(c);
                continue;
            }
            if (c->s < c->end && *c->s == '}') {
                c->s++;
                break;
            }
            return unsure(d, "an object without its comma or closing brace");
        }
    }
    if (n == NULL)
        return 0;
    for (Py_ssize_t j = 0; j < n->nchildren; j++)
        if (n->seen[j] != mark && (rc = put_null(d, n->children[j])) < 0)
            return rc;
    return valid(n, 1);
}

static int read_array(decoder *d, int index, cursor *c, int depth)
{
    node *n = index == SKIP ? NULL : &d->nodes[index];
    int element = n == NULL ? SKIP : n->children[0];
    int rc;
    c->s++; /* [ */
    skip_ws(c);
    if (c->s < c->end && *c->s == ']') {
        c->s++;
    } else {
        for (;;) {
            if ((rc = read_value(d, element, c, depth + 1)) < 0)
                return rc;
            skip_ws(c);
            if (c->s < c->end && *c->s == ',') {
                c->s++;
                skip_ws(c);
                continue;
            }
            if (c->s < c->end && *c->s == ']') {
                c->s++;
                break;
            }
            return unsure(d, "an array without its comma or closing bracket");
        }
    }
    if (n == NULL)
        return 0;
    if ((rc = put_offset(d, n, d->nodes[element].length)) < 0)
        return rc;
    return valid(n, 1);
}

static int literal(decoder *d, cursor *c, const char *word, Py_ssize_t len)
{
    if (c->end - c->s < len || memcmp(c->s, word, (size_t)len) != 0)
        return unsure(d, "not a JSON value");
    c->s += len;
    return 0;
}

/* One value into node `index` (SKIP: checked only): its column's value, or null for null or a wrong type. */
static int read_value(decoder *d, int index, cursor *c, int depth)
{
    node *n = index == SKIP ? NULL : &d->nodes[index];
    int kind = n == NULL ? -1 : n->kind;
    int rc;
    if (depth > MAX_DEPTH)
        return unsure(d, "values nest too deep");
    if (c->s >= c->end)
        return unsure(d, "a value runs past the body's end");
    switch (*c->s) {
    case '{':
        if (kind == K_STRUCT)
            return read_object(d, index, c, depth);
        if ((rc = read_object(d, SKIP, c, depth)) < 0)
            return rc;
        break;
    case '[':
        if (kind == K_LIST)
            return read_array(d, index, c, depth);
        if ((rc = read_array(d, SKIP, c, depth)) < 0)
            return rc;
        break;
    case '"':
        if (kind == K_STRING) {
            if ((rc = read_string(d, c, &n->data)) < 0)
                return rc;
            if ((rc = put_offset(d, n, n->data.len)) < 0)
                return rc;
            return valid(n, 1);
        }
        if (kind == K_DATE || kind == K_TIMESTAMPTZ) {
            d->key.len = 0;
            if ((rc = read_string(d, c, &d->key)) < 0)
                return rc;
            return kind == K_DATE ? put_date(d, n, d->key.p, d->key.len) : put_timestamptz(d, n, d->key.p, d->key.len);
        }
        if ((rc = read_string(d, c, NULL)) < 0)
            return rc;
        break;
    case 't':
    case 'f': {
        int truth = *c->s == 't';
        if ((rc = truth ? literal(d, c, "true", 4) : literal(d, c, "false", 5)) < 0)
            return rc;
        if (kind == K_BOOLEAN) {
            if (put_bit(&n->data, n->length, truth) < 0)
                return NOMEM;
            return valid(n, 1);
        }
        break;
    }
    case 'n':
        if ((rc = literal(d, c, "null", 4)) < 0)
            return rc;
        break;
    default: {
        const uint8_t *start;
        int is_int;
        if ((rc = scan_number(d, c, &start, &is_int)) < 0)
            return rc;
        if (kind == K_LONG) {
            int64_t v = 0;
            int ok;
            if (is_int) {
                ok = int_token(start, c->s, &v);
            } else {
                double x;
                if ((rc = double_token(d, start, c->s, &x)) < 0)
                    return rc;
                /* Python: a float with an integral value is that integer (1.0, 1e2) */
                ok = isfinite(x) && x == floor(x) && x >= -9223372036854775808.0 && x < 9223372036854775808.0;
                if (ok)
                    v = (int64_t)x;
            }
            if (ok && n->arg == 1 && (v < INT32_MIN || v > INT32_MAX))
                ok = 0;
            if (!ok)
                v = 0;
            if (put(&n->data, &v, 8) < 0)
                return NOMEM;
            return valid(n, ok);
        }
        if (kind == K_DOUBLE) {
            double x = 0;
            int64_t v;
            int ok = 1;
            if (is_int && int_token(start, c->s, &v)) {
                x = (double)v; /* Python's float(int): +0.0 for -0 */
            } else {
                if ((rc = double_token(d, start, c->s, &x)) < 0)
                    return rc;
                if (is_int && isinf(x)) { /* float() of an int past the double range: OverflowError, null */
                    ok = 0;
                    x = 0;
                }
            }
            if (put(&n->data, &x, 8) < 0)
                return NOMEM;
            return valid(n, ok);
        }
        break;
    }
    }
    return n == NULL ? 0 : put_null(d, index);
}

static void release(decoder *d)
{
    for (Py_ssize_t i = 0; i < d->count; i++) {
        PyMem_Free(d->nodes[i].children);
        PyMem_Free(d->nodes[i].seen);
        PyMem_Free(d->nodes[i].validity.p);
        PyMem_Free(d->nodes[i].data.p);
        PyMem_Free(d->nodes[i].offsets.p);
    }
    PyMem_Free(d->nodes);
    PyMem_Free(d->key.p);
}

/* Reads the program; -1 with a Python exception set if it is malformed (a bug of json_columns.py). */
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
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(program, i), "iLy#O!", &n->kind, &n->arg, &n->name, &n->name_len,
                              &PyTuple_Type, &children))
            return -1;
        n->nchildren = PyTuple_GET_SIZE(children);
        if (n->kind < 0 || n->kind >= K_KINDS || (n->kind == K_LIST && n->nchildren != 1) ||
            (n->kind != K_LIST && n->kind != K_STRUCT && n->nchildren != 0) || (i == 0 && n->kind != K_STRUCT) ||
            n->arg < 0 || n->arg > 1) {
            PyErr_Format(PyExc_ValueError, "program node %zd is malformed", i);
            return -1;
        }
        n->children = PyMem_Calloc((size_t)(n->nchildren ? n->nchildren : 1), sizeof(int));
        n->seen = PyMem_Calloc((size_t)(n->nchildren ? n->nchildren : 1), sizeof(uint64_t));
        if (n->children == NULL || n->seen == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t c = 0; c < n->nchildren; c++) {
            long child = PyLong_AsLong(PyTuple_GET_ITEM(children, c));
            if (child <= i || child >= d->count) { /* children come after their parent: a tree, never a cycle */
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "program node %zd: child %ld is not a later node", i, child);
                return -1;
            }
            n->children[c] = (int)child;
        }
        if (n->kind == K_STRING || n->kind == K_LIST) {
            int32_t zero = 0;
            if (put(&n->offsets, &zero, 4) < 0) {
                PyErr_NoMemory();
                return -1;
            }
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
        cursor c;
        if (body_bytes(PyList_GET_ITEM(bodies, i), i, head, head_len, &c.s, &c.end) < 0)
            goto done;
        int rc;
        skip_ws(&c);
        if (c.s < c.end && *c.s == '{') {
            rc = read_object(&d, 0, &c, 1);
        } else { /* not an object: json_codec's _EMPTY, a row of nulls */
            rc = read_value(&d, SKIP, &c, 1);
            if (rc == 0)
                rc = put_null(&d, 0);
        }
        if (rc == 0) {
            skip_ws(&c);
            if (c.s != c.end)
                rc = unsure(&d, "bytes after the document");
        }
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
     "decode(program, bodies, head=b'') -> per node (length, null_count, validity, data, offsets)\n\nDecode JSON documents "
     "into Arrow buffers; ValueError for a batch json.loads might read otherwise (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_json_columns", "JSON documents to Arrow buffers (see icelog.schema.codec.json_columns).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__json_columns(void)
{
    return PyModule_Create(&module);
}
