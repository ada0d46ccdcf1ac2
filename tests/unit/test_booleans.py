"""One truthiness rule (deployer/booleans.py, Ansible's convert_bool sets) wherever a value is
read as a boolean: task arguments, the compatibility plan, the GPU roles' switches, the
templates' ``bool`` filter and the file_sd job switches."""

from __future__ import annotations

import pytest

from deployer import booleans
from deployer.errors import InputError
from deployer.gpu import gpu_plan, version_plan
from deployer.modules.accounts import Group
from deployer.modules.base import ArgError
from deployer.monitoring import file_sd
from deployer.templating import Renderer, make_environment

# ansible/ansible lib/ansible/module_utils/parsing/convert_bool.py, BOOLEANS_TRUE / _FALSE
ANSIBLE_TRUE = ["y", "yes", "on", "1", "true", "t", "Yes", " TRUE "]
ANSIBLE_FALSE = ["n", "no", "off", "0", "false", "f", "No", " False "]


def readers():
    """Every place that reads a variable or argument as a boolean, as value -> bool."""
    render = Renderer(make_environment())

    def module_arg(value):
        return Group().validate({"name": "g", "system": value})["system"]

    def plan(value):
        return version_plan.plan_from_vars("g1", {"gpu_model": "H100", "gpu_count": 8,
                                            "nvswitch": value}).nvswitch  # fmt: skip

    def bool_filter(value):
        return render.evaluate("v | bool", {"v": value}, "t.yml", 1, "when")

    return {
        "module argument": module_arg,
        "compat plan": plan,
        "bool filter": bool_filter,
        "file_sd switch": file_sd.truthy,
    }


@pytest.mark.parametrize("word", ANSIBLE_TRUE)
@pytest.mark.parametrize("reader", list(readers()))
def test_every_reader_takes_ansibles_true_words_as_true(reader, word):
    assert readers()[reader](word) is True


@pytest.mark.parametrize("word", ANSIBLE_FALSE)
@pytest.mark.parametrize("reader", list(readers()))
def test_every_reader_takes_ansibles_false_words_as_false(reader, word):
    assert readers()[reader](word) is False


def test_a_word_that_is_no_boolean_is_refused_where_a_boolean_is_required():
    with pytest.raises(ArgError):
        Group().validate({"name": "g", "system": "maybe"})
    with pytest.raises(InputError) as err:
        version_plan.plan_from_vars(
            "g1", {"gpu_model": "H100", "gpu_count": 8, "nvswitch": "maybe"}
        )
    assert err.value.key == "nvswitch"
    with pytest.raises(InputError) as err:
        gpu_plan.check_role_vars("g1", {"nvidia_driver_reboot_force": "maybe"})
    assert err.value.key == "nvidia_driver_reboot_force"


def test_the_gpu_roles_switches_take_every_ansible_word():
    for word in ANSIBLE_TRUE + ANSIBLE_FALSE:
        gpu_plan.check_role_vars("g1", {"nvidia_persistenced_persistence_mode": word})


def test_the_lenient_reading_makes_a_non_boolean_string_false():
    assert booleans.truthy("maybe") is False
    assert booleans.truthy(None) is False
    assert booleans.as_boolean("maybe") is None
