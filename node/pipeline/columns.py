"""A run of whole records (pull replies, a CommitLog stretch) as the connector's columns, computed
column-wise: one numpy gather of every record's fixed part, Arrow kernels over the properties
(split, map, lookups), buffers joined once for the bodies, texts and envelopes. No Python object a
record but the slices joined, about half the time of the record-by-record path in
`node.pipeline.rows.to_batch`, which calls this first and reads whatever this declines (IPv6
hosts, V2 magic, a key named twice in one record's properties, text that is not UTF-8).

The layout checks are those of `shm.codec.walk_records_v4`, made on every record at once; the
columns equal the record-by-record path's exactly (tests/unit/test_pipeline_columns.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shm.codec import FIXED_V4, MESSAGE_MAGIC, TOTALSIZE, decode_host

HEAD = FIXED_V4.size  # 88: through BODYLENGTH, IPv4 hosts
_HEX = np.array([f"{i:02X}".encode() for i in range(256)], dtype="S2")
_FIELDS = {  # name -> (offset, width) in the fixed part (shm.codec's layout)
    "size": (0, 4), "magic": (4, 4), "queueId": (12, 4), "flag": (16, 4), "queueOffset": (20, 8),
    "commitLogOffset": (28, 8), "sysFlag": (36, 4), "bornTimestamp": (40, 8), "bornHost": (48, 8),
    "storeTimestamp": (56, 8), "storeHost": (64, 8), "reconsumeTimes": (72, 4), "bodyLength": (84, 4)}


def _starts(buf: bytes) -> list[int] | None:
    """Where each record of a run of whole records starts; None when the run is not one."""
    starts, at, end, unpack = [], 0, len(buf), TOTALSIZE.unpack_from
    while at < end:
        if end - at < HEAD + 3:
            return None
        size = unpack(buf, at)[0]
        if size < HEAD + 3:
            return None
        starts.append(at)
        at += size
    return starts if at == end else None


def _ints(head: np.ndarray, name: str) -> np.ndarray:
    at, width = _FIELDS[name]
    return np.ascontiguousarray(head[:, at: at + width]).view(f">i{width}").ravel().astype(f"i{width}")


def _binary(buf: memoryview, begins: np.ndarray, lengths: np.ndarray, kind=pa.binary()) -> pa.Array:
    return _joined([buf[b: b + n] for b, n in zip(begins.tolist(), lengths.tolist())], lengths, kind)


def _joined(pieces: list, lengths: np.ndarray, kind=pa.binary()) -> pa.Array:
    """A binary or string column of len(lengths) values, `pieces` joined (each value may be more
    than one piece): one copy, the offsets summed by numpy. (The caller keeps a run under 2 GiB,
    the int32 offsets' reach.)"""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(kind, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(pieces))])


def _one_topic(a: np.ndarray, begins: np.ndarray, lengths: np.ndarray) -> pa.Array | None:
    """The topic column when every record has the same topic (a pull reply always does): one
    value repeated, not a slice a record. None otherwise."""
    first = int(lengths[0])
    if (lengths != first).any():
        return None
    block = a[begins[:, None] + np.arange(first)]
    if (block != block[0]).any():
        return None
    try:
        return pa.repeat(pa.scalar(block[0].tobytes().decode("utf-8"), pa.string()), len(lengths))
    except UnicodeDecodeError:
        return None  # the general path declines it too


def _hosts(raw: np.ndarray) -> pa.Array:
    """8-byte IPv4 hosts as "ip:port" text, each distinct one formatted once."""
    keys = np.ascontiguousarray(raw).view("<u8").ravel()
    unique, inverse = np.unique(keys, return_inverse=True)
    texts = [str(decode_host(int(k).to_bytes(8, "little"))) for k in unique.tolist()]
    return pa.array(texts, pa.string()).take(pa.array(inverse.astype(np.int32)))


def _properties(text: pa.Array, rows: int) -> pa.MapArray | None:
    """Java's string2messageProperties over a column: `k\\x01v` pairs with both non-empty, split
    at \\x02; None when a row names a key twice (the scalar path keeps the last value)."""
    pairs = pc.split_pattern(text, "\x02")
    parent = pc.list_parent_indices(pairs).to_numpy()
    kv = pc.split_pattern(pc.list_flatten(pairs), "\x01", max_splits=1)
    whole = pc.equal(pc.list_value_length(kv), 2).to_numpy(zero_copy_only=False)
    kv, parent = kv.filter(pa.array(whole)), parent[whole]
    names, values = pc.list_element(kv, 0), pc.list_element(kv, 1)
    keep = pc.and_(pc.greater(pc.utf8_length(names), 0), pc.greater(pc.utf8_length(values), 0))
    names, values, parent = names.filter(keep), values.filter(keep), parent[keep.to_numpy(zero_copy_only=False)]
    codes = pc.dictionary_encode(names).indices.to_numpy().astype(np.int64)
    if len(codes) and len(np.unique(parent.astype(np.int64) * (int(codes.max()) + 1) + codes)) != len(codes):
        return None
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(parent, minlength=rows), out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), names, values)


