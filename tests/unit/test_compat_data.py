"""Integrity of deployer/data/compat.yml: cited, internally consistent, unverified facts marked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from deployer.errors import InputError
from deployer.gpu import matrix as matrix_data
from deployer.gpu.matrix import load_matrix, matrix, model_from_gpu_name, version_key

RAW = yaml.safe_load(matrix_data.DATA_FILE.read_text(encoding="utf-8"))
M = matrix()
REFERENCE_FILES = ("nvidia-driver.md", "dcgm.md", "dcgm-exporter.md")


def cited_entries(node, path="compat.yml"):
    """Every mapping in the file that carries a tag, with its path."""
    if isinstance(node, dict):
        if "tag" in node:
            yield path, node
        for key, value in node.items():
            yield from cited_entries(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from cited_entries(value, f"{path}[{i}]")


ENTRIES = list(cited_entries(RAW))


def entry_ids(entries):
    return [path for path, _ in entries]


def test_the_file_has_cited_entries():
    assert len(ENTRIES) > 100


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=entry_ids(ENTRIES))
def test_every_entry_cites_a_reference_file(path, entry):
    assert any(name in entry["source"] for name in REFERENCE_FILES), path


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=entry_ids(ENTRIES))
def test_every_entry_has_a_known_tag(path, entry):
    assert entry["tag"] in ("V", "E", "D", "C", "U")


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=entry_ids(ENTRIES))
def test_unverified_fields_are_listed_exactly_for_community_and_unverified_entries(path, entry):
    listed = entry.get("unverified") or []
    assert bool(listed) == (entry["tag"] in ("C", "U"))
    for name in listed:
        field, _, key = name.partition("/")  # "names/Tesla V100-PCIE-16GB": one name of names
        assert name == "*" or (field in entry and (not key or key in entry[field])), (
            f"{path}: unverified names a missing field {name}"
        )


def test_every_section_the_rules_read_is_cited():
    for section in ("driver_branches", "architectures", "gpu_models"):
        for name, entry in RAW[section].items():
            assert "source" in entry and "tag" in entry, f"{section}.{name}"
    for section in ("module_flavours", "fabric_manager", "dcgm", "dcgm_exporter"):
        assert "source" in RAW[section] and "tag" in RAW[section], section


# --- branches ------------------------------------------------------------------------------


def test_every_branch_referenced_exists():
    referenced = {M.open_available_since, M.open_default_since}
    referenced |= {a.last_branch for a in M.architectures.values() if a.last_branch}
    for scheme in (*M.driver_packages, *M.fabric_manager):
        referenced |= {b for b in (scheme.min_branch, scheme.max_branch) if b}
    assert referenced <= set(M.branches)


def test_branch_types_are_the_three_designations_or_marked_unknown():
    for branch in M.branches.values():
        assert branch.type in ("LTSB", "PB", "NFB") or (
            branch.type is None and branch.cite.covers("type")
        ), branch.name


def test_end_of_life_is_a_year_and_month():
    for branch in M.branches.values():
        assert branch.eol is None or re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", branch.eol)


def test_cuda_major_never_decreases_with_the_branch():
    majors = [M.branches[b].cuda_major for b in sorted(M.branches, key=int)]
    assert majors == sorted(majors)


def test_cuda_majors_follow_the_reference_ranges():
    for branch in M.branches.values():
        b = int(branch.name)
        expected = 11 if b < 525 else 12 if b < 580 else 13
        assert branch.cuda_major == expected, branch.name


def test_every_branch_has_exactly_one_driver_and_one_fabric_manager_package_scheme():
    for name in M.branches:
        assert sum(s.applies(name) for s in M.driver_packages) == 1, name
        assert sum(s.applies(name) for s in M.fabric_manager) == 1, name


def test_fabric_manager_names_switch_at_r580():
    assert M.packages_for(M.fabric_manager, "580").names["fabricmanager"] == "nvidia-fabricmanager"
    assert M.packages_for(M.fabric_manager, "575").names["fabricmanager"] == (
        "nvidia-fabricmanager-{branch}"
    )


def test_the_ltsb_and_pb_branches_of_the_reference_table_are_present():
    table = {"535": "LTSB", "580": "LTSB", "595": "PB", "610": "NFB", "620": "LTSB"}
    assert {b: M.branches[b].type for b in table} == table


# --- architectures and models --------------------------------------------------------------


def test_the_contract_model_names_are_known():
    for name in ("H100", "H200", "A100", "V100", "B200", "GH200", "L40S", "T4"):
        assert name in M.models


def test_every_model_points_at_a_known_architecture_and_one_of_its_capabilities():
    for model in M.models.values():
        arch = M.architectures[model.architecture]
        assert model.compute_capability in arch.compute_capability, model.name


def test_a_model_minimum_is_never_below_its_architecture_floor():
    for model in M.models.values():
        floor = M.architectures[model.architecture].min_driver
        if model.min_driver and floor:
            assert version_key(model.min_driver) >= version_key(floor), model.name


def test_pre_turing_architectures_are_proprietary_only_and_end_at_a_branch():
    for name in ("kepler", "maxwell", "pascal", "volta"):
        arch = M.architectures[name]
        assert arch.module == "proprietary_only" and arch.last_branch, name
    assert M.architectures["volta"].last_branch == "580"


def test_every_listed_name_resolves_to_its_own_model():
    for model in M.models.values():
        for name in model.names:
            assert model_from_gpu_name(name) == model.name, name


def test_names_aliases_and_pci_ids_are_unique_across_models():
    for attr in ("names", "aliases", "pci_ids"):
        values = [v.casefold() for model in M.models.values() for v in getattr(model, attr)]
        assert len(values) == len(set(values)), attr
    aliases = {a.upper() for model in M.models.values() for a in model.aliases}
    assert not aliases & {name.upper() for name in M.models}


def test_pci_ids_are_four_hex_digits():
    for model in M.models.values():
        for pci_id in model.pci_ids:
            assert re.fullmatch(r"[0-9a-f]{4}", pci_id), (model.name, pci_id)


def test_variant_exceptions_name_known_architectures():
    for archs, _, _, _ in M.dcgm_variant_exceptions:
        assert archs <= set(M.architectures)


# --- DCGM and exporter ---------------------------------------------------------------------


def test_every_driver_cuda_major_has_a_dcgm_minimum():
    assert {b.cuda_major for b in M.branches.values()} <= set(M.dcgm_min_for_cuda)


def test_dcgm_minimums_are_of_a_supported_dcgm_major():
    for floor, _ in M.dcgm_min_for_cuda.values():
        assert version_key(floor)[0] in M.dcgm_majors


def test_every_exporter_tag_is_built_on_a_known_dcgm_release_of_its_major():
    for tag in M.exporter_tags:
        dcgm, exporter = tag.split("-")
        assert dcgm in M.dcgm_releases, tag
        assert M.exporter_dcgm_major[version_key(exporter)[0]][0] == version_key(dcgm)[0], tag


def test_every_dcgm_release_is_of_a_supported_major():
    assert {version_key(v)[0] for v in M.dcgm_releases} <= set(M.dcgm_majors)


def test_cuda_variant_packages_exist_only_for_dcgm4():
    assert M.dcgm_majors[3]["cuda_variant"] is None
    assert M.dcgm_majors[4]["cuda_variant"].format(cuda=13) == "datacenter-gpu-manager-4-cuda13"


# --- the loader refuses a malformed file ---------------------------------------------------

BROKEN = [
    (
        "a C entry without unverified fields",
        lambda d: d["driver_branches"]["450"].pop("unverified"),
        "must list its unverified",
    ),
    ("an entry without a source", lambda d: d["architectures"]["volta"].pop("source"), "missing"),
    ("an unknown tag", lambda d: d["architectures"]["volta"].update(tag="X"), "tag must be"),
    (
        "a version loaded as a float",
        lambda d: d["driver_branches"]["570"]["versions"].update(
            {570.3: {"source": "s", "tag": "V"}}
        ),
        "not a quoted",
    ),
    (
        "a version filed under another branch",
        lambda d: d["driver_branches"]["570"]["versions"].update(
            {"580.1.2": {"source": "s", "tag": "V"}}
        ),
        "another branch",
    ),
    (
        "an unknown module kind",
        lambda d: d["architectures"]["volta"].update(module="closed"),
        "module must be",
    ),
]


@pytest.mark.parametrize(("case", "edit", "says"), BROKEN, ids=[c for c, *_ in BROKEN])
def test_loader_refuses_a_malformed_file_naming_file_and_line(case, edit, says, tmp_path: Path):
    data = yaml.safe_load(matrix_data.DATA_FILE.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "compat.yml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(InputError) as err:
        load_matrix(path)
    assert says in err.value.message
    assert err.value.source == str(path) and err.value.line is not None


# --- GPU names as facts report them --------------------------------------------------------

GPU_NAMES = [
    ("NVIDIA A800-SXM4-80GB", "A800"),
    ("NVIDIA H800", "H800"),
    ("NVIDIA H800 PCIe", "H800"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA H20-3e", "H20"),
    ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA GH200 144G HBM3e", "GH200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA B300 SXM6 AC", "B300"),
    ("NVIDIA GB300", "GB300"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L20", "L20"),
    ("Tesla T4", "T4"),
    ("NVIDIA T400", None),
    ("A100-SXM4-40GB", "A100"),
    ("NVIDIA A10M", None),
    ("Tesla V100-SXM2-32GB", "V100"),
    ("Tesla V100S-PCIE-32GB", "V100"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("GH100 [H200 SXM 141GB]", "H200"),
    ("NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)", "H100"),
    ("3D controller [0302]: NVIDIA Corporation Device [10de:2335] (rev a1)", "H200"),
    ("10de:2901", "B200"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A10G", "A10"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
    ("nvidia h100 80gb hbm3", "H100"),
    ("NVIDIA Corporation GA100", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
]


@pytest.mark.parametrize(("name", "model"), GPU_NAMES, ids=[n or "empty" for n, _ in GPU_NAMES])
def test_gpu_name_maps_to_its_model(name, model):
    assert model_from_gpu_name(name) == model


# --- what each model says of itself ------------------------------------------------------------

SOURCE_KEYS = set(RAW["sources"])
CAPTURE_SOURCE = re.compile(r"capture ([^;]+)")


def test_every_bracketed_source_of_the_models_is_declared():
    for name, entry in RAW["gpu_models"].items():
        texts = [entry["source"], *entry.get("names", {}).values()]
        used = {k for t in texts for k in re.findall(r"\[([A-Z]+)\]", t) if not k.startswith("S")}
        assert used <= SOURCE_KEYS | {"D", "X", "V", "C", "U"}, (name, used - SOURCE_KEYS)


def test_every_name_says_where_it_is_seen_or_is_marked_unverified():
    for model in M.models.values():
        for shown in model.names:
            where = model.name_sources[shown]
            seen = "capture " in where or "[OGKM]" in where
            assert seen or model.cite.covers(f"names/{shown}"), (model.name, shown)


def test_a_name_said_to_be_in_a_capture_is_printed_there():
    reality = pytest.importorskip("tests.reality")
    for model in M.models.values():
        for shown, where in model.name_sources.items():
            for m in CAPTURE_SOURCE.finditer(re.sub(r"\s*\([^)]*\)", "", where)):
                first, *others = [p.strip() for p in m.group(1).split(",")]
                folder = first.rsplit("/", 1)[0]
                for rel in (first, *(o if "/" in o else f"{folder}/{o}" for o in others)):
                    assert shown in reality.capture_text(rel), (model.name, shown, rel)


def test_a_model_whose_sensor_is_not_known_is_marked_unverified():
    for model in M.models.values():
        if model.memory_temp_sensor is None:
            assert model.cite.covers("memory_temp_sensor"), model.name


def test_mig_is_only_on_ampere_and_later():
    for model in M.models.values():
        if model.architecture in ("kepler", "maxwell", "pascal", "volta", "turing"):
            assert not model.mig, model.name


def test_the_issue_11_models_are_known_with_their_sensor_and_mig():
    expect = {  # model: (memory_temp_sensor, mig)
        "L40S": (False, False), "T4": (False, False), "A10": (False, False),
        "H100": (True, True), "H200": (True, True), "A100": (True, True), "A800": (True, True),
    }  # fmt: skip
    assert {k: (M.models[k].memory_temp_sensor, M.models[k].mig) for k in expect} == expect
    for name in ("L40", "L4", "A30", "A40", "H800", "H20", "GH200", "B200", "GB200"):
        assert name in M.models


def test_every_simulated_lab_gpu_maps_to_its_own_model():
    gpusim = pytest.importorskip("deployer.lab.gpusim.models")
    for short, sim in gpusim.MODELS.items():
        assert model_from_gpu_name(sim.name) == short, sim.name
