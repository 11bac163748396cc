"""Every image of a user's data checked before the first training step or query: the header (format, size against
PIL's decompression-bomb limit), ``Image.verify()`` and, when the headers add up to at most
:data:`FULL_DECODE_PIXELS` pixels, a full decode; one error lists the bad files.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FULL_DECODE_PIXELS",
    "MAX_LISTED",
    "bad_images_message",
    "check_dataset_images",
    "check_image_files",
]

#: every image is decoded fully when the headers add up to at most this many pixels (e.g. 4,000 images of 160 x 160)
FULL_DECODE_PIXELS = 100_000_000
#: the bad files named in the error (then a count of the others)
MAX_LISTED = 20

Source = tuple[str, Any]  # (name for the message, a path or the encoded bytes)


def _stream(data: Any) -> Any:
    return io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else os.fspath(data)


def _header(data: Any) -> tuple[int, str | None]:
    """``(pixels, problem or None)`` of one image from its header, size and ``verify()``."""
    from PIL import Image, UnidentifiedImageError

    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is judged below
            with Image.open(_stream(data)) as image:
                width, height = image.size
                if limit is not None and width * height > limit:
                    pixels = f"{width} x {height} = {width * height} pixels"
                    return 0, f"{pixels}, over the decompression-bomb limit of {limit} pixels"
                image.verify()
    except Image.DecompressionBombError as err:
        return 0, f"over the decompression-bomb limit of {limit} pixels (PIL: {err})"
    except UnidentifiedImageError:
        return 0, "not an image (PIL cannot identify its format)"
    except FileNotFoundError:
        return 0, "the file does not exist"
    except Exception as err:  # noqa: BLE001 - whatever PIL raises on a file, the file is the problem
        return 0, f"cannot be read ({type(err).__name__}: {err})"
    return width * height, None


def _decode(data: Any) -> str | None:
    """The problem of a full decode of one image, or ``None``."""
    from PIL import Image

    try:
        with Image.open(_stream(data)) as image:
            image.load()
    except Exception as err:  # noqa: BLE001 - as in _header
        return f"cannot be decoded ({type(err).__name__}: {err})"
    return None


def bad_images_message(
    sources: Iterable[Source] | Callable[[], Iterable[Source]], *, what: str, decode: bool | None = None
) -> str | None:
    """``"<what>: <n> of <total> images cannot be used ..."`` with a line per bad image (the first :data:`MAX_LISTED`)
    of ``sources`` (``(name, path or bytes)`` pairs, or a function returning them afresh), or ``None``. ``decode``:
    always (``True``), never (``False``) or below :data:`FULL_DECODE_PIXELS` (``None``)."""
    from PIL import Image

    pairs = sources if callable(sources) else (lambda items=list(sources): items)
    bad: list[tuple[str, str]] = []
    total_pixels = count = 0
    for name, data in pairs():
        pixels, problem = _header(data)
        total_pixels, count = total_pixels + pixels, count + 1
        if problem is not None:
            bad.append((name, problem))
    if decode or (decode is None and total_pixels <= FULL_DECODE_PIXELS):
        failed = {name for name, _ in bad}
        bad += [(name, p) for name, data in pairs() if name not in failed and (p := _decode(data)) is not None]
    if not bad:
        return None
    lines = [f"  {name}: {problem}" for name, problem in bad[:MAX_LISTED]]
    if len(bad) > MAX_LISTED:
        lines.append(f"  ... and {len(bad) - MAX_LISTED} more")
    return (
        f"{what}: {len(bad)} of {count} images cannot be used (checked before training or searching):\n"
        + "\n".join(lines)
        + "\nremove or replace these files (or convert them to PNG / JPEG); images over PIL's decompression-bomb "
        f"limit PIL.Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS} pixels must be shrunk (or that limit raised, "
        "if they are genuine)"
    )


def check_image_files(paths: Sequence[str | Path], *, what: str, decode: bool | None = None) -> None:
    """Raise ``ValueError`` (:func:`bad_images_message`) when an image file of ``paths`` cannot be used."""
    message = bad_images_message(((str(p), p) for p in paths), what=what, decode=decode)
    if message is not None:
        raise ValueError(message)


def check_dataset_images(ds: Any, image_column: str, *, what: str, decode: bool | None = None) -> None:
    """:func:`check_image_files` for the ``datasets.Image`` column ``image_column`` of ``ds`` (bad images named by
    path or ``row <i>``)."""
    import datasets

    if not isinstance(ds.features.get(image_column), datasets.Image):
        return
    column = ds.select_columns([image_column]).with_format("arrow")

    def cells() -> Iterable[Source]:
        for start in range(0, len(ds), 1024):
            chunk = column[start : start + 1024][image_column].to_pylist()
            for row, cell in enumerate(chunk, start=start):
                cell = cell or {}
                data = cell.get("bytes") or cell.get("path")
                name = cell.get("path") or f"row {row}"
                yield name, data if data is not None else b""

    message = bad_images_message(cells, what=what, decode=decode)
    if message is not None:
        raise ValueError(message)
