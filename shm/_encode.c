/* shm._encode: the codec's one-pass encode loops in C, and the replies' offset msgIds.
 *
 * Native twins of `shm.codec.encode_messages_v4_py` (coalesced single sends) and
 * `shm.codec.encode_batch_v4_py` (a client batch body). The Python functions stay the
 * reference: both pairs run over the same inputs in tests/unit/test_native_encode.py and must give
 * the same bytes, the same side lists, and None (take the general path) for the same inputs.
 * In Python each message costs ~3.7 us of interpreter calls; here it is one pass over the
 * input with no object per message but the ones the caller keeps (sizes, queue keys).
 *
 * A V1 record with an IPv4 born host and store host (spec 2.1), big-endian:
 *   TOTALSIZE i32 | MAGIC i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 (0) |
 *   PHYSICALOFFSET i64 (0) | SYSFLAG i32 (0) | BORNTIMESTAMP i64 | BORNHOST 8 |
 *   STORETIMESTAMP i64 (0) | STOREHOST 8 | RECONSUMETIMES i32 | PREPAREDTXOFFSET i64 (0) |
 *   BODYLENGTH i32 | BODY | TOPICLENGTH u8 | TOPIC | PROPERTIESLENGTH i16 | PROPERTIES
 * The writer patches the offsets and the store time when it places the record.
 *
 * Anything unusual returns None, never an error: the caller then takes the general path, which
 * names what is wrong. The body CRC is the caller's function (ISA-L's crc32), called per body.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FIXED_SIZE 88 /* everything before TOPICLENGTH */
#define RECORD_BASE 91 /* FIXED_SIZE + TOPICLENGTH + PROPERTIESLENGTH */
#define MESSAGE_MAGIC ((int32_t)0xDAA320A7)
#define MAX_TOPIC_BYTES 127
#define MAX_PROPERTIES_BYTES 32767
#define MAX_RECORD_OVERHEAD (64 * 1024)
#define BATCH_HEAD_SIZE 20 /* total size, magic (0), body CRC (0), flag, body length */

/* -- a growing output buffer (a bytearray, resized geometrically) ------------------------------ */

typedef struct {
    PyObject *array;
    Py_ssize_t used;
} Out;

static int out_reserve(Out *out, Py_ssize_t more) {
    Py_ssize_t need = out->used + more, have = PyByteArray_GET_SIZE(out->array);
    if (need <= have)
        return 0;
    Py_ssize_t grow = have + have / 2;
    return PyByteArray_Resize(out->array, need > grow ? need : grow);
}

static inline char *out_at(Out *out) { return PyByteArray_AS_STRING(out->array) + out->used; }

static inline void put32(char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (char)(u >> 24); p[1] = (char)(u >> 16); p[2] = (char)(u >> 8); p[3] = (char)u;
}

static inline void put64(char *p, int64_t v) {
    put32(p, (int32_t)((uint64_t)v >> 32));
    put32(p + 4, (int32_t)(uint64_t)v);
}

static inline int32_t get32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
}

