"""Image blocks of a tool result are checked before they join the history: one the
Messages API refuses would fail every later turn of the session."""

from __future__ import annotations

import base64

from actors.images import MAX_IMAGE_BYTES, MAX_IMAGES, MAX_RESULT_BYTES, accepted

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


def test_bytes_of_another_type_than_said_are_dropped() -> None:
    gif = base64.b64encode(b"GIF89a" + b"\0" * 16).decode()
    riff = base64.b64encode(b"RIFF\0\0\0\0WAVE").decode()
    webp = base64.b64encode(b"RIFF\0\0\0\0WEBPVP8 ").decode()
    kept, notes = accepted([image(gif), image(gif, "image/gif"), image(riff, "image/webp"),
                            image(webp, "image/webp")])
    assert kept == (image(gif, "image/gif"), image(webp, "image/webp"))
    assert notes == ["[image 1 dropped: its bytes are not image/png]",
                     "[image 3 dropped: its bytes are not image/webp]"]


def test_a_results_images_stay_under_a_total() -> None:
    size = MAX_RESULT_BYTES // 2 - 1024
    big = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * size).decode()
    kept, notes = accepted([image(big), image(big), image(big), image()])
    assert kept == (image(big), image(big), image())
    assert notes == [f"[image 3 dropped: the result's images would pass "
                     f"{MAX_RESULT_BYTES >> 20} MB together]"]
