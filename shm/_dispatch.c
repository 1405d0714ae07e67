/* shm._dispatch: the reput dispatcher's scan of the CommitLog in C.
 *
 * The native twin of the hot loop of `shm.dispatch.DispatchBatch.scan`/`_add`, which stays the
 * reference: tests/test_native_dispatch.py runs both over the same logs and requires the same
 * batch afterwards (ConsumeQueue entries per queue, index requests, where each stopped). In
 * Python a record costs several microseconds of interpreter calls; here it is one pass with
 * only the objects the batch keeps.
 *
 * It reads what nearly every record is: a V1 record with IPv4 hosts whose topic and properties
 * are ASCII, big-endian (spec 2.1):
 *   TOTALSIZE i32 | MAGIC i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
 *   PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 8 | STORETIMESTAMP i64 |
 *   STOREHOST 8 | RECONSUMETIMES i32 | PREPAREDTXOFFSET i64 | BODYLENGTH i32 | BODY |
 *   TOPICLENGTH u8 | TOPIC | PROPERTIESLENGTH i16 | PROPERTIES
 * and stops in front of anything else: a blank, damage, an IPv6 host, non-ASCII text, the
 * schedule topic (its tag slot is a delivery time). The caller then takes that one record
 * through the Python path, which handles it or names what is wrong, and calls again.
 *
 * Properties are "NAME\x01VALUE\x02" pairs. A value is what follows a pair's first \x01; of
 * pairs with the same name, the last with a non-empty value wins (as `shm.dispatch._value`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FIXED_SIZE 88 /* everything before TOPICLENGTH */
#define RECORD_BASE 91 /* FIXED_SIZE + TOPICLENGTH + PROPERTIESLENGTH */
#define MESSAGE_MAGIC ((int32_t)0xDAA320A7)
#define MAX_TOPIC_BYTES 127
#define V6_FLAGS 0x30 /* FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6 */
#define TRANSACTION_MASK 0xC
#define TRANSACTION_COMMIT 0x8
#define NAME_VALUE 1
#define PAIR_END 2
#define TOPIC_CACHE 8
#define QUEUE_CACHE 16

static inline int32_t get32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3]);
}

static inline int64_t get64(const unsigned char *p) {
    return (int64_t)((uint64_t)(uint32_t)get32(p) << 32 | (uint64_t)(uint32_t)get32(p + 4));
}

static int is_ascii(const unsigned char *p, Py_ssize_t n) {
    unsigned char any = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        any |= p[i];
    return any < 0x80;
}

/* A str of ASCII bytes, built without a UTF-8 decode. */
static PyObject *ascii_str(const unsigned char *p, Py_ssize_t n) {
    PyObject *text = PyUnicode_New(n, 127);
    if (text)
        memcpy(PyUnicode_DATA(text), p, (size_t)n);
    return text;
}

/* Java's String.hashCode of ASCII text (one UTF-16 unit a byte), as a signed 32-bit int. */
static int32_t java_hash(const unsigned char *p, Py_ssize_t n) {
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        h = 31 * h + p[i];
    return (int32_t)h;
}

typedef struct {
    const unsigned char *at;
    Py_ssize_t len; /* -1: absent (or only empty values) */
} Value;

/* TAGS, KEYS and UNIQ_KEY of a properties text, in one pass over its pairs. */
static void find_values(const unsigned char *p, Py_ssize_t n, Value *tags, Value *keys, Value *uniq) {
    Py_ssize_t at = 0;
    tags->len = keys->len = uniq->len = -1;
    while (at < n) { /* each round consumes one pair */
        const unsigned char *pair = p + at;
        const unsigned char *end = memchr(pair, PAIR_END, (size_t)(n - at));
        Py_ssize_t pair_len = end ? end - pair : n - at;
        const unsigned char *sep = memchr(pair, NAME_VALUE, (size_t)pair_len);
        at += pair_len + 1;
        if (!sep || sep + 1 == pair + pair_len)
            continue; /* no value, or an empty one: Java skips it */
        Py_ssize_t name_len = sep - pair;
        Value *slot = NULL;
        if (name_len == 4 && memcmp(pair, "TAGS", 4) == 0)
            slot = tags;
        else if (name_len == 4 && memcmp(pair, "KEYS", 4) == 0)
            slot = keys;
        else if (name_len == 8 && memcmp(pair, "UNIQ_KEY", 8) == 0)
            slot = uniq;
        if (slot) {
            slot->at = sep + 1;
            slot->len = pair + pair_len - (sep + 1);
        }
    }
}

