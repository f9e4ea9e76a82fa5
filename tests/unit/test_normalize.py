"""Unit tests of ``ledger.translator.normalize`` on the real published objects in shared/fixtures/real."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ledger.errors import InvalidObject, UnsupportedObject
from ledger.translator.normalize import SUPPORTED, V1, normalize
from ledger.types import JSONObject, JSONValue

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "real"


def load(name: str) -> JSONObject:
    """Return the object in fixture ``name``, or the only item of a ``kind: List`` fixture."""
    loaded: JSONObject = yaml.safe_load((REAL / name).read_text())
    if loaded.get("kind") != "List":
        return loaded
    items = loaded["items"]
    assert isinstance(items, list) and len(items) == 1
    item = items[0]
    assert isinstance(item, dict)
    return item


def at(value: JSONValue, *path: str | int) -> JSONValue:
    """Walk ``path`` (keys and list indexes) into ``value``, failing the test on a wrong type."""
    for step in path:
        if isinstance(step, int):
            assert isinstance(value, list), f"{step}: not a list"
            value = value[step]
        else:
            assert isinstance(value, dict), f"{step}: not a mapping"
            value = value[step]
    return value


def all_fixture_objects() -> list[tuple[str, JSONObject]]:
    """Return ``(id, object)`` for every object of every fixture, List items included."""
    objects: list[tuple[str, JSONObject]] = []
    for path in sorted(REAL.glob("*.yaml")):
        loaded: JSONObject = yaml.safe_load(path.read_text())
        items = loaded["items"] if loaded.get("kind") == "List" else [loaded]
        assert isinstance(items, list)
        for index, item in enumerate(items):
            assert isinstance(item, dict)
            objects.append((f"{path.stem}[{index}]", item))
    return objects


ALL_OBJECTS = all_fixture_objects()


def test_the_v1beta1_slice_gives_the_same_devices_as_the_same_slice_published_in_v1() -> None:
    beta = normalize(
        load("example-driver_resourceslice-list_8gpus-basic-wrapper-same-uid-as-v1_v1beta1.yaml")
    )
    v1 = load("example-driver_resourceslice-list_8gpus_v1.yaml")

    assert beta["apiVersion"] == V1
    for field in ("devices", "driver", "pool"):
        assert at(beta, "spec", field) == at(v1, "spec", field)
    devices = at(beta, "spec", "devices")
    assert isinstance(devices, list) and len(devices) == 8


def test_a_v1beta1_allocation_mode_all_request_moves_into_exactly_and_keeps_its_results() -> None:
    original = load("dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml")
    claim = normalize(original)

    request = at(claim, "spec", "devices", "requests", 0)
    assert request == {
        "name": "rdma-net-interface",
        "exactly": {
            "deviceClassName": "dranet",
            "selectors": [{"cel": {"expression": 'device.attributes["dra.net"].rdma == true'}}],
            "allocationMode": "All",
        },
    }
    assert at(request, "exactly", "allocationMode") == "All"
    results = at(claim, "status", "allocation", "devices", "results")
    assert isinstance(results, list) and len(results) == 8
    assert claim["status"] == original["status"]


def test_a_v1beta1_template_count_8_request_keeps_count_and_selectors_under_exactly() -> None:
    template = normalize(load("dranet-gke_resourceclaimtemplate_count-8-rdma-nics_v1beta1.yaml"))

    exactly = at(template, "spec", "spec", "devices", "requests", 0, "exactly")
    assert at(exactly, "count") == 8
    assert at(exactly, "deviceClassName") == "dranet"
    assert at(exactly, "selectors") == [{"cel": {"expression": 'device.attributes["dra.net"].rdma == true'}}]
    request = at(template, "spec", "spec", "devices", "requests", 0)
    assert isinstance(request, dict) and set(request) == {"name", "exactly"}


def test_a_v1beta2_claim_is_only_relabelled_to_v1() -> None:
    original = load("k8s-website-tutorial_resourceclaim-list_some-gpu-allocated-reserved_v1beta2.yaml")
    claim = normalize(original)

    assert claim["apiVersion"] == "resource.k8s.io/v1"
    assert claim["spec"] == original["spec"]
    assert {k: v for k, v in claim.items() if k != "apiVersion"} == {
        k: v for k, v in original.items() if k != "apiVersion"
    }


def test_the_google_tpu_v1beta1_slice_has_both_devices_flattened_with_their_attributes() -> None:
    original = load("google-tpu_resourceslice-list_2-tpus-duplicate-uuid-no-owner_v1beta1.yaml")
    devices = at(normalize(original), "spec", "devices")

    assert devices == [
        {"name": "accel0", "attributes": at(original, "spec", "devices", 0, "basic", "attributes")},
        {"name": "accel1", "attributes": at(original, "spec", "devices", 1, "basic", "attributes")},
    ]
    assert at(devices, 1, "attributes", "uuid") == {"string": "tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9"}
    assert at(devices, 1, "attributes", "index") == {"int": 1}


def test_the_nvidia_v1beta1_template_gets_4_exactly_requests_and_keeps_its_constraint() -> None:
    template = normalize(
        load("nvidia-gpu_resourceclaimtemplate_4-mig-requests-matchattribute-parentuuid_v1beta1.yaml")
    )

    requests = at(template, "spec", "spec", "devices", "requests")
    assert isinstance(requests, list) and len(requests) == 4
    assert [at(r, "name") for r in requests] == ["mig-1g-5gb-0", "mig-1g-5gb-1", "mig-2g-10gb", "mig-3g-20gb"]
    for request in requests:
        assert isinstance(request, dict) and set(request) == {"name", "exactly"}
        assert at(request, "exactly", "deviceClassName") == "mig.nvidia.com"
    assert at(template, "spec", "spec", "devices", "constraints") == [
        {"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}
    ]


def test_a_v1beta1_first_available_request_keeps_its_sub_requests_as_they_are() -> None:
    sub_requests: list[JSONValue] = [
        {"name": "big", "deviceClassName": "gpu.example.com", "count": 1},
        {"name": "small", "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount", "count": 2},
    ]
    claim: JSONObject = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": sub_requests}]}},
    }

    assert at(normalize(claim), "spec", "devices", "requests") == [
        {"name": "gpu", "firstAvailable": sub_requests}
    ]


def test_a_v1beta1_request_with_both_shapes_keeps_both_so_that_the_translator_can_reject_it() -> None:
    claim: JSONObject = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "n"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "deviceClassName": "a",
                        "adminAccess": None,
                        "firstAvailable": [{"name": "x", "deviceClassName": "b"}],
                    }
                ]
            }
        },
    }

    assert at(normalize(claim), "spec", "devices", "requests", 0) == {
        "name": "gpu",
        "firstAvailable": [{"name": "x", "deviceClassName": "b"}],
        "exactly": {"deviceClassName": "a"},
    }


def test_a_v1beta1_device_without_basic_keeps_its_fields() -> None:
    device: JSONObject = {"name": "d0", "attributes": {"a": {"int": 1}}}
    slice_: JSONObject = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "x", "devices": [device, {"name": "d1", "basic": None}]},
    }

    assert at(normalize(slice_), "spec", "devices") == [device, {"name": "d1"}]


@pytest.mark.parametrize(("name", "obj"), ALL_OBJECTS, ids=[name for name, _ in ALL_OBJECTS])
def test_every_real_object_normalizes_without_touching_its_input(name: str, obj: JSONObject) -> None:
    before = copy.deepcopy(obj)

    result = normalize(obj)

    assert obj == before
    assert result["kind"] == obj["kind"]
    assert result["apiVersion"] == ("v1" if obj["kind"] in {"Pod", "Namespace"} else V1)
    if obj["apiVersion"] in {"v1", V1}:
        assert result is obj  # already v1: checked, not copied
    else:
        assert result is not obj
        result["metadata"] = None  # a converted result shares nothing mutable with the input
        assert obj == before


@pytest.mark.parametrize(
    ("name", "obj"),
    [(n, o) for n, o in ALL_OBJECTS if o["apiVersion"] in {"v1", V1}],
    ids=[n for n, o in ALL_OBJECTS if o["apiVersion"] in {"v1", V1}],
)
def test_a_v1_object_comes_back_equal(name: str, obj: JSONObject) -> None:
    assert normalize(obj) == obj


def test_a_v1alpha3_claim_is_unsupported_with_its_kind_and_version_named() -> None:
    claim = load("dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml")
    claim["apiVersion"] = "resource.k8s.io/v1alpha3"

    with pytest.raises(UnsupportedObject) as raised:
        normalize(claim)

    assert "ResourceClaim" in str(raised.value)
    assert "resource.k8s.io/v1alpha3" in str(raised.value)


def test_a_custom_resource_is_not_tracked() -> None:
    crd: JSONObject = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", "metadata": {}}

    with pytest.raises(
        UnsupportedObject, match=r"^kind ComputeDomain \(apiVersion resource\.nvidia\.com/v1beta1\)"
    ):
        normalize(crd)


def test_every_tracked_dra_kind_accepts_the_three_versions_and_only_device_taint_rule_v1alpha3() -> None:
    for kind in ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"):
        assert SUPPORTED[kind] == {V1, "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"}
    # Kubernetes 1.33 to 1.35 serve DeviceTaintRule only as v1alpha3.
    assert SUPPORTED["DeviceTaintRule"] == {V1, "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1",
                                            "resource.k8s.io/v1alpha3"}
    assert SUPPORTED["Pod"] == SUPPORTED["Namespace"] == {"v1"}


def test_a_slice_whose_devices_is_a_string_is_invalid_at_spec_devices() -> None:
    slice_ = load("example-driver_resourceslice-list_8gpus_v1.yaml")
    spec = slice_["spec"]
    assert isinstance(spec, dict)
    spec["devices"] = "gpu-0"

    with pytest.raises(InvalidObject) as raised:
        normalize(slice_)

    assert raised.value.path == "spec.devices"


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"apiVersion": V1, "kind": "DeviceClass", "metadata": "x"}, "metadata"),
        ({"apiVersion": V1, "kind": "DeviceClass", "metadata": {}, "spec": []}, "spec"),
        (
            {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {}, "spec": {"devices": [{"name": 3}]}},
            "spec.devices[0].name",
        ),
        (
            {
                "apiVersion": V1,
                "kind": "ResourceClaim",
                "metadata": {},
                "spec": {"devices": {"requests": {}}},
            },
            "spec.devices.requests",
        ),
        (
            {
                "apiVersion": "resource.k8s.io/v1beta1",
                "kind": "ResourceClaimTemplate",
                "metadata": {},
                "spec": {"spec": {"devices": {"requests": [{"count": 1}]}}},
            },
            "spec.spec.devices.requests[0].name",
        ),
    ],
    ids=["metadata", "spec", "device-name", "requests", "template-request-name"],
)
def test_a_wrong_type_is_reported_with_its_dotted_path(obj: JSONObject, path: str) -> None:
    with pytest.raises(InvalidObject) as raised:
        normalize(obj)

    assert raised.value.path == path
