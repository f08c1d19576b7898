"""How the console shows a payload: pretty JSON, text, or a hex dump, cut
at a size a browser page can carry. The template escapes whatever this
returns; nothing here is ever evaluated."""

from __future__ import annotations

import json
from dataclasses import dataclass

SHOWN_BYTES = 64 * 1024
HEX_WIDTH = 16


@dataclass(frozen=True)
class PayloadView:
    kind: str  # "json", "text" or "hex"
    body: str
    size: int
    cut: bool


def payload_view(payload: bytes, content_type: str) -> PayloadView:
    shown, cut = payload[:SHOWN_BYTES], len(payload) > SHOWN_BYTES
    if not cut and "json" in content_type:
        try:
            document = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass
        else:
            pretty = json.dumps(document, indent=2, ensure_ascii=False, sort_keys=True)
            return PayloadView("json", pretty, len(payload), cut)
    text = _utf8(shown, cut)
    if text is not None:
        return PayloadView("text", text, len(payload), cut)
    return PayloadView("hex", hex_dump(shown), len(payload), cut)


def _utf8(data: bytes, cut: bool) -> str | None:
    """The data as text, if it is UTF-8; when cut, a character split by the
    cut (up to 3 trailing bytes) is dropped."""
    for trim in range(4 if cut else 1):
        try:
            return data[: len(data) - trim].decode()
        except UnicodeDecodeError:
            continue
    return None


def hex_dump(data: bytes) -> str:
    """Offset, hex bytes and printable ASCII, 16 bytes a line."""
    lines = []
    for offset in range(0, len(data), HEX_WIDTH):
        chunk = data[offset : offset + HEX_WIDTH]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk).ljust(HEX_WIDTH * 3 - 1)
        text = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{offset:08x}  {hex_part}  {text}")
    return "\n".join(lines)