typedef struct {
    unsigned char raw[MAX_TOPIC_BYTES];
    Py_ssize_t len;
    PyObject *text; /* owned */
} TopicSlot;

typedef struct {
    PyObject *topic; /* borrowed from the topic cache */
    int32_t queue_id;
    PyObject *entries; /* borrowed from the caller's dict */
} QueueSlot;

typedef struct {
    TopicSlot topics[TOPIC_CACHE];
    int topic_count, topic_next;
    QueueSlot queues[QUEUE_CACHE];
    int queue_count, queue_next;
} Caches;

static PyObject *topic_text(Caches *c, const unsigned char *raw, Py_ssize_t len) {
    for (int i = 0; i < c->topic_count; i++)
        if (c->topics[i].len == len && memcmp(c->topics[i].raw, raw, (size_t)len) == 0)
            return c->topics[i].text;
    PyObject *text = ascii_str(raw, len);
    if (!text)
        return NULL;
    TopicSlot *slot = &c->topics[c->topic_next];
    c->topic_next = (c->topic_next + 1) % TOPIC_CACHE;
    if (c->topic_count < TOPIC_CACHE) {
        c->topic_count++;
    } else {
        Py_DECREF(slot->text);
        c->queue_count = 0; /* its entries may name the text just freed */
    }
    memcpy(slot->raw, raw, (size_t)len);
    slot->len = len;
    slot->text = text;
    return text;
}

/* The list of (queueOffset, physicalOffset, size, tagsCode) for (topic, queueId) in `queues`,
 * created when new. Borrowed. The cache is safe: the dict holds every list it names, and the
 * topic cache clears it whenever it lets a topic go. */
static PyObject *queue_list(Caches *c, PyObject *queues, PyObject *topic, int32_t queue_id) {
    for (int i = 0; i < c->queue_count; i++)
        if (c->queues[i].topic == topic && c->queues[i].queue_id == queue_id)
            return c->queues[i].entries;
    PyObject *key = Py_BuildValue("(Oi)", topic, queue_id);
    if (!key)
        return NULL;
    PyObject *entries = PyDict_GetItemWithError(queues, key);
    if (!entries && !PyErr_Occurred()) {
        entries = PyList_New(0);
        if (entries && PyDict_SetItem(queues, key, entries) < 0)
            Py_CLEAR(entries);
        Py_XDECREF(entries); /* the dict holds it */
    }
    Py_DECREF(key);
    if (!entries)
        return NULL;
    QueueSlot *slot = &c->queues[c->queue_next];
    c->queue_next = (c->queue_next + 1) % QUEUE_CACHE;
    if (c->queue_count < QUEUE_CACHE)
        c->queue_count++;
    slot->topic = topic;
    slot->queue_id = queue_id;
    slot->entries = entries;
    return entries;
}

static void forget_topics(Caches *c) {
    for (int i = 0; i < c->topic_count; i++)
        Py_DECREF(c->topics[i].text);
    c->topic_count = 0;
}

static int append_entry(PyObject *entries, int64_t queue_offset, int64_t physical_offset, int32_t size,
                        int32_t code) {
    PyObject *entry = Py_BuildValue("(LLii)", (long long)queue_offset, (long long)physical_offset, size, code);
    if (!entry)
        return -1;
    int failed = PyList_Append(entries, entry);
    Py_DECREF(entry);
    return failed;
}

static int append_index_request(PyObject *requests, PyObject *topic, int64_t physical_offset,
                                int64_t store_timestamp, int32_t sys_flag, const Value *uniq, const Value *keys,
                                PyObject *space, PyObject *no_keys) {
    PyObject *uniq_text = NULL, *key_list = NULL, *request = NULL;
    int failed = -1;
    if (uniq->len > 0 && !(uniq_text = ascii_str(uniq->at, uniq->len)))
        goto done;
    if (keys->len > 0) {
        PyObject *keys_text = ascii_str(keys->at, keys->len);
        if (!keys_text)
            goto done;
        key_list = PyUnicode_Split(keys_text, space, -1);
        Py_DECREF(keys_text);
        if (!key_list)
            goto done;
    }
    request = Py_BuildValue("(OLLiOO)", topic, (long long)physical_offset, (long long)store_timestamp, sys_flag,
                            uniq_text ? uniq_text : Py_None, key_list ? key_list : no_keys);
    if (request)
        failed = PyList_Append(requests, request);
done:
    Py_XDECREF(uniq_text); Py_XDECREF(key_list); Py_XDECREF(request);
    return failed;
}

