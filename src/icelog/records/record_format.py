"""The Kafka RecordBatch v2 header layout: named field offsets, the one struct that reads it, attribute flags.

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records...

The CRC-32C covers attributes to the end of the batch, so the broker may rewrite bytes 0-16 (offset,
length, leader epoch, magic) without recomputing it. Every module that reads or patches a batch header
takes its offsets from here.
"""

from __future__ import annotations

import struct

import crc32c

BASE_OFFSET = 0
BATCH_LENGTH = 8
PARTITION_LEADER_EPOCH = 12
MAGIC = 16
CRC = 17
ATTRIBUTES = 21
ATTRIBUTES_LOW_BYTE = 22  # the flags below all live in the low byte of the int16
LAST_OFFSET_DELTA = 23
BASE_TIMESTAMP = 27
MAX_TIMESTAMP = 35
PRODUCER_ID = 43
PRODUCER_EPOCH = 51
BASE_SEQUENCE = 53
RECORDS_COUNT = 57
RECORDS = 61

HEADER_SIZE = RECORDS
LOG_OVERHEAD = BATCH_LENGTH + 4  # baseOffset + batchLength: the bytes batchLength does not count
CRC_START = ATTRIBUTES

# (baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta, baseTimestamp,
#  maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount)
HEADER = struct.Struct(">qiibIhiqqqhii")
INT64 = struct.Struct(">q")
INT32 = struct.Struct(">i")
INT16 = struct.Struct(">h")
UINT32 = struct.Struct(">I")

ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}

assert HEADER.size == HEADER_SIZE


def batch_crc(data: bytes | bytearray | memoryview, position: int = 0, size: int | None = None) -> int:
    """The CRC-32C a batch carries: of its bytes from the attributes to its end (the batch of `size` bytes at
    `position`; by default all of `data`)."""
    view = memoryview(data)
    return crc32c.crc32c(view[position + CRC_START : len(view) if size is None else position + size])
