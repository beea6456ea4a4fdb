"""An elicitation's answer checked against its form (`actors.mcp.forms`): typed from the
command line's strings, refused naming the field."""

from __future__ import annotations

import pytest

from actors.mcp.forms import FormError, checked

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "seats": {"type": "integer", "minimum": 1, "maximum": 9},
        "ratio": {"type": "number"},
        "window": {"type": "boolean"},
        "meal": {"type": "string", "enum": ["veg", "fish"]},
        "hero": {"type": "string", "oneOf": [{"const": "h1", "title": "One"}]},
        "extras": {"type": "array", "items": {"anyOf": [{"const": "bag"}, {"const": "pet"}]}},
    },
    "required": ["name", "seats"],
}


def test_strings_become_what_the_form_wants():
    assert checked(FORM, {"name": "Ada", "seats": "2", "ratio": "0.5", "window": "yes",
                          "meal": "veg", "hero": "h1", "extras": "bag, pet"}) == {
        "name": "Ada", "seats": 2, "ratio": 0.5, "window": True, "meal": "veg",
        "hero": "h1", "extras": ["bag", "pet"]}
    assert checked(FORM, {"name": "Bo", "seats": 3, "window": False}) == {
        "name": "Bo", "seats": 3, "window": False}


@pytest.mark.parametrize(("content", "said"), [
    ({"name": "Ada"}, "seats: required"),
    ({"name": "Ada", "seats": "two"}, "seats: expected a number"),
    ({"name": "Ada", "seats": "2.5"}, "seats: expected an integer"),
    ({"name": "Ada", "seats": "12"}, "seats: 12 is outside its maximum 9"),
    ({"name": "Ada", "seats": 1, "window": "perhaps"}, "window: expected true or false"),
    ({"name": "Ada", "seats": 1, "meal": "beef"}, "meal: 'beef' is not one of veg, fish"),
    ({"name": "Ada", "seats": 1, "hero": "h9"}, "hero: 'h9' is not one of h1"),
    ({"name": "Ada", "seats": 1, "extras": "car"}, "extras: 'car' is not one of bag, pet"),
    ({"name": "Ada", "seats": 1, "age": "3"}, "age: not a field of this form"),
    ({"name": 5, "seats": 1}, "name: expected a string"),
    ({"name": "Ada", "seats": "nan"}, "seats: expected a finite number"),
])
def test_a_bad_answer_is_refused_naming_the_field(content, said):
    with pytest.raises(FormError, match=said):
        checked(FORM, content)


def test_a_field_left_out_gets_its_default_and_a_bad_default_is_not_sent():
    """SEP-1034: a form is shown filled with its defaults; accepted as it is, they are
    what the server gets (the conformance suite's `elicitation-sep1034-client-defaults`)."""
    form = {"type": "object", "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
        "seats": {"type": "integer", "maximum": 9, "default": 12},  # its own field refuses it
        "note": {"type": "string"},
    }, "required": ["name", "age"]}
    assert checked(form, {}) == {"name": "John Doe", "age": 30, "score": 95.5,
                                 "status": "active", "verified": True}
    assert checked(form, {"age": "41", "verified": "no"})["age"] == 41
    assert checked(form, {"age": "41", "verified": "no"})["verified"] is False
    with pytest.raises(FormError, match="seats: required"):
        checked({**form, "required": ["seats"]}, {})