static PyObject *space_text, *empty_tuple;

/* scan_v4(buf, position, limit, room, queues, index_requests, schedule_topic)
 *   -> (position, records added, the last queued record's store timestamp or None) */
static PyObject *scan_v4(PyObject *self, PyObject *args) {
    Py_buffer view = {0}, schedule = {0};
    Py_ssize_t position, limit, room;
    PyObject *queues, *requests, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnO!Oy*", &view, &position, &limit, &room, &PyDict_Type, &queues, &requests,
                          &schedule))
        return NULL;
    Caches caches;
    caches.topic_count = caches.topic_next = caches.queue_count = caches.queue_next = 0;
    const unsigned char *buf = view.buf;
    Py_ssize_t added = 0;
    int64_t logics_timestamp = 0;
    int queued = 0;
    int index_enabled = requests != Py_None;
    if (index_enabled && !PyList_Check(requests)) {
        PyErr_SetString(PyExc_TypeError, "index_requests must be a list or None");
        goto done;
    }
    if (limit > view.len || position < 0) {
        PyErr_SetString(PyExc_ValueError, "position and limit must lie within the buffer");
        goto done;
    }
    while (position < limit && added < room) { /* each round adds one record or stops */
        const unsigned char *r = buf + position;
        if (limit - position < FIXED_SIZE)
            break;
        int32_t size = get32(r), sys_flag = get32(r + 36), body_len = get32(r + 84);
        if (get32(r + 4) != MESSAGE_MAGIC || (sys_flag & V6_FLAGS) || size < RECORD_BASE || size > limit - position
            || body_len < 0 || body_len > size - RECORD_BASE)
            break;
        Py_ssize_t topic_at = FIXED_SIZE + body_len, topic_len = r[topic_at];
        Py_ssize_t props_at = topic_at + 1 + topic_len;
        if (topic_len == 0 || topic_len > MAX_TOPIC_BYTES || props_at + 2 > size)
            break;
        Py_ssize_t props_len = (int16_t)((uint16_t)r[props_at] << 8 | r[props_at + 1]);
        const unsigned char *topic_raw = r + topic_at + 1, *props = r + props_at + 2;
        if (props_len < 0 || RECORD_BASE + body_len + topic_len + props_len != size
            || !is_ascii(topic_raw, topic_len) || !is_ascii(props, props_len)
            || (topic_len == schedule.len && memcmp(topic_raw, schedule.buf, (size_t)topic_len) == 0))
            break;
        PyObject *topic = topic_text(&caches, topic_raw, topic_len);
        if (!topic)
            goto done;
        Value tags, keys, uniq;
        find_values(props, props_len, &tags, &keys, &uniq);
        int64_t physical_offset = get64(r + 28), store_timestamp = get64(r + 56);
        int32_t transaction = sys_flag & TRANSACTION_MASK;
        if (transaction == 0 || transaction == TRANSACTION_COMMIT) {
            PyObject *entries = queue_list(&caches, queues, topic, get32(r + 12));
            int32_t code = tags.len > 0 ? java_hash(tags.at, tags.len) : 0;
            if (!entries || append_entry(entries, get64(r + 20), physical_offset, size, code) < 0)
                goto done;
            logics_timestamp = store_timestamp;
            queued = 1;
        }
        if (index_enabled && append_index_request(requests, topic, physical_offset, store_timestamp, sys_flag, &uniq,
                                                  &keys, space_text, empty_tuple) < 0)
            goto done;
        position += size;
        added++;
    }
    result = queued ? Py_BuildValue("(nnL)", position, added, (long long)logics_timestamp)
                    : Py_BuildValue("(nnO)", position, added, Py_None);
done:
    forget_topics(&caches);
    PyBuffer_Release(&view);
    PyBuffer_Release(&schedule);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_v4", scan_v4, METH_VARARGS,
     "scan_v4(buf, position, limit, room, queues, index_requests, schedule_topic)\n"
     "-> (position, added, logics_timestamp or None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shm._dispatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__dispatch(void) {
    if (!(space_text = PyUnicode_InternFromString(" ")) || !(empty_tuple = PyTuple_New(0)))
        return NULL;
    return PyModule_Create(&module);
}
