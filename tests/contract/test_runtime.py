"""The runtime signature keys and how a reader turns their statistics into an estimate."""

from __future__ import annotations

import math

import pytest

from gpuaware.contract.runtime import (
    GLOBAL,
    PRIOR_MU,
    JobFeatures,
    KeyStats,
    level,
    owner_of,
    posterior,
    signature_keys,
)


def test_keys_go_from_the_owner_to_every_job():
    f = JobFeatures("team-a", 1, 500, 3000, 20_000, "BE", ("V100",), owner="resnet")
    keys = signature_keys(f)
    assert keys[0] == "owner:team-a/resnet" and keys[-1] == GLOBAL
    assert [level(k) for k in keys] == ["owner", "tenant", "shape", "shape", "global"]
    # Requests of the same order share the coarse shape key; the exact one tells them apart.
    g = JobFeatures("team-b", 1, 500, 4000, 17_000, "BE", ("V100",))
    assert signature_keys(g)[-2] == keys[-2] and signature_keys(g)[-3] != keys[-3]
    assert not signature_keys(g)[0].startswith("owner:")  # no owner: no owner key


def test_the_owner_is_the_annotation_else_the_name_label_else_the_controller_without_its_hash():
    pod = {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "serve-7d9f8b6c5d", "controller": True}]}}
    assert owner_of(pod) == "serve"
    pod["metadata"]["labels"] = {"job-name": "train-42"}
    assert owner_of(pod) == "train-42"
    pod["metadata"]["annotations"] = {"gpuaware.io/job": "bert-finetune"}
    assert owner_of(pod) == "bert-finetune"
    assert owner_of({"metadata": {}}) is None


def test_the_posterior_shrinks_a_key_with_few_completions_towards_the_one_above():
    stats = {GLOBAL: KeyStats(), "shape:x": KeyStats()}
    for s in (100.0, 200.0, 400.0, 800.0):
        stats[GLOBAL].update(math.log(s))
    stats["shape:x"].update(math.log(10.0))
    p = posterior(["shape:x", GLOBAL], stats)
    assert p.level == "shape" and p.n == 1
    assert math.log(10.0) < p.mu < stats[GLOBAL].mean  # one completion moves it part of the way
    assert posterior(["shape:y"], {}).mu == PRIOR_MU  # nothing learned: the prior
    # A key with many alike completions: about its own mean, and a narrow spread.
    stats["shape:z"] = KeyStats()
    for s in [100.0, 110.0, 90.0] * 30:
        stats["shape:z"].update(math.log(s))
    many = posterior(["shape:z", GLOBAL], stats)
    assert many.mu == pytest.approx(math.log(100.0), abs=0.05)  # 2 of 92 completions' weight on the global mean
    own = math.sqrt(stats["shape:z"].var)
    assert own < many.sigma < 3 * own and many.sigma < p.sigma  # shrunk towards the spread above, a little
