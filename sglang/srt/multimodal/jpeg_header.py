"""A JPEG header reader: size, EXIF orientation, colour layout and coding process, without decoding
a single pixel.

It walks the marker segments from SOI to the first SOS (the entropy-coded data is never touched) and
reads what the deferred-decode path needs to size an image exactly as the full decode would:

- the frame (SOFn): coding process (baseline / extended / progressive / lossless / arithmetic),
  sample precision, height, width, components and their sampling factors;
- the first APP1 ``Exif`` segment's IFD0 Orientation tag (0x0112), read the way PIL's ``getexif``
  reads it: the first Exif segment wins, a value that is not a single SHORT/LONG counts as 1;
- the APP14 ``Adobe`` colour transform (0: stored as RGB/CMYK, 1: YCbCr, 2: YCCK);
- whether an EOI marker follows the scan (a cheap truncation check).

Pure and thread-safe.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# SOFn marker -> (progressive, arithmetic, lossless, differential)
_SOF = {
    0xC0: (False, False, False, False),  # baseline
    0xC1: (False, False, False, False),  # extended sequential, Huffman
    0xC2: (True, False, False, False),
    0xC3: (False, False, True, False),
    0xC5: (False, False, False, True),
    0xC6: (True, False, False, True),
    0xC7: (False, False, True, True),
    0xC9: (False, True, False, False),
    0xCA: (True, True, False, False),
    0xCB: (False, True, True, False),
    0xCD: (False, True, False, True),
    0xCE: (True, True, False, True),
    0xCF: (False, True, True, True),
}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: no length field

# Luma sampling factors (h, v) of the common layouts, chroma 1x1: 4:4:4, 4:2:2, 4:4:0, 4:2:0, 4:1:1.
_COMMON_LUMA_SAMPLING = {(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)}


class JpegHeaderError(ValueError):
    """The data starts like a JPEG but its header is malformed or incomplete."""


@dataclass(frozen=True)
class JpegHeader:
    width: int  # as stored, before EXIF orientation
    height: int
    components: int
    precision: int
    sampling: tuple[tuple[int, int], ...]  # (h, v) per component
    progressive: bool
    arithmetic: bool
    lossless: bool
    differential: bool
    orientation: int = 1  # EXIF orientation 1-8 (1 when absent or unreadable)
    adobe_transform: int | None = None
    has_eoi: bool = True

    @property
    def oriented_size(self) -> tuple[int, int]:
        """(width, height) after the EXIF orientation is applied (5-8 swap the sides)."""
        if self.orientation in (5, 6, 7, 8):
            return self.height, self.width
        return self.width, self.height

    @property
    def is_cmyk(self) -> bool:
        return self.components == 4

    @property
    def subsampling(self) -> str:
        """'gray', '4:4:4', '4:2:2', '4:4:0', '4:2:0', '4:1:1' or 'other'."""
        if self.components == 1:
            return "gray"
        if self.components != 3 or any(s != (1, 1) for s in self.sampling[1:]):
            return "other"
        return {(1, 1): "4:4:4", (2, 1): "4:2:2", (1, 2): "4:4:0", (2, 2): "4:2:0", (4, 1): "4:1:1"}.get(
            self.sampling[0], "other")

    def simple_reason(self) -> str | None:
        """None when this is a plain 8-bit sequential Huffman gray/YCbCr JPEG with a common chroma
        layout (what every decoder, nvJPEG included, decodes the same way as libjpeg up to chroma
        upsampling); otherwise the reason it is not."""
        if self.progressive:
            return "progressive"
        if self.arithmetic or self.lossless or self.differential:
            return "unsupported coding process"
        if self.precision != 8:
            return f"{self.precision}-bit samples"
        if self.components == 4:
            return "CMYK/YCCK"
        if self.components not in (1, 3):
            return f"{self.components} components"
        if self.components == 3 and self.adobe_transform == 0:
            return "RGB-coded (Adobe transform 0)"
        if self.components == 3 and (self.sampling[0] not in _COMMON_LUMA_SAMPLING
                                     or any(s != (1, 1) for s in self.sampling[1:])):
            return "uncommon chroma sampling"
        if not self.has_eoi:
            return "truncated (no EOI marker)"
        return None


def is_jpeg(data: bytes) -> bool:
    return len(data) >= 3 and data[0] == 0xFF and data[1] == 0xD8 and data[2] == 0xFF


def parse_jpeg_header(data: bytes) -> JpegHeader:
    """Reads the header of a JPEG file (raises JpegHeaderError; check `is_jpeg` first)."""
    if not is_jpeg(data):
        raise JpegHeaderError("not a JPEG file (no SOI marker)")
    n = len(data)
    pos = 2
    frame = None
    orientation = 1
    exif_seen = False
    adobe = None
    while True:
        # a marker: one or more 0xFF fill bytes, then the code
        if pos >= n or data[pos] != 0xFF:
            raise JpegHeaderError(f"expected a marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise JpegHeaderError("truncated header")
        code = data[pos]
        pos += 1
        if code in _STANDALONE:
            continue
        if code == 0xD9:
            raise JpegHeaderError("EOI before the first scan")
        if pos + 2 > n:
            raise JpegHeaderError("truncated header")
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2 or pos + length > n:
            raise JpegHeaderError(f"bad segment length {length} at byte {pos}")
        seg = data[pos + 2 : pos + length]
        if code in _SOF:
            if frame is not None:
                raise JpegHeaderError("more than one frame header")
            if len(seg) < 6:
                raise JpegHeaderError("short frame header")
            precision, height, width, ncomp = seg[0], (seg[1] << 8) | seg[2], (seg[3] << 8) | seg[4], seg[5]
            if len(seg) < 6 + 3 * ncomp:
                raise JpegHeaderError("short frame header")
            sampling = tuple((seg[6 + 3 * i + 1] >> 4, seg[6 + 3 * i + 1] & 15) for i in range(ncomp))
            frame = (width, height, ncomp, precision, sampling, *_SOF[code])
        elif code == 0xE1 and not exif_seen and seg[:6] == b"Exif\x00\x00":
            exif_seen = True
            orientation = _exif_orientation(seg[6:])
        elif code == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe = seg[11]
        elif code == 0xDA:  # start of scan: the header is over
            if frame is None:
                raise JpegHeaderError("scan before the frame header")
            width, height, ncomp, precision, sampling, prog, arith, lossless, diff = frame
            if width < 1 or height < 1:
                raise JpegHeaderError(f"unsupported frame size {width}x{height} (height set by DNL?)")
            has_eoi = data.rfind(b"\xff\xd9", pos + length) >= 0
            return JpegHeader(width, height, ncomp, precision, sampling, prog, arith, lossless, diff,
                              orientation, adobe, has_eoi)
        pos += length


def _exif_orientation(tiff: bytes) -> int:
    """IFD0 Orientation of a TIFF-structured EXIF block; 1 when absent or not a single SHORT/LONG."""
    try:
        if tiff[:4] == b"II*\x00":
            end = "<"
        elif tiff[:4] == b"MM\x00*":
            end = ">"
        else:
            return 1
        (ifd,) = struct.unpack_from(end + "I", tiff, 4)
        (count,) = struct.unpack_from(end + "H", tiff, ifd)
        for i in range(count):
            tag, typ, cnt = struct.unpack_from(end + "HHI", tiff, ifd + 2 + 12 * i)
            if tag != 0x0112:
                continue
            if cnt != 1:
                return 1
            if typ == 3:
                return struct.unpack_from(end + "H", tiff, ifd + 2 + 12 * i + 8)[0]
            if typ == 4:
                return struct.unpack_from(end + "I", tiff, ifd + 2 + 12 * i + 8)[0]
            return 1
    except struct.error:
        return 1
    return 1
