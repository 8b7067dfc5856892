/*
 * Kafka RecordBatch v2 records <-> Arrow column buffers, for brokers/kafka/records.py.
 *
 * Why C: a Kafka record is a run of zigzag varints whose positions depend on the values
 * before them, so a pure-Python decoder walks every record (2-3 us each); this walks the
 * same bytes in one call and hands back whole Arrow buffers (offsets, validity bitmaps,
 * data), which records.py wraps with pyarrow.Array.from_buffers. No Python object is made
 * per record in either direction.
 *
 * decode(records, count, first_ts) -> tuple of bytes objects and counts, see decode()'s
 *        comment (timestamps come back absolute, with their minimum and maximum: pyarrow's
 *        compute functions cost 6-20 us a call, more than the walk itself).
 * encode(n, first_ts, ts, key_valid, key_off, key_data, key_at, value_valid, value_off,
 *        value_data, value_at, hdr_valid, hdr_off, hdr_at, hk_off, hk_data, hk_at,
 *        hv_valid, hv_off, hv_data, hv_at[, prefix]) -> a bytearray: ``prefix`` zero
 *        bytes (room for the batch header), then the n records. It is allocated once at
 *        the records' upper bound and written in place (no copy; a 500 KB batch spent
 *        a third of its conversion in the copies of the bytes-then-bytearray version).
 *
 * Invariants: every read is bounds-checked against the input; a malformed record raises
 * ValueError with the record's index (records.py turns it into CORRUPT_MESSAGE). Offsets
 * are int32 (Arrow's binary/string), so one batch's keys, values or header bytes may not
 * pass 2 GiB (the broker's request limit is far below).
 * Thread-safety: no shared state; the GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    PyObject *owner; /* a bytearray whose buffer data is (grown by resizing it), or NULL */
} buf_t;

