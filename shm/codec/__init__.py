"""The CommitLog record codec, one package: pure functions over bytes, no I/O.

- `record`: the record layout (its table), `encode`, `decode`, `scan`.
- `in_place`: fields of encoded records read and set in place (peeks, envelopes, blanks, boundaries).
- `properties`: properties, keys, tags codes, the index key hash, the names the broker reads.
- `msgid`: hosts and offsetMsgIds.
- `view`: a client's walk of pulled records.
- `batch`: the send path's one-pass encoders and their C twins.

Every name the module `shm.codec` had is here under the same name (callers import from
`shm.codec`, never from the parts).
"""

from __future__ import annotations

from shm.codec.properties import (
    NAME_VALUE_SEPARATOR, PROPERTY_CLUSTER, PROPERTY_DELAY, PROPERTY_KEYS, PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC, PROPERTY_SEPARATOR, PROPERTY_TAGS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_OUT_MS, PROPERTY_UNIQ_KEY, PROPERTY_WAIT,
    SCHEDULE_TOPIC,
    TIMER_PROPERTIES, TIMER_TOPIC, PROPERTY_CHECK_IMMUNITY, PROPERTY_INNER_NUM, PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION,
    TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, index_key_hash, parse_properties, properties_string, split_keys, tags_code,
)
from shm.codec.msgid import (
    Host, decode_host, decode_msg_id, encode_host, offset_msg_id,
)
from shm.codec.record import (
    BLANK_MAGIC, Blank, Corruption, CorruptionKind, END_FILE_MIN_BLANK_LENGTH, FIXED_V4, FLAG_BORNHOST_V6,
    FLAG_COMPRESSED, FLAG_MULTI_TAGS, FLAG_STOREHOST_V6, MAX_PROPERTIES_BYTES, MAX_RECORD_OVERHEAD,
    MAX_TOPIC_BYTES, MESSAGE_MAGIC, MESSAGE_MAGIC_V2, MessageIllegal, OFFSET_BORN_HOST,
    OFFSET_PHYSICAL_OFFSET, OFFSET_QUEUE_OFFSET, OFFSET_SYSFLAG, Record, ScanResult, TRANSACTION_COMMIT,
    TRANSACTION_MASK, TRANSACTION_NOT, TRANSACTION_PREPARED, TRANSACTION_ROLLBACK, _BLANK, _FIXED_V4, _HEAD,
    _HEAD_SIZE, _I16, _I32, _I64, _MIDDLE, _check_fields, _check_head, _check_limits, _decode_body,
    _host_flags, _host_struct, _signed_byte, _topic_text, body_crc, decode, dispatch_fields, encode,
    encode_v4, expected_size, scan, store_timestamp_offset,
)
from shm.codec.in_place import (
    MIN_RECORD_SIZE, TRANSACTION_HEAD_BYTES, body_offset, encode_blank, envelope, frame_size,
    peek_queue_offset, peek_store_timestamp, peek_transaction, record_head, record_properties, record_topic,
    set_transaction, with_body,
)
from shm.codec.view import (
    FIXED_BODY_LEN, FIXED_BORN_HOST, FIXED_BORN_TS, FIXED_PHYSICAL, FIXED_QUEUE_ID, FIXED_QUEUE_OFFSET,
    FIXED_RECONSUME, FIXED_STORE_HOST, FIXED_STORE_TS, PROPERTIES_LENGTH, TOTALSIZE, _FIXED_V4_SIZE,
    _UNIQ_NAME, _V6_FLAGS, lone_uniq_key, offset_ids_py, queue_entries, walk_records_v4, walk_v4,
)
from shm.codec.batch import (
    BATCH_MESSAGE_HEAD, BATCH_PROPS_LENGTH, MAX_MESSAGES_PER_BATCH, batch_body_after, NATIVE, SCHEDULED_TAILS, _literal,
    _properties_plan, _stored_names, _topic_part, encode_batch_v4, encode_batch_v4_c, encode_batch_v4_py,
    encode_messages_v4, encode_messages_v4_c, encode_messages_v4_py, find_uniq_key, find_uniq_key_ascii,
    offset_ids, offset_ids_c, properties_layout, topic_bytes,
)
from shm.codec.batch import _encode  # the C twins, or None (tests look)
from shm.codec.record import crc32  # ISA-L's where installed, else zlib's: the same checksum

