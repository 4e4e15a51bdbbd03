"""sglang.tuning.grid: spec parsing (property-based round trip), expansion, argv/env rendering, validation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.tuning import grid as g

flag_names = st.from_regex(r"[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,6}){0,3}", fullmatch=True)
env_names = st.from_regex(r"SGLANG_[A-Z0-9_]{1,10}", fullmatch=True)
# values: printable words without the separators; a value may hold commas only in '|' lists
words = st.from_regex(r"[A-Za-z0-9._:{}()-]{1,8}", fullmatch=True)
values = st.lists(st.lists(words, min_size=1, max_size=3).map(" ".join), min_size=1, max_size=5, unique=True)
comma_values = st.lists(st.lists(words, min_size=1, max_size=3).map(",".join), min_size=1, max_size=4, unique=True)


@settings(max_examples=200, deadline=None)
@given(name=st.one_of(flag_names, env_names), vals=st.one_of(values, comma_values))
def test_format_then_parse_is_identity(name, vals):
    axis = g.Axis(name, tuple(vals))
    assert g.parse_axis(g.format_axis(axis)) == axis


@settings(max_examples=100, deadline=None)
@given(name=flag_names, vals=values, dashes=st.sampled_from(["", "--"]))
def test_leading_dashes_and_underscores_are_the_same_flag(name, vals, dashes):
    spec = dashes + name.replace("-", "_") + "=" + ",".join(vals)
    assert g.parse_axis(spec) == g.Axis(name, tuple(vals))


@settings(max_examples=100, deadline=None)
@given(axes=st.lists(st.tuples(flag_names, values), min_size=0, max_size=3, unique_by=lambda t: t[0]))
def test_expand_is_the_cartesian_product_first_axis_slowest(axes):
    parsed = g.parse_grid(f"{n}={','.join(v)}" for n, v in axes)
    configs = g.expand(parsed)
    expected = list(itertools.product(*(v for _, v in axes)))
    assert [tuple(v for _, v in c.items) for c in configs] == expected
    assert len({c.key for c in configs}) == len(configs)  # keys identify configurations


@pytest.mark.parametrize("spec, message", [
    ("chunked-prefill-size", "expected NAME=V1,V2"),
    ("chunked-prefill-size=", "empty value"),
    ("chunked-prefill-size=1,,2", "empty value"),
    ("page-size=1,1", "repeated value"),
    ("Bad Name=1", "not a flag name"),
])
def test_malformed_specs_are_refused_with_the_spec(spec, message):
    with pytest.raises(g.GridError, match=message):
        g.parse_axis(spec)


def test_an_axis_given_twice_is_refused():
    with pytest.raises(g.GridError, match="given twice"):
        g.parse_grid(["page-size=1", "--page_size=16"])


def test_no_axes_is_one_configuration_of_server_defaults():
    (only,) = g.expand([])
    assert only.key == "(server defaults)" and only.items == ()


def test_argv_and_env_of_a_configuration():
    kinds = g.flag_kinds()
    assert kinds["disable-radix-cache"] == "bool" and kinds["cuda-graph-bs"] == "multi"
    assert kinds["chunked-prefill-size"] == "value"
    axes = g.parse_grid(["chunked-prefill-size=512,default", "disable-radix-cache=on,off",
                         "cuda-graph-bs=1,2,4|1 2 4 8", "SGLANG_MM_SHM_TRANSPORT=0,default"])
    by_key = {c.key: c for c in g.expand(axes)}
    c = by_key["chunked-prefill-size=512 disable-radix-cache=on cuda-graph-bs=1 2 4 8 SGLANG_MM_SHM_TRANSPORT=0"]
    assert g.config_argv(c, kinds) == ["--chunked-prefill-size", "512", "--disable-radix-cache",
                                       "--cuda-graph-bs", "1", "2", "4", "8"]
    assert g.config_env(c) == {"SGLANG_MM_SHM_TRANSPORT": "0"}
    d = by_key["chunked-prefill-size=default disable-radix-cache=off cuda-graph-bs=1,2,4 SGLANG_MM_SHM_TRANSPORT=default"]
    assert g.config_argv(d, kinds) == ["--cuda-graph-bs", "1,2,4"]
    assert g.config_env(d) == {}


def test_validation_names_the_problem():
    def check(specs, base=()):
        axes = g.parse_grid(specs)
        return g.validate(axes, g.expand(axes), list(base))

    check(["chunked-prefill-size=256,1024", "disable-radix-cache=on,off", "SGLANG_ANY=1"], ["--dtype", "float32"])
    with pytest.raises(g.GridError, match="did you mean chunked-prefill-size"):
        check(["chunk-prefill-size=256"])
    with pytest.raises(g.GridError, match="takes on/off"):
        check(["disable-radix-cache=sometimes"])
    with pytest.raises(g.GridError, match="also in --server-args"):
        check(["page-size=1,16"], ["--page-size", "4"])
    with pytest.raises(g.GridError, match="set by the tuner"):
        check(["port=1,2"])
    with pytest.raises(g.GridError, match=r"\[page-size=0\].*page-size must be >= 1"):
        check(["page-size=1,0"])
    with pytest.raises(g.GridError, match=r"\[chunked-prefill-size=x\].*'x': not a count"):
        check(["chunked-prefill-size=x"])