/* crc_fn(memoryview) & 0x7FFFFFFF, 0 for an empty body; -1 with an exception set on failure */
static int64_t body_crc(PyObject *crc_fn, const char *body, Py_ssize_t len) {
    if (len == 0)
        return 0;
    PyObject *view = PyMemoryView_FromMemory((char *)body, len, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(crc_fn, view);
    Py_DECREF(view);
    if (crc == NULL)
        return -1;
    unsigned long value = PyLong_AsUnsignedLongMask(crc);
    Py_DECREF(crc);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    return (int64_t)(value & 0x7FFFFFFF);
}

/* The fixed part of a record, TOTALSIZE through BODYLENGTH. */
static void put_fixed(char *p, int32_t size, int32_t crc, int32_t queue_id, int32_t flag, int64_t born_ts,
                      const char *born, const char *store_host, int32_t reconsume, int32_t body_len) {
    put32(p, size); put32(p + 4, MESSAGE_MAGIC); put32(p + 8, crc); put32(p + 12, queue_id);
    put32(p + 16, flag); put64(p + 20, 0); put64(p + 28, 0); put32(p + 36, 0); put64(p + 40, born_ts);
    memcpy(p + 48, born, 8); put64(p + 56, 0); memcpy(p + 64, store_host, 8); put32(p + 72, reconsume);
    put64(p + 76, 0); put32(p + 84, body_len);
}

/* An exact int within [lo, hi], or -1 (no exception left set) for anything else. */
static int exact_int(PyObject *value, long long lo, long long hi, long long *result) {
    if (value == NULL || !PyLong_CheckExact(value))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *result = v;
    return 0;
}

static int item_int(PyObject *item, PyObject *key, long long lo, long long hi, long long *result) {
    PyObject *value = PyDict_GetItemWithError(item, key);
    if (value == NULL) {
        if (PyErr_Occurred())
            return -1;
        *result = 0;
        return 0;
    }
    return exact_int(value, lo, hi, result);
}

/* -- coalesced single sends ------------------------------------------------------------------- */

static PyObject *s_topic, *s_queue_id, *s_body_size, *s_properties, *s_flag, *s_reconsume, *s_born_ts,
    *s_refused, *s_wait, *s_false, *s_uniq_key;

/* The stored properties of one message, from its layout: literals (bytes) and property names
 * (str) alternating, literal first and last. 1 = written, 0 = take the general path, -1 = error. */
static int put_properties(Out *scratch, PyObject *layout, PyObject *props) {
    Py_ssize_t n = PyTuple_GET_SIZE(layout);
    scratch->used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyTuple_GET_ITEM(layout, i);
        const char *text;
        Py_ssize_t len;
        if (i % 2 == 0) {
            text = PyBytes_AS_STRING(piece);
            len = PyBytes_GET_SIZE(piece);
        } else {
            PyObject *value = PyDict_GetItemWithError(props, piece);
            if (value == NULL)
                return PyErr_Occurred() ? -1 : 0;
            if (!PyUnicode_Check(value) || (text = PyUnicode_AsUTF8AndSize(value, &len)) == NULL) {
                PyErr_Clear();
                return 0;
            }
            if (len == 0 || memchr(text, 2, len) != NULL)
                return 0;
        }
        if (scratch->used + len > MAX_PROPERTIES_BYTES)
            return 0;
        if (out_reserve(scratch, len) < 0)
            return -1;
        memcpy(out_at(scratch), text, len);
        scratch->used += len;
    }
    return 1;
}

/* 1 when any value is not a str, is empty or holds 0x02 (the Python path's checks of every value,
 * stored or not: WAIT too). */
static int odd_values(PyObject *props) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(props, &pos, &key, &value)) {
        Py_ssize_t len;
        const char *text;
        if (!PyUnicode_Check(value) || (text = PyUnicode_AsUTF8AndSize(value, &len)) == NULL) {
            PyErr_Clear();
            return 1;
        }
        if (len == 0 || memchr(text, 2, len) != NULL)
            return 1;
    }
    return 0;
}

typedef struct {
    PyObject *sizes, *queue_keys, *topics, *queue_ids, *uniq_keys;
} Columns;

/* What one request's messages share, worked out once: the coalesced sends of one client carry
 * the same property names in the same order, and a few topic-queue pairs. Owned references. */
#define MEMO_KEYS 8
typedef struct {
    PyObject *names, *layout; /* the last message's property names (a tuple) and their layout */
    PyObject *topics[MEMO_KEYS], *keys[MEMO_KEYS]; /* "topic-queueId" strings made so far */
    long long queue_ids[MEMO_KEYS];
    int count;
} Memo;

static void memo_clear(Memo *m) {
    Py_XDECREF(m->names); Py_XDECREF(m->layout);
    for (int i = 0; i < m->count; i++) {
        Py_DECREF(m->topics[i]); Py_DECREF(m->keys[i]);
    }
}

/* 1 when `props` has exactly the names of the memo's tuple, in order; -1 on error. */
static int same_names(PyObject *props, PyObject *names) {
    if (names == NULL || PyDict_GET_SIZE(props) != PyTuple_GET_SIZE(names))
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(props, &pos, &key, &value)) {
        int same = PyObject_RichCompareBool(key, PyTuple_GET_ITEM(names, i++), Py_EQ);
        if (same <= 0)
            return same;
    }
    return 1;
}

/* The layout of `props` (a new reference: a tuple, Py_None, or NULL with an exception set). */
static PyObject *layout_of(Memo *m, PyObject *props, PyObject *cluster, PyObject *layout_fn) {
    int same = same_names(props, m->names);
    if (same < 0)
        return NULL;
    if (!same) {
        PyObject *names = PySequence_Tuple(props);
        if (names == NULL)
            return NULL;
        PyObject *layout = PyObject_CallFunctionObjArgs(layout_fn, names, cluster, NULL);
        if (layout == NULL) {
            Py_DECREF(names);
            return NULL;
        }
        Py_XSETREF(m->names, names);
        Py_XSETREF(m->layout, layout);
    }
    return Py_NewRef(m->layout);
}

