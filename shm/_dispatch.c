/* shm._dispatch: the reput dispatcher's scan of the CommitLog in C.
 *
 * The native twin of the hot loop of `shm.dispatch.DispatchBatch.scan`/`_add`, which stays the
 * reference: tests/unit/test_native_dispatch.py runs both over the same logs and requires the same
 * batch afterwards (ConsumeQueue entries per queue, index keys, where each stopped). In Python
 * a record costs several microseconds of interpreter calls; here it is one pass that makes no
 * object a record: it appends to the batch's bytearrays
 *   queue run (one a queue):  queueOffset i64 | physicalOffset i64 | size i32 | tagsCode i64,
 *                             big-endian (shm.consume_queue.RUN_ENTRY)
 *   index keys (one a batch): keyHash i32 | physicalOffset i64 | storeTimestamp i64,
 *                             little-endian (shm.index_file.INDEX_KEY): UNIQ_KEY then each KEYS
 *                             token, for every record but ROLLBACKs.
 *
 * It reads what nearly every record is: a V1 record with IPv4 hosts whose topic and properties
 * are ASCII, big-endian (spec 2.1):
 *   TOTALSIZE i32 | MAGIC i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
 *   PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 8 | STORETIMESTAMP i64 |
 *   STOREHOST 8 | RECONSUMETIMES i32 | PREPAREDTXOFFSET i64 | BODYLENGTH i32 | BODY |
 *   TOPICLENGTH u8 | TOPIC | PROPERTIESLENGTH i16 | PROPERTIES
 * and stops in front of anything else: a blank, damage, an IPv6 host, non-ASCII text, a
 * schedule-topic record whose DELAY is not plain digits (its tag slot is a delivery time,
 * computed here from `delays` otherwise). The caller then takes that one record
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
#define TRANSACTION_ROLLBACK 0xC
#define RUN_ENTRY_SIZE 28
#define INDEX_KEY_SIZE 20
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

static inline void put_be64(unsigned char *p, int64_t v) {
    for (int i = 7; i >= 0; i--, v = (int64_t)((uint64_t)v >> 8))
        p[i] = (unsigned char)v;
}

static inline void put_be32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16); p[2] = (unsigned char)(u >> 8);
    p[3] = (unsigned char)u;
}

static inline void put_le64(unsigned char *p, int64_t v) {
    for (int i = 0; i < 8; i++, v = (int64_t)((uint64_t)v >> 8))
        p[i] = (unsigned char)v;
}

static inline void put_le32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u; p[1] = (unsigned char)(u >> 8); p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static inline int32_t get_le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static inline int64_t get_le64(const unsigned char *p) {
    return (int64_t)((uint64_t)(uint32_t)get_le32(p) | (uint64_t)(uint32_t)get_le32(p + 4) << 32);
}

/* Room for `more` bytes at the end of a bytearray; where they start, or NULL. */
static unsigned char *grow(PyObject *array, Py_ssize_t more) {
    Py_ssize_t used = PyByteArray_GET_SIZE(array);
    if (PyByteArray_Resize(array, used + more) < 0) /* over-allocates: appends are amortised */
        return NULL;
    return (unsigned char *)PyByteArray_AS_STRING(array) + used;
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

/* Java's String.hashCode of ASCII text (one UTF-16 unit a byte), continued from `h`. */
static uint32_t java_hash(uint32_t h, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        h = 31 * h + p[i];
    return h;
}

typedef struct {
    const unsigned char *at;
    Py_ssize_t len; /* -1: absent (or only empty values) */
} Value;

/* TAGS, KEYS, UNIQ_KEY and DELAY of a properties text, in one pass over its pairs. */
static void find_values(const unsigned char *p, Py_ssize_t n, Value *tags, Value *keys, Value *uniq, Value *delay) {
    Py_ssize_t at = 0;
    tags->len = keys->len = uniq->len = delay->len = -1;
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
        else if (name_len == 5 && memcmp(pair, "DELAY", 5) == 0)
            slot = delay;
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

/* The run (a bytearray) for (topic, queueId) in `queues`, created when new. Borrowed. The cache
 * is safe: the dict holds every run it names, and the topic cache clears it whenever it lets a
 * topic go. */
static PyObject *queue_run(Caches *c, PyObject *queues, PyObject *topic, int32_t queue_id) {
    for (int i = 0; i < c->queue_count; i++)
        if (c->queues[i].topic == topic && c->queues[i].queue_id == queue_id)
            return c->queues[i].entries;
    PyObject *key = Py_BuildValue("(Oi)", topic, queue_id);
    if (!key)
        return NULL;
    PyObject *entries = PyDict_GetItemWithError(queues, key);
    if (entries && !PyByteArray_CheckExact(entries)) {
        PyErr_SetString(PyExc_TypeError, "a queue's run must be a bytearray");
        entries = NULL;
    } else if (!entries && !PyErr_Occurred()) {
        entries = PyByteArray_FromStringAndSize(NULL, 0);
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

static int append_entry(PyObject *run, int64_t queue_offset, int64_t physical_offset, int32_t size,
                        int64_t code) {
    unsigned char *p = grow(run, RUN_ENTRY_SIZE);
    if (!p)
        return -1;
    put_be64(p, queue_offset); put_be64(p + 8, physical_offset); put_be32(p + 16, size); put_be64(p + 20, code);
    return 0;
}

/* One INDEX_KEY for "topic#key": keyHash is abs(String.hashCode), with MIN_VALUE mapped to 0. */
static int append_key(PyObject *keys, uint32_t topic_hash, const unsigned char *key, Py_ssize_t len,
                      int64_t physical_offset, int64_t store_timestamp) {
    int32_t h = (int32_t)java_hash(31 * topic_hash + '#', key, len);
    unsigned char *p = grow(keys, INDEX_KEY_SIZE);
    if (!p)
        return -1;
    put_le32(p, h == INT32_MIN ? 0 : (h < 0 ? -h : h)); put_le64(p + 4, physical_offset);
    put_le64(p + 12, store_timestamp);
    return 0;
}

/* The record's index keys: its UNIQ_KEY, then each non-empty token of KEYS split at spaces. */
static int append_keys(PyObject *keys, const unsigned char *topic, Py_ssize_t topic_len, const Value *uniq,
                       const Value *record_keys, int64_t physical_offset, int64_t store_timestamp) {
    uint32_t topic_hash = java_hash(0, topic, topic_len);
    if (uniq->len > 0 && append_key(keys, topic_hash, uniq->at, uniq->len, physical_offset, store_timestamp) < 0)
        return -1;
    Py_ssize_t at = 0;
    while (record_keys->len > 0 && at <= record_keys->len) { /* each round takes one token */
        const unsigned char *token = record_keys->at + at;
        const unsigned char *space = memchr(token, ' ', (size_t)(record_keys->len - at));
        Py_ssize_t token_len = space ? space - token : record_keys->len - at;
        if (token_len > 0
            && append_key(keys, topic_hash, token, token_len, physical_offset, store_timestamp) < 0)
            return -1;
        at += token_len + 1;
    }
    return 0;
}

/* A schedule-topic record's tag slot, its delivery time: the store time plus its DELAY level's
 * delay (`delays`: int64 ms per level), the level clamped to the last. 0 when DELAY is not plain
 * digits naming a level > 0: the Python path (shm.dispatch.delivery_time) takes that record. */
static int64_t delivery_time(const Value *delay, const Py_buffer *delays, int64_t store_timestamp) {
    Py_ssize_t levels = delays->len / (Py_ssize_t)sizeof(int64_t);
    if (delay->len <= 0 || delay->len > 9 || levels == 0)
        return 0;
    int64_t level = 0;
    for (Py_ssize_t i = 0; i < delay->len; i++) {
        if (delay->at[i] < '0' || delay->at[i] > '9')
            return 0;
        level = level * 10 + (delay->at[i] - '0');
    }
    if (level <= 0)
        return 0;
    if (level > levels)
        level = levels;
    int64_t ms;
    memcpy(&ms, (const char *)delays->buf + (level - 1) * sizeof(int64_t), sizeof ms);
    return store_timestamp + ms;
}

/* scan_v4(buf, position, limit, room, queues, index_keys, schedule_topic, delays)
 *   -> (position, records added, the last queued record's store timestamp or None) */
static PyObject *scan_v4(PyObject *self, PyObject *args) {
    Py_buffer view = {0}, schedule = {0}, delays = {0};
    Py_ssize_t position, limit, room;
    PyObject *queues, *index_keys, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnO!Oy*y*", &view, &position, &limit, &room, &PyDict_Type, &queues, &index_keys,
                          &schedule, &delays))
        return NULL;
    Caches caches;
    caches.topic_count = caches.topic_next = caches.queue_count = caches.queue_next = 0;
    const unsigned char *buf = view.buf;
    Py_ssize_t added = 0;
    int64_t logics_timestamp = 0;
    int queued = 0;
    int index_enabled = index_keys != Py_None;
    if (index_enabled && !PyByteArray_CheckExact(index_keys)) {
        PyErr_SetString(PyExc_TypeError, "index_keys must be a bytearray or None");
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
            || !is_ascii(topic_raw, topic_len) || !is_ascii(props, props_len))
            break;
        Value tags, keys, uniq, delay;
        find_values(props, props_len, &tags, &keys, &uniq, &delay);
        int64_t physical_offset = get64(r + 28), store_timestamp = get64(r + 56), due = 0;
        if (topic_len == schedule.len && memcmp(topic_raw, schedule.buf, (size_t)topic_len) == 0) {
            due = delivery_time(&delay, &delays, store_timestamp);
            if (due == 0)
                break;
        }
        PyObject *topic = topic_text(&caches, topic_raw, topic_len);
        if (!topic)
            goto done;
        int32_t transaction = sys_flag & TRANSACTION_MASK;
        if (transaction == 0 || transaction == TRANSACTION_COMMIT) {
            PyObject *run = queue_run(&caches, queues, topic, get32(r + 12));
            int64_t code = due ? due : tags.len > 0 ? (int32_t)java_hash(0, tags.at, tags.len) : 0;
            if (!run || append_entry(run, get64(r + 20), physical_offset, size, code) < 0)
                goto done;
            logics_timestamp = store_timestamp;
            queued = 1;
        }
        if (index_enabled && transaction != TRANSACTION_ROLLBACK
            && append_keys(index_keys, topic_raw, topic_len, &uniq, &keys, physical_offset, store_timestamp) < 0)
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
    PyBuffer_Release(&delays);
    return result;
}

/* index_put: IndexFile.put_hash over INDEX_KEY records, into one mapped index file.
 *
 * The native twin of `shm.index_file.IndexFile.put_hash` called key by key (the reference;
 * tests/integration/test_queue_index.py requires the same file bytes from both). Layout (big-endian):
 *   header 40: beginTimestamp i64 | endTimestamp i64 | beginPhyOffset i64 | endPhyOffset i64 |
 *              hashSlotCount i32 | indexCount i32
 *   slots:     i32 each, the newest entry number of the slot (0 = empty)
 *   entries:   20 bytes at 40 + slots*4 + n*20: keyHash i32 | phyOffset i64 | timeDiff i32 |
 *              prevIndex i32
 * Keys from `start` on are taken in order until the file is full (what a replay already indexed
 * the caller leaves out: IndexService.indexed_through). Each entry is written before the slot
 * that names it, and the header last: a reader that re-reads the header never counts an entry
 * not yet written. */
static PyObject *index_put(PyObject *self, PyObject *args) {
    Py_buffer map, keys;
    Py_ssize_t slot_count, index_max, start;
    if (!PyArg_ParseTuple(args, "w*nny*n", &map, &slot_count, &index_max, &keys, &start))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t entries_at = 40 + slot_count * 4, count_keys = keys.len / INDEX_KEY_SIZE;
    if (slot_count <= 0 || index_max < 2 || index_max > INT32_MAX || map.len < entries_at + index_max * 20
        || keys.len % INDEX_KEY_SIZE || start < 0 || start > count_keys) {
        PyErr_SetString(PyExc_ValueError, "index_put: the file's geometry, the keys or start are inconsistent");
        goto done;
    }
    unsigned char *m = map.buf;
    int64_t begin_ts = get64(m), end_ts = get64(m + 8), begin_phy = get64(m + 16), end_phy = get64(m + 24);
    int32_t slots_used = get32(m + 32), count = get32(m + 36);
    if (count <= 0)
        count = 1; /* a new file: entry 0 is never used */
    if (count > index_max || slots_used < 0) {
        PyErr_SetString(PyExc_ValueError, "index_put: the index file's header is damaged");
        goto done;
    }
    Py_ssize_t i = start, added = 0;
    for (; i < count_keys; i++) {
        const unsigned char *key = (const unsigned char *)keys.buf + i * INDEX_KEY_SIZE;
        int32_t hash = get_le32(key);
        int64_t phy = get_le64(key + 4), stamp = get_le64(key + 12);
        if (count >= index_max)
            break; /* full: the caller rolls over to a new file */
        if (hash < 0) {
            PyErr_SetString(PyExc_ValueError, "index_put: a keyHash is negative");
            break;
        }
        unsigned char *slot = m + 40 + (Py_ssize_t)(hash % slot_count) * 4;
        int32_t previous = get32(slot);
        if (previous <= 0 || previous > count)
            previous = 0;
        int64_t diff = 0; /* seconds since beginTimestamp, truncated as Java divides */
        if (begin_ts > 0) {
            diff = (stamp - begin_ts) / 1000;
            diff = diff < 0 ? 0 : (diff > INT32_MAX ? INT32_MAX : diff);
        }
        unsigned char *entry = m + entries_at + (Py_ssize_t)count * 20;
        put_be32(entry, hash);
        put_be64(entry + 4, phy);
        put_be32(entry + 12, (int32_t)diff);
        put_be32(entry + 16, previous);
        put_be32(slot, count);
        if (count <= 1) {
            begin_phy = phy;
            begin_ts = stamp;
        }
        slots_used += previous == 0;
        count++;
        end_phy = phy;
        end_ts = stamp;
        added++;
    }
    if (added) { /* a file nothing was added to keeps its header as it was, byte for byte */
        put_be64(m, begin_ts); put_be64(m + 8, end_ts); put_be64(m + 16, begin_phy); put_be64(m + 24, end_phy);
        put_be32(m + 32, slots_used); put_be32(m + 36, count);
    }
    if (!PyErr_Occurred())
        result = Py_BuildValue("(nn)", i, added);
done:
    PyBuffer_Release(&map);
    PyBuffer_Release(&keys);
    return result;
}

/* cq_entries(run) -> bytes: a run of RUN_ENTRY records (queueOffset i64 | the 20-byte
 * ConsumeQueue entry) with the queue offsets cut out, as ConsumeQueue.put_many stores a run
 * that continues its queue. */
static PyObject *cq_entries(PyObject *self, PyObject *args) {
    Py_buffer run;
    if (!PyArg_ParseTuple(args, "y*", &run))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = run.len / RUN_ENTRY_SIZE;
    if (run.len % RUN_ENTRY_SIZE) {
        PyErr_SetString(PyExc_ValueError, "cq_entries: a run holds whole entries");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, count * (RUN_ENTRY_SIZE - 8));
    if (result == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++)
        memcpy(out + i * (RUN_ENTRY_SIZE - 8), (const unsigned char *)run.buf + i * RUN_ENTRY_SIZE + 8, RUN_ENTRY_SIZE - 8);
done:
    PyBuffer_Release(&run);
    return result;
}

/* cq_write(map, position, entries) -> None: ConsumeQueue entries (20 bytes each, as stored)
 * into the writable mapping `map` at `position`, each entry's size field stored last. A reader
 * scans past the entries published under `dispatched` (shm.reader.QueueView) and stops at the
 * first with size 0, the zeros beyond the written end: it must never see a size before the
 * phy beside it. One memcpy gave it that chance: glibc stores a copy's vectors in no fixed
 * order (the last ones first, for some lengths), and a reader took an entry with its size in
 * place and its phy still 0 for a record at CommitLog offset 0 (bench-consume saw a pull reply
 * end in the first 1,168 bytes of another topic's first record). The size is a 4-byte aligned
 * store, never torn; x86 keeps stores in order, and the fences keep the compiler from moving
 * them. Entries are written only past the written end, over zeros (recovery zeroes what it
 * truncates). */
static PyObject *cq_write(PyObject *self, PyObject *args) {
    Py_buffer map, entries;
    Py_ssize_t position;
    if (!PyArg_ParseTuple(args, "w*ny*", &map, &position, &entries))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = entries.len / 20;
    if (entries.len % 20 || position < 0 || position % 4 || position > map.len - entries.len) {
        PyErr_SetString(PyExc_ValueError, "cq_write: whole entries, at a 4-byte aligned position inside the map");
        goto done;
    }
    unsigned char *to = (unsigned char *)map.buf + position;
    const unsigned char *from = entries.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(to + i * 20, from + i * 20, 8);             /* phy */
        memcpy(to + i * 20 + 12, from + i * 20 + 12, 8);   /* tags */
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t size;
        memcpy(&size, from + i * 20 + 8, 4);
        __atomic_store_n((uint32_t *)(void *)(to + i * 20 + 8), size, __ATOMIC_RELEASE);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&map);
    PyBuffer_Release(&entries);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_v4", scan_v4, METH_VARARGS,
     "scan_v4(buf, position, limit, room, queues, index_keys, schedule_topic, delays)\n"
     "-> (position, added, logics_timestamp or None)"},
    {"cq_entries", cq_entries, METH_VARARGS, "cq_entries(run) -> bytes: the run's entries without their queue offsets"},
    {"cq_write", cq_write, METH_VARARGS, "cq_write(map, position, entries): entries into a mapping, each one's size last"},
    {"index_put", index_put, METH_VARARGS,
     "index_put(map, slot_count, index_max, keys, start) -> (next_key, added)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shm._dispatch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__dispatch(void) {
    return PyModule_Create(&module);
}
