import json

import pytest

from opbench.exceptions import ConfigError, SearchSpaceError, WorkloadError
from opbench.space import TEMPLATES, get_template, load_search_space, search_space_path
from opbench.workloads import PRESETS, parse_workload


@pytest.mark.parametrize("name", [n for n in TEMPLATES if n != "faulty"])
def test_search_space_file_agrees_with_template(name):
    template = TEMPLATES[name]
    assert load_search_space(search_space_path(template)) == template.search_space()


@pytest.mark.parametrize("preset", list(PRESETS))
def test_default_config_is_valid_for_every_preset(preset):
    w = parse_workload(preset)
    template = get_template(w)
    config = template.validate({}, w)
    assert set(config) == {k.name for k in template.knobs()}


def test_unknown_knob_is_named():
    w = parse_workload("matmul-512")
    with pytest.raises(ConfigError) as info:
        get_template(w).validate({"tile_z": 4}, w)
    assert info.value.knob == "tile_z" and "unknown knob" in str(info.value)


def test_value_outside_choices_is_named():
    w = parse_workload("matmul-512")
    with pytest.raises(ConfigError, match="knob 'order'"):
        get_template(w).validate({"order": "RRS"}, w)


def test_tile_larger_than_loop_is_named():
    w = parse_workload("resnet50-c5")  # 7x7 output
    with pytest.raises(ConfigError) as info:
        get_template(w).validate({"x_inner": 8}, w)
    assert info.value.knob == "x_inner" and "exceeds loop x of extent 7" in str(info.value)
    with pytest.raises(ConfigError) as info:
        get_template(w).validate({"y_inner": 4, "y_mid": 4}, w)
    assert info.value.knob == "y_mid"


def test_consumer_inside_reduction_is_rejected():
    w = parse_workload("bert-base-ffn1")
    with pytest.raises(ConfigError) as info:
        get_template(w).validate({"order": "SRSRS", "write_at": "inner"}, w)
    assert info.value.knob == "write_at"
    # the same order is fine when the consumer sits outside the reduction
    get_template(w).validate({"order": "SRSRS", "write_at": "outer"}, w)


def test_generic_and_foreign_templates():
    w = parse_workload("matmul-512")
    assert get_template(w, "te_default").validate({}, w) == {}
    with pytest.raises(WorkloadError, match="does not apply"):
        get_template(w, "conv2d")
    with pytest.raises(WorkloadError, match="unknown template"):
        get_template(w, "magic")


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "expected an object"),
     ('{"a": {"_type": "choice"}}', "needs '_type' and '_value'"),
     ('{"a": {"_type": "uniform", "_value": [0, 1]}}', "must be a choice")],
)
def test_malformed_search_space_files(tmp_path, content, message):
    path = tmp_path / "space.json"
    path.write_text(content)
    with pytest.raises(SearchSpaceError, match=message):
        load_search_space(path)
    with pytest.raises(SearchSpaceError, match="not found"):
        load_search_space(tmp_path / "missing.json")


def test_search_space_is_nni_format():
    space = json.loads(search_space_path(TEMPLATES["conv2d"]).read_text())
    assert space["pad_at"] == {"_type": "choice", "_value": ["inline", "root", "outer"]}