def _layout(a: np.ndarray, pos: np.ndarray, head: np.ndarray) -> tuple | None:
    """(size, body length, sysflag, topic at, topic length, properties at, properties length) of
    every record, arrays; None unless every one is a V1-magic, IPv4 record whose parts add up
    (`shm.codec.walk_records_v4`'s checks)."""
    size, blen, sys_flag = (_ints(head, n).astype(np.int64) for n in ("size", "bodyLength", "sysFlag"))
    if ((_ints(head, "magic") != MESSAGE_MAGIC).any() or (sys_flag & 0x30).any() or (blen < 0).any()
            or (HEAD + blen + 3 > size).any()):
        return None
    topic_at = pos + HEAD + blen
    topic_len = a[topic_at].astype(np.int64)
    props_at = topic_at + 3 + topic_len
    if ((topic_len == 0) | (topic_len >= 128)).any() or (props_at > pos + size).any():
        return None
    props_len = (a[props_at - 2].astype(np.int64) << 8) | a[props_at - 1]
    if (props_at + props_len != pos + size).any():
        return None
    return size, blen, sys_flag, topic_at, topic_len, props_at, props_len


def _keys(keys: pa.Array, rows: int) -> pa.ListArray:
    """KEYS split at single spaces, empty pieces skipped (`shm.codec.split_keys`); [] without KEYS."""
    split = pc.split_pattern(pc.fill_null(keys, ""), " ")
    flat = pc.list_flatten(split)
    nonempty = pc.greater(pc.utf8_length(flat), 0)
    parents = pc.list_parent_indices(split).to_numpy()[nonempty.to_numpy(zero_copy_only=False)]
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(parents, minlength=rows), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(nonempty))


def columns_batch(buf: bytes, end: int, tags: frozenset[str] | None, schema: pa.Schema) -> pa.RecordBatch | None:
    """The columns of a run of whole IPv4, V1-magic records, computed column-wise (numpy and Arrow
    kernels, no per-record Python objects but slices); None for anything else (the caller's
    record-by-record path reads it)."""
    starts = _starts(buf) if len(buf) < 2**31 else None  # (a column's int32 offsets reach 2 GiB)
    if not starts:
        return None
    a = np.frombuffer(buf, np.uint8)
    pos = np.array(starts, np.int64)
    head = a[pos[:, None] + np.arange(HEAD)]
    layout = _layout(a, pos, head)
    if layout is None:
        return None
    size, blen, sys_flag, topic_at, topic_len, props_at, props_len = layout
    view, rows = memoryview(buf), len(starts)
    text = _binary(view, props_at, props_len, pa.string())
    topic = _one_topic(a, topic_at + 1, topic_len) or _binary(view, topic_at + 1, topic_len, pa.string())
    try:
        text.validate(full=True)
        topic.validate(full=True)
    except pa.ArrowInvalid:
        return None  # not UTF-8: the scalar path says where
    properties = _properties(text, rows)
    if properties is None:
        return None
    tag = pc.map_lookup(properties, "TAGS", "first")
    uniq = pc.map_lookup(properties, "UNIQ_KEY", "first")
    keys = pc.map_lookup(properties, "KEYS", "first")
    offset_ids = pa.array(_HEX[np.concatenate([head[:, 64:72], head[:, 28:36]], axis=1)].view("S32").ravel(),
                          pa.binary(32)).cast(pa.string())
    queue_offsets = _ints(head, "queueOffset")
    columns = {
        "topic": topic, "queueId": pa.array(_ints(head, "queueId")), "queueOffset": pa.array(queue_offsets),
        "commitLogOffset": pa.array(_ints(head, "commitLogOffset")),
        "msgId": pc.if_else(pc.fill_null(pc.greater(pc.utf8_length(uniq), 0), False), uniq, offset_ids),
        "offsetMsgId": offset_ids, "tags": tag,
        "keys": _keys(keys, rows),
        "properties": properties, "body": _binary(view, pos + HEAD, blen),
        "bornTimestamp": pa.array(_ints(head, "bornTimestamp"), pa.timestamp("ms")),
        "storeTimestamp": pa.array(_ints(head, "storeTimestamp"), pa.timestamp("ms")),
        "bornHost": _hosts(head[:, 48:56]), "storeHost": _hosts(head[:, 64:72]),
        "reconsumeTimes": pa.array(_ints(head, "reconsumeTimes")), "flag": pa.array(_ints(head, "flag")),
        "sysFlag": pa.array(sys_flag.astype(np.int32))}
    if "envelope" in schema.names:
        columns["envelope"] = _envelopes(view, pos, blen, size)
    arrays = [_typed(columns[f.name], f.type) for f in schema]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    keep = queue_offsets < end
    if tags is not None:
        keep &= pc.fill_null(pc.is_in(tag, value_set=pa.array(sorted(tags), pa.string())), False).to_numpy(
            zero_copy_only=False)
    return batch if keep.all() else batch.filter(pa.array(keep))


def _envelopes(view: memoryview, pos: np.ndarray, blen: np.ndarray, size: np.ndarray) -> pa.Array:
    """Each record without its body (`shm.codec.envelope`): its fixed part and what follows the body."""
    pieces = []
    for p, b, s in zip(pos.tolist(), blen.tolist(), size.tolist()):
        pieces += (view[p: p + HEAD], view[p + HEAD + b: p + s])
    return _joined(pieces, size - blen)


def _typed(array: pa.Array, kind: pa.DataType) -> pa.Array:
    if array.type == kind:
        return array
    if pa.types.is_timestamp(kind):
        return array.cast(pa.timestamp("ms", tz=kind.tz)).cast(kind)
    return array.cast(kind)
