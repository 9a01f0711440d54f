"""Feature spec strings and mappings."""

import pytest

from input_fns.specs import FeatureSpec, find_spec, format_specs, parse_specs


def test_parse_string_spec():
    specs = parse_specs(" image:uint8:28x28x1 ; label:int64;name:string;x:float32:3;", "features")
    assert specs == (
        FeatureSpec("image", "uint8", (28, 28, 1)),
        FeatureSpec("label", "int64"),
        FeatureSpec("name", "string"),
        FeatureSpec("x", "float32", (3,)),
    )
    assert specs[0].size == 784 and specs[1].size == 1


def test_parse_mapping_spec_from_a_params_file():
    specs = parse_specs({"image": "uint8:8x8x1", "label": "int64"}, "features")
    assert format_specs(specs) == "image:uint8:8x8x1;label:int64"


def test_format_round_trips():
    text = "image:uint8:32x32x3;label:int64;id:int64"
    assert format_specs(parse_specs(text, "features")) == text
    assert find_spec(parse_specs(text, "features"), "id") == FeatureSpec("id", "int64")
    assert find_spec(parse_specs(text, "features"), "nope") is None


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "features is empty"),
        ("label", "item 'label' of 'label' is not name:dtype[:shape]"),
        ("label:int32", "dtype 'int32'"),
        ("image:uint8:28,28", "shape '28,28'"),
        ("image:uint8:0x3", "shape '0x3'"),
        ("1abc:int64", "feature name '1abc'"),
        ("name:string:3", "string features are scalars"),
        ("a:int64;a:float32", "names a more than once"),
    ],
)
def test_fail_with_bad_spec(spec, fragment):
    with pytest.raises(ValueError) as raised:
        parse_specs(spec, "features")
    assert fragment in str(raised.value)
    assert "features" in str(raised.value)


def test_fail_with_wrong_types():
    with pytest.raises(TypeError, match="expected a string 'dtype"):
        parse_specs({"label": 3}, "features")
    with pytest.raises(TypeError, match="features is a list"):
        parse_specs(["label:int64"], "features")
