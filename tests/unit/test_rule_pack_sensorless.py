"""Which boards the rule pack treats as having no memory temperature sensor: exactly the models
the compatibility matrix (deployer/data/compat.yml, read here as plain YAML) marks
``memory_temp_sensor: false``, with every NVML name the matrix lists for them. The matrix is the
one place the fact lives; a model whose sensor is unknown (null) is held to the sensor rules."""

from __future__ import annotations

from pathlib import Path

import yaml

from deployer import rule_pack

DATA = Path(__file__).resolve().parents[2] / "deployer" / "data" / "compat.yml"


def matrix_models() -> dict:
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))["gpu_models"]


def test_the_sensorless_models_are_those_the_matrix_marks_without_a_memory_sensor():
    marked = {k for k, m in matrix_models().items() if m.get("memory_temp_sensor") is False}
    assert set(rule_pack.sensorless_models()) == marked


def test_every_nvml_name_of_a_sensorless_model_is_exempted():
    names = set(rule_pack.template_values()["sensorless_models"])
    for key, model in matrix_models().items():
        nvml = {n for n in model.get("names") or {} if "[" not in n}
        if model.get("memory_temp_sensor") is False:
            assert nvml <= names, key
        else:
            assert not nvml & names, key


def test_a_model_whose_sensor_is_not_known_is_not_exempted():
    unknown = [k for k, m in matrix_models().items() if m.get("memory_temp_sensor") is None]
    assert "V100" in unknown
    assert not set(unknown) & set(rule_pack.sensorless_models())


def test_an_unverified_sensorless_mark_of_the_matrix_is_exempted_too():
    # A40: no capture, "by analogy with the A10G capture" and marked unverified in the matrix
    a40 = matrix_models()["A40"]
    assert a40["memory_temp_sensor"] is False and "memory_temp_sensor" in a40["unverified"]
    assert "A40" in rule_pack.sensorless_models()
