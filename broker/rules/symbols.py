"""Symbolic names that numeric pattern keywords accept, and Lazaretto's reasons.

A rule may say ``REASON(MQRC_Q_FULL)`` instead of ``REASON(2053)``. Each
numeric keyword has its own family of names; a name from another family is
unknown for that keyword, with one exception kept from MQ: feedback codes
(``MQFB_*``) are also valid reasons, because MQ puts them in the reason field
of the dead-letter header for expired and report messages.

Lazaretto dead-letters messages with a reason *string*. Some of those mean
the same as an MQ reason and map to its number, so rules written for MQ keep
working; the others get ``LZRC_*`` numbers in the MQ range reserved for
application feedback (from ``MQFB_APPL_FIRST``), where they cannot collide
with a code MQ defines.
"""

from __future__ import annotations

from collections.abc import Mapping

MQRC: Mapping[str, int] = {
    "MQRC_ALIAS_BASE_Q_TYPE_ERROR": 2001,
    "MQRC_MSG_TOO_BIG_FOR_Q": 2030,
    "MQRC_MSG_TOO_BIG_FOR_Q_MGR": 2031,
    "MQRC_NOT_AUTHORIZED": 2035,
    "MQRC_PERSISTENT_NOT_ALLOWED": 2048,
    "MQRC_PUT_INHIBITED": 2051,
    "MQRC_Q_DELETED": 2052,
    "MQRC_Q_FULL": 2053,
    "MQRC_Q_SPACE_NOT_AVAILABLE": 2056,
    "MQRC_Q_TYPE_ERROR": 2057,
    "MQRC_Q_MGR_NOT_AVAILABLE": 2059,
    "MQRC_UNKNOWN_ALIAS_BASE_Q": 2082,
    "MQRC_UNKNOWN_OBJECT_NAME": 2085,
    "MQRC_UNKNOWN_OBJECT_Q_MGR": 2086,
    "MQRC_UNKNOWN_REMOTE_Q_MGR": 2087,
    "MQRC_FORMAT_ERROR": 2110,
    "MQRC_CLUSTER_RESOLUTION_ERROR": 2189,
    "MQRC_MSG_TOO_BIG_FOR_CHANNEL": 2218,
}

MQFB: Mapping[str, int] = {
    "MQFB_NONE": 0,
    "MQFB_SYSTEM_FIRST": 1,
    "MQFB_QUIT": 256,
    "MQFB_EXPIRATION": 258,
    "MQFB_COA": 259,
    "MQFB_COD": 260,
    "MQFB_CHANNEL_COMPLETED": 262,
    "MQFB_CHANNEL_FAIL_RETRY": 263,
    "MQFB_CHANNEL_FAIL": 264,
    "MQFB_APPL_CANNOT_BE_STARTED": 265,
    "MQFB_TM_ERROR": 266,
    "MQFB_APPL_TYPE_ERROR": 267,
    "MQFB_STOPPED_BY_MSG_EXIT": 268,
    "MQFB_ACTIVITY": 269,
    "MQFB_XMIT_Q_MSG_ERROR": 271,
    "MQFB_PAN": 275,
    "MQFB_NAN": 276,
    "MQFB_SYSTEM_LAST": 65535,
    "MQFB_APPL_FIRST": 65536,
    "MQFB_APPL_LAST": 999_999_999,
}

LZRC_HANDLER_ERROR = 65537
LZRC_CRASH_BLACKLISTED = 65538
LZRC_DISCARDED_OLD = 65539

LZRC: Mapping[str, int] = {
    "LZRC_HANDLER_ERROR": LZRC_HANDLER_ERROR,
    "LZRC_CRASH_BLACKLISTED": LZRC_CRASH_BLACKLISTED,
    "LZRC_DISCARDED_OLD": LZRC_DISCARDED_OLD,
}

MQMT: Mapping[str, int] = {
    "MQMT_REQUEST": 1,
    "MQMT_REPLY": 2,
    "MQMT_REPORT": 4,
    "MQMT_DATAGRAM": 8,
}

MQPER: Mapping[str, int] = {
    "MQPER_NOT_PERSISTENT": 0,
    "MQPER_PERSISTENT": 1,
    "MQPER_PERSISTENCE_AS_Q_DEF": 2,
}

# MQAT_DEFAULT is platform dependent in MQ; 6 is its value on UNIX systems.
MQAT: Mapping[str, int] = {
    "MQAT_UNKNOWN": -1,
    "MQAT_NO_CONTEXT": 0,
    "MQAT_CICS": 1,
    "MQAT_MVS": 2,
    "MQAT_OS390": 2,
    "MQAT_ZOS": 2,
    "MQAT_IMS": 3,
    "MQAT_OS2": 4,
    "MQAT_DOS": 5,
    "MQAT_UNIX": 6,
    "MQAT_AIX": 6,
    "MQAT_DEFAULT": 6,
    "MQAT_QMGR": 7,
    "MQAT_OS400": 8,
    "MQAT_WINDOWS": 9,
    "MQAT_CICS_VSE": 10,
    "MQAT_WINDOWS_NT": 11,
    "MQAT_VMS": 12,
    "MQAT_NSK": 13,
    "MQAT_VOS": 14,
    "MQAT_IMS_BRIDGE": 19,
    "MQAT_XCF": 20,
    "MQAT_CICS_BRIDGE": 21,
    "MQAT_NOTES_AGENT": 22,
    "MQAT_USER": 25,
    "MQAT_BROKER": 26,
    "MQAT_JAVA": 28,
    "MQAT_DQM": 29,
    "MQAT_CHANNEL_INITIATOR": 30,
    "MQAT_BATCH": 32,
    "MQAT_RRS_BATCH": 33,
    "MQAT_USER_FIRST": 65536,
    "MQAT_USER_LAST": 999_999_999,
}

SYMBOLIC_NAMES: Mapping[str, Mapping[str, int]] = {
    "APPLTYPE": MQAT,
    "FEEDBACK": MQFB,
    "MSGTYPE": MQMT,
    "PERSIST": MQPER,
    "REASON": {**MQRC, **MQFB, **LZRC},
}
"""Every symbolic name each numeric pattern keyword accepts, by keyword."""

LAZARETTO_REASONS: Mapping[str, int] = {
    "handler_error": LZRC_HANDLER_ERROR,
    "crash_blacklisted": LZRC_CRASH_BLACKLISTED,
    "discarded_old": LZRC_DISCARDED_OLD,
    "format_error": MQRC["MQRC_FORMAT_ERROR"],
    "max_messages_reached": MQRC["MQRC_Q_FULL"],
    "expired": MQFB["MQFB_EXPIRATION"],
}


def reason_code(reason: str) -> int:
    """The REASON number a rule matches for a Lazaretto dead-letter reason.

    Raises KeyError for a reason Lazaretto does not define: guessing a number
    would let a catch-all rule silently swallow a new kind of failure.
    """
    return LAZARETTO_REASONS[reason]


def pattern_number(keyword: str, value: str) -> int | None:
    """The number a validated numeric pattern value stands for; None for ``*``."""
    if value == "*":
        return None
    if is_unsigned_integer(value):
        return int(value)
    return SYMBOLIC_NAMES[keyword][value]


def is_unsigned_integer(text: str) -> bool:
    """True for ASCII decimal digits only (``str.isdigit`` also accepts '²')."""
    return text.isascii() and text.isdigit()
