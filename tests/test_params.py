"""Parameter validation: clear messages naming the field and range; fuzzed parsing never crashes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoding.params import BeamParams, SampleParams, check_max_new_tokens, parse_params
from decoding.strategies import registry


@pytest.mark.parametrize("cls,values,message", [
    (SampleParams, {"temperature": -0.1}, "temperature must be in [0, 100]"),
    (SampleParams, {"temperature": float("nan")}, "temperature must be finite"),
    (SampleParams, {"top_p": 0}, "top_p must be in (0, 1]"),
    (SampleParams, {"top_p": 1.5}, "top_p must be in (0, 1]"),
    (SampleParams, {"top_k": -1}, "top_k must be in [0, inf]"),
    (SampleParams, {"top_k": 2.5}, "top_k must be an integer"),
    (SampleParams, {"temperature": "hot"}, "temperature must be a number"),
    (BeamParams, {"num_beams": 0}, "num_beams must be in [1, 16]"),
    (BeamParams, {"num_beams": 17}, "num_beams must be in [1, 16]"),
    (BeamParams, {"early_stopping": "maybe"}, "early_stopping must be true or false"),
    (BeamParams, {"beams": 3}, "unknown parameter(s) beams for BeamParams; allowed: num_beams"),
])
def test_bad_values_name_the_field(cls, values, message):
    with pytest.raises(ValueError) as err:
        parse_params(cls, values)
    assert message in str(err.value)


def test_strings_are_coerced():
    p = parse_params(SampleParams, {"temperature": "0.5", "top_k": "40", "top_p": "0.9"})
    assert p == SampleParams(0.5, 40, 0.9)
    assert parse_params(BeamParams, {"num_beams": "4.0", "early_stopping": "true"}) == BeamParams(4, 1.0, True)
    with pytest.raises(ValueError, match="max_new_tokens"):
        check_max_new_tokens(0)
    assert check_max_new_tokens(16.0) == 16


values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(registry())), data=st.dictionaries(
    st.sampled_from(["temperature", "top_k", "top_p", "num_beams", "length_penalty", "early_stopping",
                     "bogus"]), values, max_size=4))
def test_fuzzed_params_raise_value_error_or_parse(name, data):
    strategy = registry()[name]
    try:
        params = strategy.parse(data)
    except ValueError as exc:
        assert str(exc)
        return
    for value in vars(params).values():
        if isinstance(value, float):
            assert math.isfinite(value)