__all__ = [
    "BATCH_MESSAGE_HEAD", "BATCH_PROPS_LENGTH", "batch_body_after", "BLANK_MAGIC", "Blank", "Corruption", "CorruptionKind",
    "END_FILE_MIN_BLANK_LENGTH", "FIXED_BODY_LEN", "FIXED_BORN_HOST", "FIXED_BORN_TS", "FIXED_PHYSICAL",
    "FIXED_QUEUE_ID", "FIXED_QUEUE_OFFSET", "FIXED_RECONSUME", "FIXED_STORE_HOST", "FIXED_STORE_TS",
    "FIXED_V4", "FLAG_BORNHOST_V6", "FLAG_COMPRESSED", "FLAG_MULTI_TAGS", "FLAG_STOREHOST_V6", "Host",
    "MAX_MESSAGES_PER_BATCH", "MAX_PROPERTIES_BYTES", "MAX_RECORD_OVERHEAD", "MAX_TOPIC_BYTES",
    "MESSAGE_MAGIC", "MESSAGE_MAGIC_V2", "MIN_RECORD_SIZE", "MessageIllegal", "NAME_VALUE_SEPARATOR",
    "NATIVE", "OFFSET_BORN_HOST", "OFFSET_PHYSICAL_OFFSET", "OFFSET_QUEUE_OFFSET", "OFFSET_SYSFLAG",
    "PROPERTIES_LENGTH", "PROPERTY_CLUSTER", "PROPERTY_DELAY", "PROPERTY_INNER_NUM", "PROPERTY_KEYS", "PROPERTY_REAL_QID",
    "PROPERTY_REAL_TOPIC", "PROPERTY_SEPARATOR", "PROPERTY_TAGS", "PROPERTY_TIMER_DELAY_MS",
    "PROPERTY_TIMER_DELAY_SEC", "PROPERTY_TIMER_DEL_UNIQKEY", "PROPERTY_TIMER_DELIVER_MS", "PROPERTY_TIMER_OUT_MS", "PROPERTY_UNIQ_KEY",
    "PROPERTY_WAIT", "Record", "SCHEDULED_TAILS", "SCHEDULE_TOPIC", "ScanResult", "TIMER_PROPERTIES",
    "TIMER_TOPIC", "TOTALSIZE", "PROPERTY_CHECK_IMMUNITY", "PROPERTY_PRODUCER_GROUP", "PROPERTY_TRANSACTION",
    "TRANS_CHECK_MAX_TIME_TOPIC", "TRANS_HALF_TOPIC", "TRANS_OP_HALF_TOPIC", "TRANSACTION_COMMIT", "TRANSACTION_HEAD_BYTES", "TRANSACTION_MASK", "TRANSACTION_NOT",
    "TRANSACTION_PREPARED", "TRANSACTION_ROLLBACK", "set_transaction", "_BLANK", "_FIXED_V4", "_FIXED_V4_SIZE", "_HEAD",
    "_HEAD_SIZE", "_I16", "_I32", "_I64", "_MIDDLE", "_UNIQ_NAME", "_V6_FLAGS", "_check_fields",
    "_check_head", "_check_limits", "_decode_body", "_encode", "_host_flags", "_host_struct", "_literal",
    "_properties_plan", "_signed_byte", "_stored_names", "_topic_part", "_topic_text", "body_crc",
    "body_offset", "crc32", "decode", "decode_host", "decode_msg_id", "dispatch_fields", "encode",
    "encode_batch_v4", "encode_batch_v4_c", "encode_batch_v4_py", "encode_blank", "encode_host",
    "encode_messages_v4", "encode_messages_v4_c", "encode_messages_v4_py", "encode_v4", "envelope",
    "expected_size", "find_uniq_key", "find_uniq_key_ascii", "frame_size", "index_key_hash", "lone_uniq_key",
    "offset_ids", "offset_ids_c", "offset_ids_py", "offset_msg_id", "parse_properties", "peek_queue_offset",
    "peek_store_timestamp", "peek_transaction", "properties_layout", "properties_string", "record_head", "record_properties", "record_topic", "scan",
    "split_keys", "store_timestamp_offset", "tags_code", "queue_entries", "topic_bytes", "walk_records_v4", "walk_v4",
    "with_body",
]