/* "topic-queueId" (a new reference). */
static PyObject *queue_key(Memo *m, PyObject *topic, long long queue_id) {
    for (int i = 0; i < m->count; i++)
        if (m->queue_ids[i] == queue_id && (m->topics[i] == topic || PyUnicode_Compare(m->topics[i], topic) == 0))
            return Py_NewRef(m->keys[i]);
    PyObject *key = PyUnicode_FromFormat("%U-%lld", topic, queue_id);
    if (key != NULL && m->count < MEMO_KEYS) {
        m->topics[m->count] = Py_NewRef(topic);
        m->keys[m->count] = Py_NewRef(key);
        m->queue_ids[m->count++] = queue_id;
    }
    return key;
}

static void columns_clear(Columns *c) {
    Py_XDECREF(c->sizes); Py_XDECREF(c->queue_keys); Py_XDECREF(c->topics); Py_XDECREF(c->queue_ids);
    Py_XDECREF(c->uniq_keys);
}

static int append_new(PyObject *list, PyObject *value) {
    if (value == NULL)
        return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* One message into `out`: 1 = done, 0 = take the general path, -1 = error. */
static int encode_one(PyObject *item, const char *body, Py_ssize_t body_len, Py_ssize_t *at, const char *born,
                      const char *store_host, long long max_body, PyObject *cluster, PyObject *layout_fn,
                      PyObject *crc_fn, PyObject *empty, Out *out, Out *scratch, Columns *c, Memo *memo,
                      int *waits) {
    if (!PyDict_CheckExact(item))
        return 0;
    PyObject *topic = PyDict_GetItemWithError(item, s_topic);
    PyObject *queue_id_obj = PyDict_GetItemWithError(item, s_queue_id);
    PyObject *props = PyDict_GetItemWithError(item, s_properties);
    if (PyErr_Occurred())
        return -1;
    long long size, queue_id, flag, reconsume, born_ts;
    if (topic == NULL || !PyUnicode_CheckExact(topic) || queue_id_obj == NULL
        || exact_int(PyDict_GetItemWithError(item, s_body_size), 0, max_body, &size) < 0
        || exact_int(queue_id_obj, INT32_MIN, INT32_MAX, &queue_id) < 0
        || item_int(item, s_flag, INT32_MIN, INT32_MAX, &flag) < 0
        || item_int(item, s_reconsume, INT32_MIN, INT32_MAX, &reconsume) < 0
        || item_int(item, s_born_ts, INT64_MIN, INT64_MAX, &born_ts) < 0)
        return PyErr_Occurred() ? -1 : 0;
    int refused = PyDict_Contains(item, s_refused);
    if (refused != 0)
        return refused < 0 ? -1 : 0;
    if (props == NULL || props == Py_None)
        props = empty;
    if (!PyDict_CheckExact(props))
        return 0;
    if (*at + size > body_len)
        return 0;
    PyObject *layout = layout_of(memo, props, cluster, layout_fn);
    if (layout == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int rc = layout == Py_None || !PyTuple_CheckExact(layout) || odd_values(props) ? 0
           : put_properties(scratch, layout, props);
    Py_DECREF(layout);
    if (rc <= 0)
        return rc;
    Py_ssize_t topic_len;
    const char *topic_raw = PyUnicode_AsUTF8AndSize(topic, &topic_len);
    if (topic_raw == NULL)
        return -1;
    if (topic_len <= 0 || topic_len > MAX_TOPIC_BYTES)
        return 0;
    if (!*waits) {
        PyObject *wait = PyDict_GetItemWithError(props, s_wait);
        if (wait == NULL && PyErr_Occurred())
            return -1;
        *waits = wait == NULL || PyUnicode_Compare(wait, s_false) != 0;
    }
    const char *piece = body + *at;
    int64_t crc = body_crc(crc_fn, piece, (Py_ssize_t)size);
    if (crc < 0)
        return -1;
    Py_ssize_t props_len = scratch->used, record_size = RECORD_BASE + size + topic_len + props_len;
    if (out_reserve(out, record_size) < 0)
        return -1;
    char *p = out_at(out);
    put_fixed(p, (int32_t)record_size, (int32_t)crc, (int32_t)queue_id, (int32_t)flag, born_ts, born, store_host,
              (int32_t)reconsume, (int32_t)size);
    p += FIXED_SIZE;
    memcpy(p, piece, size); p += size;
    *p++ = (char)topic_len;
    memcpy(p, topic_raw, topic_len); p += topic_len;
    *p++ = (char)(props_len >> 8); *p++ = (char)props_len;
    memcpy(p, PyByteArray_AS_STRING(scratch->array), props_len);
    out->used += record_size;
    *at += size;
    PyObject *uniq = PyDict_GetItemWithError(props, s_uniq_key);
    if (uniq == NULL && PyErr_Occurred())
        return -1;
    if (append_new(c->sizes, PyLong_FromSsize_t(record_size)) < 0
        || append_new(c->queue_keys, queue_key(memo, topic, queue_id)) < 0
        || PyList_Append(c->topics, topic) < 0 || PyList_Append(c->queue_ids, queue_id_obj) < 0
        || PyList_Append(c->uniq_keys, uniq ? uniq : Py_None) < 0)
        return -1;
    return 1;
}

static PyObject *encode_messages_v4(PyObject *self, PyObject *args) {
    PyObject *messages, *cluster, *layout_fn, *crc_fn;
    Py_buffer body, born, store_host;
    long long max_body;
    if (!PyArg_ParseTuple(args, "O!y*y*y*LUOO:encode_messages_v4", &PyList_Type, &messages, &body, &born,
                          &store_host, &max_body, &cluster, &layout_fn, &crc_fn))
        return NULL;
    PyObject *result = NULL, *empty = PyDict_New();
    Out out = {PyByteArray_FromStringAndSize(NULL, body.len + PyList_GET_SIZE(messages) * 256), 0};
    Out scratch = {PyByteArray_FromStringAndSize(NULL, 512), 0};
    Columns c = {PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0)};
    Memo memo = {0};
    if (empty == NULL || out.array == NULL || scratch.array == NULL || !c.sizes || !c.queue_keys || !c.topics
        || !c.queue_ids || !c.uniq_keys)
        goto done;
    if (born.len != 8 || store_host.len != 8) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t at = 0;
    int waits = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        int rc = encode_one(PyList_GET_ITEM(messages, i), body.buf, body.len, &at, born.buf, store_host.buf,
                            max_body, cluster, layout_fn, crc_fn, empty, &out, &scratch, &c, &memo, &waits);
        if (rc < 0)
            goto done;
        if (rc == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (PyByteArray_Resize(out.array, out.used) < 0)
        goto done;
    result = Py_BuildValue("(OOOOOON)", out.array, c.sizes, c.queue_keys, c.topics, c.queue_ids, c.uniq_keys,
                           PyBool_FromLong(waits));
done:
    PyBuffer_Release(&body); PyBuffer_Release(&born); PyBuffer_Release(&store_host);
    Py_XDECREF(empty); Py_XDECREF(out.array); Py_XDECREF(scratch.array);
    columns_clear(&c);
    memo_clear(&memo);
    return result;
}

/* -- a client batch body ------------------------------------------------------------------------ */

/* UNIQ_KEY of a message's own ASCII properties, as `shm.codec.find_uniq_key_ascii` finds it: the
 * last "UNIQ_KEY\x01" at the start or after a 0x02, up to the next 0x02. Anything else (an empty
 * value, the name inside another pair) goes to `fallback`, the Python function with Java's rules.
 * A new reference, or NULL with an exception set. */
static PyObject *uniq_key(const unsigned char *props, Py_ssize_t len, PyObject *fallback) {
    static const char name[] = "UNIQ_KEY\x01";
    const Py_ssize_t name_len = sizeof name - 1;
    for (Py_ssize_t at = len - name_len; at >= 0; at--) {
        if (props[at] != 'U' || memcmp(props + at, name, name_len) != 0)
            continue;
        if (at == 0 || props[at - 1] == 2) {
            const unsigned char *value = props + at + name_len, *end = memchr(value, 2, props + len - value);
            Py_ssize_t value_len = (end ? end : props + len) - value;
            if (value_len > 0)
                return PyUnicode_DecodeASCII((const char *)value, value_len, NULL);
        }
        PyObject *own = PyBytes_FromStringAndSize((const char *)props, len);
        if (own == NULL)
            return NULL;
        PyObject *key = PyObject_CallOneArg(fallback, own);
        Py_DECREF(own);
        return key;
    }
    Py_RETURN_NONE;
}

static PyObject *encode_batch_v4(PyObject *self, PyObject *args) {
    Py_buffer data, topic, born, store_host, suffix;
    long long queue_id, born_ts, max_size;
    Py_ssize_t limit;
    PyObject *queue_id_obj, *crc_fn, *uniq_fallback;
    if (!PyArg_ParseTuple(args, "y*y*OLy*y*y*LnOO:encode_batch_v4", &data, &topic, &queue_id_obj, &born_ts, &born,
                          &store_host, &suffix, &max_size, &limit, &crc_fn, &uniq_fallback))
        return NULL;
    PyObject *result = NULL, *sizes = PyList_New(0), *uniq_keys = PyList_New(0);
    Out out = {PyByteArray_FromStringAndSize(NULL, data.len + data.len / 4 + 256), 0};
    if (sizes == NULL || uniq_keys == NULL || out.array == NULL)
        goto done;
    const unsigned char *buf = data.buf;
    const Py_ssize_t end = data.len, suffix_len = suffix.len, topic_len = topic.len;
    const long long largest = max_size + MAX_RECORD_OVERHEAD;
    Py_ssize_t at = 0, count = 0;
    int unusual = topic_len <= 0 || topic_len > MAX_TOPIC_BYTES || born.len != 8 || store_host.len != 8
                  || exact_int(queue_id_obj, INT32_MIN, INT32_MAX, &queue_id) < 0;
    while (!unusual && at < end) {
        if (count >= limit || end - at < BATCH_HEAD_SIZE + 2) {
            unusual = 1;
            break;
        }
        int32_t size = get32(buf + at), flag = get32(buf + at + 12), body_len = get32(buf + at + 16);
        Py_ssize_t props_at = at + BATCH_HEAD_SIZE + (Py_ssize_t)body_len;
        if (body_len < 0 || props_at + 2 > end || body_len > max_size || get32(buf + at + 4) != 0) {
            unusual = 1; /* (a magic other than 0 is refused by the general path) */
            break;
        }
        int16_t own_len = (int16_t)(buf[props_at] << 8 | buf[props_at + 1]);
        if (own_len < 0 || (Py_ssize_t)size != BATCH_HEAD_SIZE + body_len + 2 + own_len || at + size > end) {
            unusual = 1;
            break;
        }
        const unsigned char *own = buf + props_at + 2;
        for (int i = 0; i < own_len; i++)
            if (own[i] >= 0x80)
                unusual = 1;
        /* a message's own DELAY or TIMER_*: the general path refuses the batch (a batch is never delayed) */
        for (int i = 0; i + 6 <= own_len && !unusual; i++)
            if ((own[i] == 'D' && memcmp(own + i, "DELAY\x01", 6) == 0)
                || (own[i] == 'T' && memcmp(own + i, "TIMER_", 6) == 0))
                unusual = 1;
        /* own properties, then the batch's after a 0x02 unless own is empty or ends with one */
        int sep = suffix_len && own_len && own[own_len - 1] != 2;
        Py_ssize_t props_len = own_len + (suffix_len ? sep + suffix_len : 0);
        long long record_size = RECORD_BASE + (long long)body_len + topic_len + props_len;
        if (unusual || props_len > MAX_PROPERTIES_BYTES || record_size > largest) {
            unusual = 1;
            break;
        }
        int64_t crc = body_crc(crc_fn, (const char *)buf + at + BATCH_HEAD_SIZE, body_len);
        if (crc < 0 || out_reserve(&out, (Py_ssize_t)record_size) < 0)
            goto done;
        char *p = out_at(&out);
        put_fixed(p, (int32_t)record_size, (int32_t)crc, (int32_t)queue_id, flag, born_ts, born.buf,
                  store_host.buf, 0, body_len);
        p += FIXED_SIZE;
        memcpy(p, buf + at + BATCH_HEAD_SIZE, body_len); p += body_len;
        *p++ = (char)topic_len;
        memcpy(p, topic.buf, topic_len); p += topic_len;
        *p++ = (char)(props_len >> 8); *p++ = (char)props_len;
        memcpy(p, own, own_len); p += own_len;
        if (sep)
            *p++ = 2;
        if (suffix_len)
            memcpy(p, suffix.buf, suffix_len);
        out.used += (Py_ssize_t)record_size;
        if (append_new(sizes, PyLong_FromLongLong(record_size)) < 0
            || append_new(uniq_keys, uniq_key(own, own_len, uniq_fallback)) < 0)
            goto done;
        at += size;
        count++;
    }
    if (unusual || count == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyByteArray_Resize(out.array, out.used) < 0)
        goto done;
    result = PyTuple_Pack(3, out.array, sizes, uniq_keys);
done:
    PyBuffer_Release(&data); PyBuffer_Release(&topic); PyBuffer_Release(&born); PyBuffer_Release(&store_host);
    PyBuffer_Release(&suffix);
    Py_XDECREF(sizes); Py_XDECREF(uniq_keys); Py_XDECREF(out.array);
    return result;
}

/* offset_ids(store_host, physical, indices): the offset msgId of each message at `indices`, as
 * `shm.codec.offset_ids_py` makes them: the 8-byte store host, then the physical offset as a
 * big-endian i64, in 32 upper-case hex digits (shm.codec.offset_msg_id). An index outside
 * `physical` (negatives too: the caller answers refused messages elsewhere) is an IndexError. */
static const char HEX[] = "0123456789ABCDEF";

static inline void put_hex(Py_UCS1 *out, const unsigned char *raw, int count) {
    for (int i = 0; i < count; i++) {
        out[2 * i] = (Py_UCS1)HEX[raw[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)HEX[raw[i] & 15];
    }
}

static PyObject *offset_id(const Py_UCS1 *host_hex, PyObject *physical, PyObject *index) {
    Py_ssize_t at = PyLong_AsSsize_t(index);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (at < 0 || at >= PyList_GET_SIZE(physical)) {
        PyErr_Format(PyExc_IndexError, "offset_ids: index %zd outside the %zd results", at, PyList_GET_SIZE(physical));
        return NULL;
    }
    long long offset = PyLong_AsLongLong(PyList_GET_ITEM(physical, at));
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    unsigned char raw[8];
    for (int i = 7; i >= 0; i--, offset = (long long)((unsigned long long)offset >> 8))
        raw[i] = (unsigned char)offset;
    PyObject *id = PyUnicode_New(32, 127);
    if (id == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(id);
    memcpy(out, host_hex, 16);
    put_hex(out + 16, raw, 8);
    return id;
}

static PyObject *offset_ids(PyObject *self, PyObject *args) {
    Py_buffer host;
    PyObject *physical, *indices;
    if (!PyArg_ParseTuple(args, "y*O!O!", &host, &PyList_Type, &physical, &PyList_Type, &indices))
        return NULL;
    PyObject *ids = NULL;
    if (host.len != 8) {
        PyErr_Format(PyExc_ValueError, "offset_ids: an IPv4 store host is 8 bytes, not %zd", host.len);
        goto done;
    }
    Py_UCS1 host_hex[16];
    put_hex(host_hex, host.buf, 8);
    Py_ssize_t n = PyList_GET_SIZE(indices);
    if ((ids = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *id = offset_id(host_hex, physical, PyList_GET_ITEM(indices, k));
        if (id == NULL) {
            Py_CLEAR(ids);
            goto done;
        }
        PyList_SET_ITEM(ids, k, id);
    }
done:
    PyBuffer_Release(&host);
    return ids;
}

static PyMethodDef methods[] = {
    {"encode_messages_v4", encode_messages_v4, METH_VARARGS,
     "encode_messages_v4(messages, body, born, store_host, max_body, cluster, layout_fn, crc_fn)\n"
     "-> (records, sizes, queue_keys, topics, queue_ids, uniq_keys, waits) or None"},
    {"encode_batch_v4", encode_batch_v4, METH_VARARGS,
     "encode_batch_v4(data, topic_raw, queue_id, born_ts, born, store_host, suffix, max_size, limit, crc_fn,\n"
     "                uniq_fallback) -> (records, sizes, uniq_keys) or None"},
    {"offset_ids", offset_ids, METH_VARARGS,
     "offset_ids(store_host, physical, indices) -> [offset msgId of physical[i] for i in indices]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shm._encode", NULL, -1, methods, NULL, NULL, NULL, NULL};

static PyObject *intern(const char *text) { return PyUnicode_InternFromString(text); }

PyMODINIT_FUNC PyInit__encode(void) {
    if (!(s_topic = intern("topic")) || !(s_queue_id = intern("queueId")) || !(s_body_size = intern("bodySize"))
        || !(s_properties = intern("properties")) || !(s_flag = intern("flag"))
        || !(s_reconsume = intern("reconsumeTimes")) || !(s_born_ts = intern("bornTimestamp"))
        || !(s_refused = intern("_refused")) || !(s_wait = intern("WAIT"))
        || !(s_false = intern("false")) || !(s_uniq_key = intern("UNIQ_KEY")))
        return NULL;
    return PyModule_Create(&module);
}
