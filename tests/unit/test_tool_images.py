"""Image blocks of a tool result are checked before they join the history: one the
Messages API refuses would fail every later turn of the session."""

from __future__ import annotations

import base64

from actors.images import MAX_IMAGE_BYTES, MAX_IMAGES, accepted

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


def image(data: str = PNG, media_type: str = "image/png") -> dict[str, object]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": data}}


def test_a_good_image_is_kept_as_it_came() -> None:
    kept, notes = accepted([image()])
    assert kept == (image(),) and notes == []


def test_each_bad_block_is_dropped_and_said() -> None:
    too_big = base64.b64encode(b"\0" * (MAX_IMAGE_BYTES + 3)).decode()
    blocks = [image(media_type="image/tiff"), image(data="not base64!"), image(data=too_big),
              {"type": "text", "text": "x"}, "junk",
              {"type": "image", "source": {"type": "url", "url": "http://x"}},
              {"type": "image", "source": {**image()["source"], "extra": 1}}, image()]
    kept, notes = accepted(blocks)
    assert kept == (image(),)
    assert notes == [
        "[image 1 dropped: type 'image/tiff' is not one the API takes]",
        "[image 2 dropped: its data is not base64]",
        "[image 3 dropped: larger than 5 MB]",
        "[image 4 dropped: not an image block]",
        "[image 5 dropped: not an image block]",
        "[image 6 dropped: not a base64 image source]",
        "[image 7 dropped: not a base64 image source]",
    ]


def test_at_most_so_many_images_per_result() -> None:
    kept, notes = accepted([image()] * (MAX_IMAGES + 2))
    assert len(kept) == MAX_IMAGES
    assert notes == [f"[image {MAX_IMAGES + n} dropped: more than {MAX_IMAGES} images in one "
                     "result]" for n in (1, 2)]
