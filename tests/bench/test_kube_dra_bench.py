"""``gpuaware bench scheduler --dra``: the claims it writes, the apiserver's account it reads, and a run at a
tiny size on the real control plane (kube-apiserver, kube-scheduler v1.36.3, kwok): the JSON's shape, and
every bound pod's claim allocated with no device handed out twice. No speed is asserted here.

The real run is skipped when the binaries are not built (failed under ``CI=true``)."""

from __future__ import annotations

import json

import pytest

from gpuaware.bench.kube_dra_bench import (
    DRA_MODES,
    DRA_OPT_IN_MODES,
    allocation_account,
    dra_cluster,
    dra_pods,
    run_dra_bench,
)
from gpuaware.local.kube_control_plane import BinariesMissing, find_binaries
from tests.support import OPENB_NODES, OPENB_PODS, need


@pytest.fixture(scope="module")
def traces() -> None:
    if not OPENB_PODS.is_file():
        pytest.skip("the openb traces are not in ../shared/traces")


def _claims_by_pod(pods: list, claims: list) -> dict[str, dict]:
    by_name = {c["metadata"]["name"]: c for c in map(json.loads, claims)}
    return {name: by_name.get(name) for name, _, _ in pods}


def test_every_gpu_pod_names_a_claim_of_its_gpus_and_the_modes_get_the_same_claims(traces):
    _, slices = dra_cluster(OPENB_NODES, 40)
    models = sorted({d["attributes"]["productName"]["string"] for s in slices for d in s["spec"]["devices"]})
    by_mode = {m: dra_pods(OPENB_PODS, 300, 7, f"p{i}", m, models) for i, m in enumerate(DRA_MODES)}
    (k_pods, k_claims), (g_pods, g_claims) = by_mode.values()
    assert [milli for _, milli, _ in k_pods] == [milli for _, milli, _ in g_pods]
    for a, b in zip(k_claims, g_claims, strict=True):  # the same requests under each mode's names
        a_spec, b_spec = json.loads(a)["spec"], json.loads(b)["spec"]
        assert a_spec == b_spec
    claims = _claims_by_pod(k_pods, k_claims)
    fractional = 0
    for name, milli, body in k_pods:
        pod = json.loads(body)
        claim = claims[name]
        if milli == 0:
            assert claim is None and "resourceClaims" not in pod["spec"]
            continue
        assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
        assert "limits" not in pod["spec"]["containers"][0]["resources"]  # no nvidia.com/gpu beside the claim
        (req,) = claim["spec"]["devices"]["requests"]
        ex = req["exactly"]
        assert ex["deviceClassName"] == "gpu.nvidia.com" and ex["allocationMode"] == "ExactCount"
        assert ex["count"] == max(1, milli // 1000) and "capacity" not in ex  # --dra-fraction whole
        fractional += milli < 1000
    assert fractional, "the sample should hold fractional pods"
    assert {json.loads(b)["spec"]["schedulerName"] for _, _, b in g_pods} == {"gpuaware"}
    assert {json.loads(b)["spec"]["schedulerName"] for _, _, b in k_pods} == {"default-scheduler"}


def test_with_memory_fractions_a_fractional_claim_asks_for_its_share_of_a_shareable_gpu(traces):
    _, slices = dra_cluster(OPENB_NODES, 40, "memory")
    assert all(d["allowMultipleAllocations"] for s in slices for d in s["spec"]["devices"])
    models = sorted({d["attributes"]["productName"]["string"] for s in slices for d in s["spec"]["devices"]})
    pods, claims = dra_pods(OPENB_PODS, 300, 7, "p", "kube_scheduler_dra", models, "memory")
    by_pod = _claims_by_pod(pods, claims)
    asked = [by_pod[n]["spec"]["devices"]["requests"][0]["exactly"] for n, milli, _ in pods if 0 < milli < 1000]
    assert asked and all(ex["count"] == 1 and ex["capacity"]["requests"]["memory"].endswith("Mi") for ex in asked)
    with pytest.raises(ValueError, match="fraction: 'half' is not one of whole, memory"):
        run_dra_bench(str(OPENB_NODES), str(OPENB_PODS), fraction="half")


def _slice(pool: str, devices: dict[str, str]) -> dict:
    return {"spec": {"pool": {"name": pool}, "devices": [{"name": d, "capacity": {"memory": {"value": v}}}
                                                         for d, v in devices.items()]}}


def _claim(name: str, results: list[tuple[str, str, str | None]], reserved: bool = True) -> dict:
    out = [{"pool": p, "device": d, **({"consumedCapacity": {"memory": m}} if m else {})} for p, d, m in results]
    return {"metadata": {"name": name}, "status": {"allocation": {"devices": {"results": out}},
                                                   "reservedFor": [{"name": name}] if reserved else []}}


def test_the_account_counts_shares_and_finds_a_device_handed_out_twice():
    slices = [_slice("n1", {"gpu-0": "16Gi", "gpu-1": "16Gi"}), _slice("n2", {"gpu-0": "32Gi"})]
    ok = [_claim("a", [("n1", "gpu-0", None)]), _claim("b", [("n1", "gpu-1", "16Gi")]),
          _claim("c", [("n2", "gpu-0", "8Gi")]), _claim("d", [("n2", "gpu-0", "8Gi")])]
    account = allocation_account(ok, slices, {"a", "b", "c", "d"})
    assert account == {"allocated_gpus": 2.5, "stranded_gpus": 1, "devices_allocated_twice": 0,
                       "bound_pods_unallocated": []}  # n1/gpu-1 is shared full; n2/gpu-0 has 16Gi left
    assert allocation_account([*ok, _claim("e", [("n1", "gpu-0", None)])], slices, set())[
        "devices_allocated_twice"] == 1  # whole twice
    assert allocation_account([*ok, _claim("e", [("n1", "gpu-1", "1Gi")])], slices, set())[
        "devices_allocated_twice"] == 1  # whole (all its memory consumed) and shared
    assert allocation_account([*ok, _claim("e", [("n2", "gpu-0", "20Gi")])], slices, set())[
        "devices_allocated_twice"] == 1  # shared beyond its memory
    unreserved = [_claim("f", [("n1", "gpu-0", None)], reserved=False), {"metadata": {"name": "g"}}]
    assert allocation_account(unreserved, slices, {"f", "g"})["bound_pods_unallocated"] == ["f", "g"]


def test_a_tiny_run_on_the_real_control_plane_allocates_every_bound_pods_claim_once(traces):
    need(find_binaries, BinariesMissing)
    result = run_dra_bench(str(OPENB_NODES), str(OPENB_PODS), burst=8, rate=4.0, seconds=1.0, seed=4,
                           budgets=("raised",), node_count=6, modes=(*DRA_MODES, *DRA_OPT_IN_MODES))
    assert result["nodes"] == 6 and result["gpus"] > 0 and result["versions"]["kube-scheduler"].startswith("v1.")
    modes = result["runs"]["raised"]["modes"]
    assert set(modes) == {"kube_scheduler_dra", "gpuaware_dra", "ceiling_dra"}
    for mode, figures in modes.items():
        assert {"pods_per_s", "p99_create_to_bind_s", "unallocated_gpu_pct", "pending"} <= set(figures), mode
        assert figures["create_errors"] == [], (mode, figures)
        assert figures["claims"] > 0, mode
        # The apiserver's account: every bound pod's claim allocated and reserved for it, no device twice.
        assert figures["bound_pods_without_allocation"] == 0, (mode, figures)
        assert figures["devices_allocated_twice"] == 0, (mode, figures)
        assert figures["pending"] == 0, (mode, figures)  # seed 4: the 12 pods ask for <= 1 GPU each (12 GPUs)
        assert 0.0 <= figures["unallocated_gpu_pct"] < 100.0, (mode, figures)


def test_a_tiny_run_with_memory_fractions_shares_gpus_in_both_modes_without_over_committing_one(traces):
    need(find_binaries, BinariesMissing)
    result = run_dra_bench(str(OPENB_NODES), str(OPENB_PODS), burst=8, rate=4.0, seconds=1.0, seed=4,
                           budgets=("raised",), node_count=6, fraction="memory")
    modes = result["runs"]["raised"]["modes"]
    for mode, figures in modes.items():
        assert figures["create_errors"] == [] and figures["pending"] == 0, (mode, figures)
        # The apiserver's account: shares of one GPU never add up to more than its memory, every bound pod allocated.
        assert figures["devices_allocated_twice"] == 0, (mode, figures)
        assert figures["bound_pods_without_allocation"] == 0, (mode, figures)
        assert 0.0 <= figures["stranded_gpu_pct"] <= 100.0, (mode, figures)
    # Seed 4's shares: 160, 650 and 550 thousandths of a 16 GiB P100 in the backlog, then 320. Together they need
    # two GPUs and no set of them fills one exactly, so two of the 12 GPUs with memory left over is the fewest
    # possible; placing each share on the partly used GPU it fits most tightly reaches it in any order.
    fewest = round(100.0 * 2 / result["gpus"], 2)
    assert modes["gpuaware_dra"]["stranded_gpu_pct"] == fewest <= modes["kube_scheduler_dra"]["stranded_gpu_pct"], modes