static int buf_reserve(buf_t *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    if (b->owner) {
        Py_ssize_t want = b->cap * 2 > b->len + extra ? b->cap * 2 : b->len + extra;
        if (PyByteArray_Resize(b->owner, want) < 0) return -1;
        b->data = PyByteArray_AS_STRING(b->owner);
        b->cap = PyByteArray_GET_SIZE(b->owner);
        return 0;
    }
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = PyMem_Realloc(b->data, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->data = p;
    b->cap = cap;
    return 0;
}

static int buf_put(buf_t *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static int buf_i32(buf_t *b, int32_t v) { return buf_put(b, &v, 4); }

static int buf_bit(buf_t *b, Py_ssize_t index, int set) {
    Py_ssize_t byte = index >> 3;
    if (byte >= b->len) {
        if (buf_reserve(b, byte + 1 - b->len) < 0) return -1;
        memset(b->data + b->len, 0, byte + 1 - b->len);
        b->len = byte + 1;
    }
    if (set) b->data[byte] |= (char)(1 << (index & 7));
    return 0;
}

static PyObject *buf_bytes(buf_t *b) {
    PyObject *o = PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
    PyMem_Free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    return o;
}

/* A zigzag varint at *pos (at most 10 bytes); -1 with ValueError set if malformed. */
static int read_varint(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out,
                       Py_ssize_t record) {
    uint64_t raw = 0;
    int shift = 0;
    while (1) {
        if (*pos >= end) {
            PyErr_Format(PyExc_ValueError, "record %zd runs past the end of its batch", record);
            return -1;
        }
        unsigned char byte = p[(*pos)++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) break;
        shift += 7;
        if (shift > 63) {
            PyErr_Format(PyExc_ValueError, "record %zd: a varint is longer than 10 bytes",
                         record);
            return -1;
        }
    }
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

/* A length-prefixed field: appends its bytes to data (and the end offset), sets its
 * validity bit; returns 0, or -1 with ValueError set. */
static int read_field(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, buf_t *offsets,
                      buf_t *valid, Py_ssize_t index, buf_t *data, Py_ssize_t record,
                      int nullable, const char *what) {
    int64_t n;
    if (read_varint(p, end, pos, &n, record) < 0) return -1;
    if (n < 0) {
        if (!nullable || n != -1) {
            PyErr_Format(PyExc_ValueError, "record %zd: %s length %lld", record, what,
                         (long long)n);
            return -1;
        }
        if (valid && buf_bit(valid, index, 0) < 0) return -1;
    } else {
        if (n > end - *pos) {
            PyErr_Format(PyExc_ValueError, "record %zd: its %s runs past the batch", record,
                         what);
            return -1;
        }
        if (data->len + n > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a batch's fields pass 2 GiB");
            return -1;
        }
        if (buf_put(data, p + *pos, (Py_ssize_t)n) < 0) return -1;
        *pos += (Py_ssize_t)n;
        if (valid && buf_bit(valid, index, 1) < 0) return -1;
    }
    return buf_i32(offsets, (int32_t)data->len);
}

/*
 * decode(records: bytes-like, count: int, first_ts: int) -> (
 *     ts (int64 x count: first_ts + each record's delta), key_valid, key_off, key_data,
 *     key_nulls, value_valid, value_off, value_data, value_nulls,
 *     hdr_valid, hdr_off (int32 x count+1), hdr_nulls,
 *     hk_off, hk_data, hv_valid, hv_off, hv_data, hv_nulls, header_count,
 *     min_ts, max_ts)
 * Records must number 0..count-1 (offset deltas) and fill `records` exactly; a timestamp
 * that overflows int64 is malformed. With count 0, min_ts and max_ts are first_ts.
 */
static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    long long first_ts;
    if (!PyArg_ParseTuple(args, "y*nL", &view, &count, &first_ts)) return NULL;
    int64_t min_ts = first_ts, max_ts = first_ts;
    const unsigned char *p = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    buf_t ts = {0}, kv = {0}, ko = {0}, kd = {0}, vv = {0}, vo = {0}, vd = {0};
    buf_t hv = {0}, ho = {0}, hko = {0}, hkd = {0}, hvv = {0}, hvo = {0}, hvd = {0};
    Py_ssize_t key_nulls = 0, value_nulls = 0, hdr_nulls = 0, hv_nulls = 0, headers = 0;
    PyObject *result = NULL;
    /* Sized once up front: no buffer is reallocated, and copied again, while the batch
     * is walked. A record takes at least 7 bytes (length, attributes, two deltas, two
     * field lengths, header count), so a batch that claims more records than its bytes
     * can hold reserves no more than the bytes allow (about 4x the input in all); the
     * key and value bytes together fit in the input; header buffers grow as needed. */
    Py_ssize_t rows = count < 0 ? 0 : (count > end / 7 ? end / 7 : count);
    Py_ssize_t bitmap = rows / 8 + 1;
    if (buf_reserve(&ts, rows * 8) < 0 || buf_reserve(&ko, rows * 4 + 4) < 0 ||
        buf_reserve(&vo, rows * 4 + 4) < 0 || buf_reserve(&ho, rows * 4 + 4) < 0 ||
        buf_reserve(&kv, bitmap) < 0 || buf_reserve(&vv, bitmap) < 0 ||
        buf_reserve(&hv, bitmap) < 0 || buf_reserve(&vd, end) < 0)
        goto done;
    if (buf_i32(&ko, 0) < 0 || buf_i32(&vo, 0) < 0 || buf_i32(&ho, 0) < 0 ||
        buf_i32(&hko, 0) < 0 || buf_i32(&hvo, 0) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t size, ts_delta, offset_delta, n_headers;
        if (read_varint(p, end, &pos, &size, i) < 0) goto done;
        if (size < 1 || size > end - pos) {
            PyErr_Format(PyExc_ValueError, "record %zd runs past its batch", i);
            goto done;
        }
        Py_ssize_t record_end = pos + (Py_ssize_t)size;
        pos += 1; /* record attributes: unused */
        if (read_varint(p, record_end, &pos, &ts_delta, i) < 0) goto done;
        if (read_varint(p, record_end, &pos, &offset_delta, i) < 0) goto done;
        if (offset_delta != i) {
            PyErr_Format(PyExc_ValueError, "record %zd has offset delta %lld", i,
                         (long long)offset_delta);
            goto done;
        }
        int64_t stamp;
        if (__builtin_add_overflow((int64_t)first_ts, ts_delta, &stamp)) {
            PyErr_Format(PyExc_ValueError, "record %zd: its timestamp overflows", i);
            goto done;
        }
        if (i == 0 || stamp < min_ts) min_ts = stamp;
        if (i == 0 || stamp > max_ts) max_ts = stamp;
        if (buf_put(&ts, &stamp, 8) < 0) goto done;
        Py_ssize_t before = kd.len;
        (void)before;
        int64_t peek;
        Py_ssize_t at = pos;
        if (read_varint(p, record_end, &at, &peek, i) < 0) goto done;
        if (peek < 0) key_nulls++;
        if (read_field(p, record_end, &pos, &ko, &kv, i, &kd, i, 1, "key") < 0) goto done;
        at = pos;
        if (read_varint(p, record_end, &at, &peek, i) < 0) goto done;
        if (peek < 0) value_nulls++;
        if (read_field(p, record_end, &pos, &vo, &vv, i, &vd, i, 1, "value") < 0) goto done;
        if (read_varint(p, record_end, &pos, &n_headers, i) < 0) goto done;
        if (n_headers < 0 || n_headers > record_end - pos) {
            PyErr_Format(PyExc_ValueError, "record %zd has %lld headers", i,
                         (long long)n_headers);
            goto done;
        }
        for (int64_t h = 0; h < n_headers; h++) {
            if (read_field(p, record_end, &pos, &hko, NULL, headers, &hkd, i, 0,
                           "header key") < 0)
                goto done;
            at = pos;
            if (read_varint(p, record_end, &at, &peek, i) < 0) goto done;
            if (peek < 0) hv_nulls++;
            if (read_field(p, record_end, &pos, &hvo, &hvv, headers, &hvd, i, 1,
                           "header value") < 0)
                goto done;
            headers++;
        }
        if (n_headers == 0) hdr_nulls++;
        if (buf_bit(&hv, i, n_headers > 0) < 0) goto done;
        if (headers > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "too many headers in one batch");
            goto done;
        }
        if (buf_i32(&ho, (int32_t)headers) < 0) goto done;
        if (pos != record_end) {
            PyErr_Format(PyExc_ValueError,
                         "record %zd is %lld bytes long but its fields take %zd", i,
                         (long long)size, pos - record_end + (Py_ssize_t)size);
            goto done;
        }
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes follow the batch's last record", end - pos);
        goto done;
    }
    /* Bitmaps cover every row even when the last bits are 0. */
    if ((count && (buf_bit(&kv, count - 1, 0) < 0 || buf_bit(&vv, count - 1, 0) < 0 ||
                   buf_bit(&hv, count - 1, 0) < 0)) ||
        (headers && buf_bit(&hvv, headers - 1, 0) < 0))
        goto done;
    PyObject *t0 = buf_bytes(&ts), *t1 = buf_bytes(&kv), *t2 = buf_bytes(&ko),
             *t3 = buf_bytes(&kd), *t4 = buf_bytes(&vv), *t5 = buf_bytes(&vo),
             *t6 = buf_bytes(&vd), *t7 = buf_bytes(&hv), *t8 = buf_bytes(&ho),
             *t9 = buf_bytes(&hko), *t10 = buf_bytes(&hkd), *t11 = buf_bytes(&hvv),
             *t12 = buf_bytes(&hvo), *t13 = buf_bytes(&hvd);
    if (t0 && t1 && t2 && t3 && t4 && t5 && t6 && t7 && t8 && t9 && t10 && t11 && t12 && t13)
        result = Py_BuildValue("(NNNNnNNNnNNnNNNNNnnLL)", t0, t1, t2, t3, key_nulls, t4, t5,
                               t6, value_nulls, t7, t8, hdr_nulls, t9, t10, t11, t12, t13,
                               hv_nulls, headers, (long long)min_ts, (long long)max_ts);
    else {
        Py_XDECREF(t0); Py_XDECREF(t1); Py_XDECREF(t2); Py_XDECREF(t3); Py_XDECREF(t4);
        Py_XDECREF(t5); Py_XDECREF(t6); Py_XDECREF(t7); Py_XDECREF(t8); Py_XDECREF(t9);
        Py_XDECREF(t10); Py_XDECREF(t11); Py_XDECREF(t12); Py_XDECREF(t13);
    }
done:
    PyMem_Free(ts.data); PyMem_Free(kv.data); PyMem_Free(ko.data); PyMem_Free(kd.data);
    PyMem_Free(vv.data); PyMem_Free(vo.data); PyMem_Free(vd.data); PyMem_Free(hv.data);
    PyMem_Free(ho.data); PyMem_Free(hko.data); PyMem_Free(hkd.data); PyMem_Free(hvv.data);
    PyMem_Free(hvo.data); PyMem_Free(hvd.data);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------- encode */

static int put_varint(buf_t *b, int64_t value) {
    uint64_t raw = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    unsigned char tmp[10];
    int n = 0;
    while (raw & ~(uint64_t)0x7F) {
        tmp[n++] = (unsigned char)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    tmp[n++] = (unsigned char)raw;
    return buf_put(b, tmp, n);
}

static int varint_size(int64_t value) {
    uint64_t raw = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    int n = 1;
    while (raw & ~(uint64_t)0x7F) { raw >>= 7; n++; }
    return n;
}

typedef struct {
    Py_buffer valid, off, data;
    int has_valid, has_data;
    Py_ssize_t at; /* the array's offset (slices) */
} column_t;

static int bit_of(const column_t *c, Py_ssize_t i) {
    if (!c->has_valid) return 1;
    Py_ssize_t j = i + c->at;
    return (((const unsigned char *)c->valid.buf)[j >> 3] >> (j & 7)) & 1;
}

static int col_get(PyObject *valid, PyObject *off, PyObject *data, Py_ssize_t at,
                   column_t *c, Py_ssize_t rows) {
    memset(c, 0, sizeof(*c));
    c->at = at;
    if (valid != Py_None) {
        if (PyObject_GetBuffer(valid, &c->valid, PyBUF_SIMPLE) < 0) return -1;
        c->has_valid = 1;
        if (c->valid.len * 8 < at + rows) goto short_buffer;
    }
    if (PyObject_GetBuffer(off, &c->off, PyBUF_SIMPLE) < 0) return -1;
    if (c->off.len < (at + rows + 1) * 4) goto short_buffer;
    if (data != Py_None) {
        if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) return -1;
        c->has_data = 1;
    }
    return 0;
short_buffer:
    PyErr_SetString(PyExc_ValueError, "an Arrow buffer is shorter than its array");
    return -1;
}

static void col_release(column_t *c) {
    if (c->has_valid) PyBuffer_Release(&c->valid);
    if (c->off.buf) PyBuffer_Release(&c->off);
    if (c->has_data) PyBuffer_Release(&c->data);
}

/* The bytes of row i of a binary/string column (NULL for null); -1 length on error. */
static const char *col_value(const column_t *c, Py_ssize_t i, Py_ssize_t *len) {
    const int32_t *o = (const int32_t *)c->off.buf;
    int32_t a = o[i + c->at], b = o[i + c->at + 1];
    if (a < 0 || b < a || (Py_ssize_t)b > (c->has_data ? c->data.len : 0)) {
        *len = -1;
        return NULL;
    }
    *len = b - a;
    return c->has_data ? (const char *)c->data.buf + a : "";
}

static int put_field(buf_t *b, const column_t *c, Py_ssize_t i) {
    if (!bit_of(c, i)) return put_varint(b, -1);
    Py_ssize_t len;
    const char *v = col_value(c, i, &len);
    if (len < 0) {
        PyErr_SetString(PyExc_ValueError, "an Arrow offset is out of range");
        return -1;
    }
    if (put_varint(b, len) < 0) return -1;
    return buf_put(b, v, len);
}

static Py_ssize_t field_size(const column_t *c, Py_ssize_t i) {
    if (!bit_of(c, i)) return 1;
    Py_ssize_t len;
    col_value(c, i, &len);
    if (len < 0) return -1;
    return varint_size(len) + len;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    Py_ssize_t n, key_at, value_at, hdr_at, hk_at, hv_at, prefix = 0;
    long long first_ts;
    PyObject *ts_o, *kvalid, *koff, *kdata, *vvalid, *voff, *vdata, *hvalid, *hoff;
    PyObject *hkoff, *hkdata, *hvvalid, *hvoff, *hvdata;
    if (!PyArg_ParseTuple(args, "nLOOOOnOOOnOOnOOnOOOn|n", &n, &first_ts, &ts_o, &kvalid,
                          &koff, &kdata, &key_at, &vvalid, &voff, &vdata, &value_at, &hvalid,
                          &hoff, &hdr_at, &hkoff, &hkdata, &hk_at, &hvvalid, &hvoff, &hvdata,
                          &hv_at, &prefix))
        return NULL;
    if (prefix < 0) {
        PyErr_SetString(PyExc_ValueError, "prefix must be >= 0");
        return NULL;
    }
    Py_buffer ts;
    column_t key, value, hdr, hkey, hval;
    int have_ts = 0, have_k = 0, have_v = 0, have_h = 0, have_hk = 0, have_hv = 0;
    buf_t out = {0};
    PyObject *result = NULL, *array = NULL;
    if (PyObject_GetBuffer(ts_o, &ts, PyBUF_SIMPLE) < 0) goto done;
    have_ts = 1;
    if (ts.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "the timestamp buffer is shorter than the batch");
        goto done;
    }
    if (col_get(kvalid, koff, kdata, key_at, &key, n) < 0) goto done;
    have_k = 1;
    if (col_get(vvalid, voff, vdata, value_at, &value, n) < 0) goto done;
    have_v = 1;
    if (col_get(hvalid, hoff, Py_None, hdr_at, &hdr, n) < 0) goto done;
    have_h = 1;
    const int32_t *hoffs = (const int32_t *)hdr.off.buf;
    Py_ssize_t total_headers = hoffs[hdr_at + n] - hoffs[hdr_at];
    Py_ssize_t first_header = hoffs[hdr_at];
    if (total_headers < 0 || first_header < 0) {
        PyErr_SetString(PyExc_ValueError, "header offsets run backwards");
        goto done;
    }
    if (col_get(Py_None, hkoff, hkdata, hk_at, &hkey, first_header + total_headers) < 0)
        goto done;
    have_hk = 1;
    if (col_get(hvvalid, hvoff, hvdata, hv_at, &hval, first_header + total_headers) < 0)
        goto done;
    have_hv = 1;
    /* The output sized once: every field's bytes (at most its column's whole data
     * buffer) plus a record's framing (length, attributes, deltas, field lengths, header
     * count: at most 36 bytes) and each header's two lengths (at most 10). Arrays that
     * pass Arrow's validation stay within it; others grow the bytearray. */
    array = PyByteArray_FromStringAndSize(NULL, prefix + n * 40 + total_headers * 10 +
                                          key.data.len + value.data.len + hkey.data.len +
                                          hval.data.len);
    if (array == NULL) goto done;
    out.data = PyByteArray_AS_STRING(array);
    out.cap = PyByteArray_GET_SIZE(array);
    out.owner = array;
    memset(out.data, 0, prefix);
    out.len = prefix;
    const int64_t *tsv = (const int64_t *)ts.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t h0 = 0, h1 = 0;
        if (bit_of(&hdr, i)) {
            h0 = hoffs[hdr_at + i];
            h1 = hoffs[hdr_at + i + 1];
            if (h0 < first_header || h1 < h0 || h1 > first_header + total_headers) {
                PyErr_SetString(PyExc_ValueError, "header offsets out of range");
                goto done;
            }
        }
        int64_t delta = tsv[i] - first_ts;
        Py_ssize_t ks = field_size(&key, i), vs = field_size(&value, i);
        if (ks < 0 || vs < 0) {
            PyErr_SetString(PyExc_ValueError, "an Arrow offset is out of range");
            goto done;
        }
        Py_ssize_t body = 1 + varint_size(delta) + varint_size(i) + ks + vs +
                          varint_size(h1 - h0);
        for (Py_ssize_t h = h0; h < h1; h++) {
            Py_ssize_t a = field_size(&hkey, h), b = field_size(&hval, h);
            if (a < 0 || b < 0) {
                PyErr_SetString(PyExc_ValueError, "an Arrow offset is out of range");
                goto done;
            }
            body += a + b;
        }
        if (put_varint(&out, body) < 0 || buf_put(&out, "\0", 1) < 0 ||
            put_varint(&out, delta) < 0 || put_varint(&out, i) < 0 ||
            put_field(&out, &key, i) < 0 || put_field(&out, &value, i) < 0 ||
            put_varint(&out, h1 - h0) < 0)
            goto done;
        for (Py_ssize_t h = h0; h < h1; h++)
            if (put_field(&out, &hkey, h) < 0 || put_field(&out, &hval, h) < 0) goto done;
    }
    if (PyByteArray_Resize(array, out.len) < 0) goto done;
    result = array;
    array = NULL;
done:
    Py_XDECREF(array);
    if (have_ts) PyBuffer_Release(&ts);
    if (have_k) col_release(&key);
    if (have_v) col_release(&value);
    if (have_h) col_release(&hdr);
    if (have_hk) col_release(&hkey);
    if (have_hv) col_release(&hval);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Kafka v2 records -> Arrow column buffers."},
    {"encode", encode, METH_VARARGS, "Arrow column buffers -> Kafka v2 records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_v2codec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__v2codec(void) { return PyModule_Create(&module); }
